// kvtier-bench tiers: the tiers' data paths against plain baselines measured in the same
// run on the same file system.
//
//   restore   NVMe -> host of many blocks (1.4 MiB by default): the NVMe store's io_uring
//             batch, and the whole TierManager path (Acquire of blocks that live only on
//             NVMe: mover batching, checksum verification, pins), vs a plain synchronous
//             O_DIRECT sequential read of the same number of bytes (dd-style; the faster
//             of block-size and 8 MiB requests). Target: >= 90%.
//   demotion  host -> NVMe: the store's WriteBatch and the TierManager's Flush (header +
//             payload + fdatasync + synced RocksDB index), vs plain O_DIRECT sequential
//             writes of the same bytes plus one fdatasync.
//   GPU       (only with a CUDA device) host -> HBM promotion of a batch vs one cudaMemcpy
//             of the same bytes from pinned memory (target >= 90%), and NVMe -> HBM
//             pipelined restore vs the slower of its two stages (target >= 85%).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "formats/contract.h"
#include "common/cuda_env.h"
#include "tiers/hbm/hbm_pool.h"
#include "tiers/host/host_pool.h"
#include "tiers/nvme/nvme_store.h"
#include "tiers/tier_manager.h"
#include "tools/bench/report.h"
#include "tools/cli.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
using namespace kvtier::tiers;

double Secs(Clock::time_point a) { return SecondsSince(a); }
Key128 BenchKey(uint64_t i) { return Key128{0xBE7C000000000000ull | i, i * 0x9E3779B97F4A7C15ull + 1}; }

// Plain O_DIRECT sequential I/O on one file: the baseline.
struct PlainFile {
  int fd = -1;
  uint8_t* buf = nullptr;
  uint64_t buf_bytes = 0;
  ~PlainFile() {
    if (fd >= 0) close(fd);
    std::free(buf);
  }
};

Status PlainWrite(const std::string& path, uint64_t total, uint64_t req, double* secs) {
  PlainFile f;
  f.fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0644);
  if (f.fd < 0) return Status::IoError("open " + path + ": " + std::strerror(errno));
  if (posix_fallocate(f.fd, 0, static_cast<off_t>(total)) != 0) return Status::IoError("fallocate " + path);
  f.buf = static_cast<uint8_t*>(std::aligned_alloc(4096, req));
  std::memset(f.buf, 0x5A, req);
  const auto t0 = Clock::now();
  for (uint64_t off = 0; off < total; off += req) {
    const uint64_t n = std::min(req, total - off);
    if (pwrite(f.fd, f.buf, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      return Status::IoError(std::string("pwrite: ") + std::strerror(errno));
    }
  }
  if (fdatasync(f.fd) != 0) return Status::IoError("fdatasync");
  *secs = Secs(t0);
  return Status::Ok();
}

Status PlainRead(const std::string& path, uint64_t total, uint64_t req, double* secs) {
  PlainFile f;
  f.fd = open(path.c_str(), O_RDONLY | O_DIRECT);
  if (f.fd < 0) return Status::IoError("open " + path + ": " + std::strerror(errno));
  f.buf = static_cast<uint8_t*>(std::aligned_alloc(4096, req));
  const auto t0 = Clock::now();
  for (uint64_t off = 0; off < total; off += req) {
    const uint64_t n = std::min(req, total - off);
    if (pread(f.fd, f.buf, n, static_cast<off_t>(off)) != static_cast<ssize_t>(n)) {
      return Status::IoError(std::string("pread: ") + std::strerror(errno));
    }
  }
  *secs = Secs(t0);
  return Status::Ok();
}

std::vector<SlotRef> AcquireSync(TierManager& tm, uint64_t cid, const std::vector<Key128>& keys, Tier t) {
  std::promise<std::vector<SlotRef>> p;
  tm.Acquire(cid, keys, t, [&](Status, std::vector<SlotRef> v) { p.set_value(std::move(v)); });
  return p.get_future().get();
}

int Run(const std::vector<std::string>& argv) {
  auto args = cli::Args::Parse(argv, {"no-append"});
  if (!args.ok()) return cli::Fail("tiers: " + args.status().message(), 2);
  if (Status s = args->CheckKnown({"dir", "blocks", "layers", "qd", "reps", "hbm-copy", "hbm-streams", "no-append",
                                   "results"});
      !s.ok()) {
    return cli::Fail("bench tiers: " + s.message(), 2);
  }
  auto blocks_a = args->GetInt("blocks", 192);
  auto layers_a = args->GetInt("layers", 80);
  auto qd_a = args->GetInt("qd", 64);
  auto reps_a = args->GetInt("reps", 3);
  if (!blocks_a.ok() || !layers_a.ok() || !qd_a.ok() || !reps_a.ok() || *blocks_a < 8 || *blocks_a > 100000 ||
      *layers_a < 1 || *layers_a > 1024 || *qd_a < 1 || *qd_a > 4096 || *reps_a < 1 || *reps_a > 100) {
    return cli::Fail("bench tiers: --blocks in [8, 100000], --layers in [1, 1024], --qd in [1, 4096], --reps in [1, 100]", 2);
  }
  // How the HBM pools copy (the daemon's tiers.hbm.copy and tiers.hbm.copy_streams).
  auto hbm_copy = ParseHbmCopy(args->Get("hbm-copy").value_or("auto"));
  if (!hbm_copy.ok()) return cli::Fail("bench tiers: --hbm-copy: " + hbm_copy.status().message(), 2);
  auto streams_a = args->GetInt("hbm-streams", 1);
  if (!streams_a.ok() || *streams_a < 1 || *streams_a > HbmPoolOptions::kMaxStreams) {
    return cli::Fail("bench tiers: --hbm-streams in [1, " + std::to_string(HbmPoolOptions::kMaxStreams) + "]", 2);
  }
  const int hbm_streams = static_cast<int>(*streams_a);
  const uint32_t nblocks = static_cast<uint32_t>(*blocks_a);
  const int reps = static_cast<int>(*reps_a);
  std::string base = args->Get("dir").value_or("/var/tmp");
  std::string dir = base + "/kvtier-bench-tiers-" + std::to_string(getpid());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return cli::Fail("bench tiers: cannot create " + dir + ": " + ec.message());
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      std::error_code e;
      std::filesystem::remove_all(d, e);
    }
  } cleanup{dir};

  ScaleContract c;
  c.model_id = "bench/tiers";
  c.geometry = Geometry{static_cast<uint32_t>(*layers_a), 8, 128, 16};
  c.SetUnitScales();
  if (Status s = c.Validate(); !s.ok()) return cli::Fail("bench tiers: " + s.ToString());
  const uint64_t block = c.block_bytes(), slot = c.slot_bytes();
  const uint64_t total = uint64_t{nblocks} * block;
  const double gb = static_cast<double>(total) / 1e9;
  std::printf("tiers bench: %u blocks of %llu bytes (%.2f GB) under %s, queue depth %lld\n", nblocks,
              static_cast<unsigned long long>(block), gb, dir.c_str(), static_cast<long long>(*qd_a));

  // Each repetition runs every path back to back (baselines first), and ratios are taken
  // per repetition: on a shared disk the absolute rate drifts between repetitions, the
  // ratio of neighbours much less.
  HostPoolOptions ho;
  ho.slot_bytes = slot;
  ho.slots = nblocks;
  auto host = HostPool::Create(ho);
  if (!host.ok()) return cli::Fail(host.status().ToString());
  for (uint32_t i = 0; i < nblocks; ++i) std::memset((*host)->slot_ptr(i), static_cast<int>(i), slot);

  std::string gpu_why;
  const bool gpu = cuda::DeviceCount(&gpu_why) > 0;
  TierManagerOptions to;
  to.slot_bytes = slot;
  to.host.capacity_bytes = uint64_t{nblocks + 8} * slot;
  to.host.high_watermark = 1.0;  // measure movement, not eviction
  to.host.low_watermark = 0.99;
  to.hbm.capacity_bytes = gpu ? uint64_t{nblocks + 8} * slot : 0;
  to.hbm.high_watermark = 1.0;
  to.hbm.low_watermark = 0.99;
  to.nvme.tier.capacity_bytes = uint64_t{nblocks + 8} * (slot + 4096);
  to.nvme.tier.high_watermark = 1.0;
  to.nvme.tier.low_watermark = 0.99;
  to.nvme.dir = dir + "/tm";
  to.nvme.queue_depth = static_cast<uint32_t>(*qd_a);
  to.hbm_copy = *hbm_copy;
  to.hbm_copy_streams = hbm_streams;
  auto tmo = TierManager::Open(to);
  if (!tmo.ok()) return cli::Fail(tmo.status().ToString());
  TierManager& tm = **tmo;
  if (Status st = tm.RegisterContract(c); !st.ok()) return cli::Fail(st.ToString());
  const uint64_t cid = c.Id();
  std::vector<Key128> keys;

  const std::string plain = dir + "/plain.dat";
  std::vector<double> base_w, base_r, store_w, store_r, tm_w, tm_r;  // GB/s per repetition
  std::vector<double> q_store_r, q_tm_r, q_store_w, q_tm_w;           // ratios per repetition
  for (int r = 0; r < reps; ++r) {
    double s, s2;
    if (Status st = PlainWrite(plain, RoundUp4K(total), 8 << 20, &s); !st.ok()) return cli::Fail(st.ToString());
    base_w.push_back(gb / s);
    if (Status st = PlainRead(plain, RoundUp4K(total), RoundUp4K(block), &s); !st.ok()) return cli::Fail(st.ToString());
    if (Status st = PlainRead(plain, RoundUp4K(total), 8 << 20, &s2); !st.ok()) return cli::Fail(st.ToString());
    base_r.push_back(gb / std::min(s, s2));
    std::filesystem::remove(plain, ec);

    // NVMe store alone.
    NvmeStoreOptions no;
    no.dir = dir + "/store" + std::to_string(r);
    no.slot_bytes = slot;
    no.capacity_bytes = uint64_t{nblocks} * (slot + 4096);
    no.queue_depth = static_cast<uint32_t>(*qd_a);
    no.fixed.push_back({(*host)->base(), (*host)->arena_bytes()});
    auto store = NvmeStore::Open(no);
    if (!store.ok()) return cli::Fail(store.status().ToString());
    std::vector<NvmeWrite> w(nblocks);
    for (uint32_t i = 0; i < nblocks; ++i) {
      w[i].id = BlockId{cid, BenchKey(i)};
      w[i].payload = (*host)->slot_ptr(i);
      w[i].len = block;
    }
    auto t0 = Clock::now();
    if (Status st = (*store)->WriteBatch(w); !st.ok()) return cli::Fail("store write: " + st.ToString());
    store_w.push_back(gb / Secs(t0));
    std::vector<NvmeRead> rd(nblocks);
    for (uint32_t i = 0; i < nblocks; ++i) {
      rd[i].id = w[i].id;
      rd[i].dst = (*host)->slot_ptr(i);
      rd[i].dst_capacity = slot;
    }
    // The first read after writing fresh (fallocated) files also waits for the file
    // system's unwritten-extent conversion; the second read is the steady state and the
    // one reported.
    if (Status st = (*store)->ReadBatch(rd); !st.ok()) return cli::Fail("store read: " + st.ToString());
    t0 = Clock::now();
    if (Status st = (*store)->ReadBatch(rd); !st.ok()) return cli::Fail("store read: " + st.ToString());
    store_r.push_back(gb / Secs(t0));
    store->reset();
    std::filesystem::remove_all(no.dir, ec);

    // TierManager: fresh blocks committed in host, Flush (demotion), Acquire (restore).
    keys.clear();
    for (uint32_t i = 0; i < nblocks; ++i) keys.push_back(BenchKey(static_cast<uint64_t>(r + 1) << 32 | i));
    std::vector<SlotRef> sl;
    if (Status st = tm.AllocSlots(cid, nblocks, Tier::kHost, &sl); !st.ok()) return cli::Fail(st.ToString());
    for (uint32_t i = 0; i < nblocks; ++i) {
      if (Status st = tm.Commit(cid, sl[i], keys[i], i ? keys[i - 1] : Key128{}); !st.ok()) return cli::Fail(st.ToString());
      if (Status st = tm.Unpin(sl[i]); !st.ok()) return cli::Fail(st.ToString());
    }
    t0 = Clock::now();
    if (Status st = tm.Flush(); !st.ok()) return cli::Fail("flush: " + st.ToString());
    tm_w.push_back(gb / Secs(t0));
    t0 = Clock::now();
    auto got = AcquireSync(tm, cid, keys, Tier::kHost);
    tm_r.push_back(gb / Secs(t0));
    if (got.size() != nblocks) {
      for (const TierStats& t : tm.Stats()) {
        std::fprintf(stderr, "%s: used %llu/%llu blocks %llu pinned %llu checksum_failures %llu\n", TierName(t.tier),
                     (unsigned long long)t.slots_used, (unsigned long long)t.slots_total,
                     (unsigned long long)t.blocks, (unsigned long long)t.pinned,
                     (unsigned long long)t.checksum_failures);
      }
      return cli::Fail("restore returned " + std::to_string(got.size()) + " blocks");
    }
    for (auto x : got) (void)tm.Unpin(x);
    if (r + 1 < reps) {
      tm.Drain();
      for (const Key128& k : keys) (void)tm.Evict(cid, k);  // room for the next repetition
    }
    q_store_r.push_back(store_r.back() / base_r.back());
    q_tm_r.push_back(tm_r.back() / base_r.back());
    q_store_w.push_back(store_w.back() / base_w.back());
    q_tm_w.push_back(tm_w.back() / base_w.back());
  }
  host->reset();

  Report rep("tiers: NVMe store and mover vs plain O_DIRECT",
             "build/bin/kvtier-bench tiers --blocks " + std::to_string(nblocks) + " --layers " +
                 std::to_string(*layers_a) + " --qd " + std::to_string(*qd_a) + " --reps " + std::to_string(reps));
  rep.SetColumns({"path", "GB/s (payload)", "ratio to baseline", "target"});
  auto row = [&](const std::string& name, double gbps, double ratio, const char* target) {
    rep.AddRow({name, Fmt("%.2f", gbps), Fmt("%.3f", ratio), target});
  };
  row("plain O_DIRECT sequential read (baseline)", Median(base_r), 1.0, "");
  row("NvmeStore::ReadBatch, io_uring, NVMe -> host", Median(store_r), Median(q_store_r), ">= 0.90");
  row("TierManager Acquire, NVMe -> host (restore)", Median(tm_r), Median(q_tm_r), ">= 0.90");
  row("plain O_DIRECT sequential write + fdatasync (baseline)", Median(base_w), 1.0, "");
  row("NvmeStore::WriteBatch (header+payload, fdatasync, index)", Median(store_w), Median(q_store_w), "");
  row("TierManager Flush, host -> NVMe (demotion)", Median(tm_w), Median(q_tm_w), "");

  // ---- GPU parts ----------------------------------------------------------------------
#if KVTIER_HAVE_CUDA
  if (gpu) {
    rep.SetDevice(cuda::DeviceName(0));
    // Baseline: one cudaMemcpy of the same bytes from pinned memory.
    void* pinned = nullptr;
    void* dev = nullptr;
    if (cudaMallocHost(&pinned, total) != cudaSuccess || cudaMalloc(&dev, total) != cudaSuccess) {
      return cli::Fail("bench tiers: cudaMallocHost/cudaMalloc failed");
    }
    std::vector<double> one, one_d2h;
    for (int r = 0; r < reps + 1; ++r) {
      auto a = Clock::now();
      cudaMemcpy(dev, pinned, total, cudaMemcpyHostToDevice);
      one.push_back(Secs(a));
      a = Clock::now();
      cudaMemcpy(pinned, dev, total, cudaMemcpyDeviceToHost);
      one_d2h.push_back(Secs(a));
    }
    const double base_d2h = gb / Median(one_d2h);
    cudaFree(dev);
    cudaFreeHost(pinned);
    const double base_h2d = gb / Median(one);
    // host -> HBM: the blocks in host (restored above), acquired into HBM.
    std::vector<double> h2d, n2d;
    for (int r = 0; r < reps; ++r) {
      auto in_host = AcquireSync(tm, cid, keys, Tier::kHost);  // NVMe -> host, untimed
      auto a = Clock::now();
      auto got = AcquireSync(tm, cid, keys, Tier::kHbm);
      h2d.push_back(Secs(a));
      if (got.size() != nblocks) return cli::Fail("host->HBM returned " + std::to_string(got.size()));
      for (auto s : got) (void)tm.Unpin(s);
      for (auto s : in_host) (void)tm.Unpin(s);
      if (Status st = tm.Flush(); !st.ok()) return cli::Fail("flush: " + st.ToString());  // all on NVMe only
      a = Clock::now();
      got = AcquireSync(tm, cid, keys, Tier::kHbm);  // NVMe -> host -> HBM, pipelined
      n2d.push_back(Secs(a));
      if (got.size() != nblocks) return cli::Fail("NVMe->HBM returned " + std::to_string(got.size()));
      for (auto s : got) (void)tm.Unpin(s);
      if (Status st = tm.Flush(); !st.ok()) return cli::Fail("flush: " + st.ToString());
    }
    // The copy-engine path alone (HbmCopy::kLoop for this pool: the default gather
    // kernel does not coalesce), HbmPool::CopyBatch of the same bytes from a registered host
    // arena: blocks in neighbouring slots (coalesced into one copy) and in every other
    // slot (nothing coalesces: one cudaMemcpyAsync per block).
    std::vector<double> cb_run, cb_apart, cb_conf, cb_d2h, lm_h2d, lm_d2h, lm_kernel;
    {
      HostPoolOptions hpo;
      hpo.slot_bytes = slot;
      hpo.slots = 2 * nblocks;
      HbmPoolOptions dpo;
      dpo.slot_bytes = slot;
      dpo.slots = 2 * nblocks;
      auto hp = HostPool::Create(hpo);
      dpo.copy = HbmCopy::kLoop;
      dpo.streams = hbm_streams;
      auto dp = HbmPool::Create(dpo);
      if (!hp.ok() || !dp.ok()) return cli::Fail("bench tiers: pools for the CopyBatch rows failed");
      // reps + 1 CopyBatch calls of the blocks in every `stride`-th slot; the first warms up.
      auto time_batches = [&](HbmPool& pool, uint32_t stride, std::vector<double>* out) -> Status {
        std::vector<HbmPool::CopyItem> items;
        for (uint32_t i = 0; i < nblocks; ++i) items.push_back({i * stride, (*hp)->slot_ptr(i * stride), block});
        for (int r = 0; r < reps + 1; ++r) {
          std::promise<Status> done;
          auto a = Clock::now();
          Status st = pool.CopyBatch(items, true, [&](Status x) { done.set_value(x); });
          if (st.ok()) st = done.get_future().get();
          if (!st.ok()) return st;
          if (r > 0) out->push_back(Secs(a));
        }
        return Status::Ok();
      };
      for (uint32_t stride : {1u, 2u}) {
        if (Status st = time_batches(**dp, stride, stride == 1 ? &cb_run : &cb_apart); !st.ok()) {
          return cli::Fail("bench tiers: CopyBatch: " + st.ToString());
        }
      }
      // Layer-major slots (the layout the decode reads dense, HbmPool::AddClass): 64 MiB
      // slabs of the block's slot, its pages of one layer side by side; every copy a
      // scatter (host -> HBM) or gather (HBM -> host) of the block's pages, in both
      // directions, by the copy engines (one cudaMemcpy2DAsync per block) and, host ->
      // HBM, by the gather kernel.
      (*dp).reset();
      const uint64_t lm_slab = uint64_t{64} << 20;
      const uint64_t page = PageBytes(c.format, c.geometry);
      if (slot <= lm_slab && page % 16 == 0) {
        const uint64_t per_slab = lm_slab / slot;
        for (HbmCopy m : {HbmCopy::kLoop, HbmCopy::kKernel}) {
          HbmPoolOptions lo;
          lo.classes = {slot};
          lo.slab_bytes = lm_slab;
          lo.arena_bytes = (nblocks + per_slab - 1) / per_slab * lm_slab;
          lo.copy = m;
          lo.streams = hbm_streams;
          auto lp = HbmPool::Create(lo);
          if (!lp.ok()) return cli::Fail("bench tiers: layer-major pool: " + lp.status().ToString());
          auto cls = (*lp)->AddClass(slot, page);
          if (!cls.ok()) return cli::Fail("bench tiers: layer-major class: " + cls.status().ToString());
          std::vector<HbmPool::CopyItem> items;
          for (uint32_t i = 0; i < nblocks; ++i) {
            auto sl = (*lp)->Alloc(*cls);
            if (!sl) return cli::Fail("bench tiers: layer-major pool full");
            items.push_back({*sl, (*hp)->slot_ptr(i), block});
          }
          for (bool to_device : {true, false}) {
            if (m == HbmCopy::kKernel && !to_device) continue;  // the kernel moves host -> HBM only
            std::vector<double>& out = m == HbmCopy::kKernel ? lm_kernel : (to_device ? lm_h2d : lm_d2h);
            for (int r = 0; r < reps + 1; ++r) {
              std::promise<Status> done;
              auto a = Clock::now();
              Status st = (*lp)->CopyBatch(items, to_device, [&](Status x) { done.set_value(x); });
              if (st.ok()) st = done.get_future().get();
              if (!st.ok()) return cli::Fail("bench tiers: layer-major CopyBatch: " + st.ToString());
              if (r > 0) out.push_back(Secs(a));
            }
          }
        }
      }
      // The contiguous D2H of the same blocks (neighbouring block-major slots, coalesced).
      {
        auto bp = HbmPool::Create(dpo);
        if (!bp.ok()) return cli::Fail("bench tiers: pool for the D2H row failed");
        std::vector<HbmPool::CopyItem> items;
        for (uint32_t i = 0; i < nblocks; ++i) items.push_back({i, (*hp)->slot_ptr(i), block});
        for (int r = 0; r < reps + 1; ++r) {
          std::promise<Status> done;
          auto a = Clock::now();
          Status st = (*bp)->CopyBatch(items, false, [&](Status x) { done.set_value(x); });
          if (st.ok()) st = done.get_future().get();
          if (!st.ok()) return cli::Fail("bench tiers: D2H CopyBatch: " + st.ToString());
          if (r > 0) cb_d2h.push_back(Secs(a));
        }
      }

      // The same scattered blocks through a pool made as the daemon makes it (--hbm-copy,
      // --hbm-streams): the copy method alone, without the TierManager around it.
      (*dp).reset();  // one arena at a time
      dpo.copy = *hbm_copy;
      dp = HbmPool::Create(dpo);
      if (!dp.ok()) return cli::Fail("bench tiers: pool for the configured CopyBatch row failed");
      if (Status st = time_batches(**dp, 2, &cb_conf); !st.ok()) {
        return cli::Fail("bench tiers: CopyBatch: " + st.ToString());
      }
    }
    const double h2d_gbps = gb / Median(h2d);
    const double slower = std::min(Median(tm_r), h2d_gbps);
    row("one cudaMemcpy from pinned memory (baseline)", base_h2d, 1.0, "");
    row("HbmPool::CopyBatch, copy engine, blocks in every other slot (one copy per block)", gb / Median(cb_apart),
        gb / Median(cb_apart) / base_h2d, "");
    row("HbmPool::CopyBatch, copy engine, blocks in neighbouring slots (coalesced)", gb / Median(cb_run),
        gb / Median(cb_run) / base_h2d, "");
    row(Fmt("HbmPool::CopyBatch as the daemon runs it (--hbm-copy %s --hbm-streams %d), every other slot",
            HbmCopyName(*hbm_copy), hbm_streams),
        gb / Median(cb_conf), gb / Median(cb_conf) / base_h2d, "");
    row("one cudaMemcpy to pinned memory (D2H baseline)", base_d2h, 1.0, "");
    row("HbmPool::CopyBatch HBM -> host, neighbouring block-major slots (coalesced: contiguous)", gb / Median(cb_d2h),
        gb / Median(cb_d2h) / base_d2h, "");
    if (!lm_h2d.empty()) {
      row("HbmPool::CopyBatch host -> HBM, layer-major slots (a cudaMemcpy2DAsync per block; ratio to coalesced)",
          gb / Median(lm_h2d), Median(cb_run) / Median(lm_h2d), ">= 0.90");
      row("HbmPool::CopyBatch HBM -> host, layer-major slots (a cudaMemcpy2DAsync per block; ratio to coalesced)",
          gb / Median(lm_d2h), Median(cb_d2h) / Median(lm_d2h), ">= 0.90");
    }
    if (!lm_kernel.empty()) {
      row("HbmPool::CopyBatch host -> HBM, layer-major slots, gather kernel (ratio to coalesced)", gb / Median(lm_kernel),
          Median(cb_run) / Median(lm_kernel), "");
    }
    row("TierManager Acquire, host -> HBM (batch)", h2d_gbps, h2d_gbps / base_h2d, ">= 0.90");
    row("TierManager Acquire, NVMe -> host -> HBM (pipelined; ratio to the slower stage)", gb / Median(n2d),
        gb / Median(n2d) / slower, ">= 0.85");
  } else {
    rep.AddNote("GPU parts skipped: " + gpu_why + ".");
    std::printf("GPU parts skipped: %s\n", gpu_why.c_str());
  }
#else
  rep.AddNote("GPU parts skipped: built without CUDA.");
  std::printf("GPU parts skipped: built without CUDA\n");
#endif
  rep.AddNote(Fmt("%u blocks of %llu bytes; median of %d repetitions (ratios per repetition, then the median); baseline read = faster of %llu-byte and 8 MiB "
                  "synchronous O_DIRECT preads; files under %s. TierManager restore includes mover batching, "
                  "XXH3 verification of every block and pinning.",
                  nblocks, static_cast<unsigned long long>(block), reps, static_cast<unsigned long long>(RoundUp4K(block)),
                  base.c_str()));
  const std::string results = args->Has("no-append") ? "" : args->Get("results").value_or(Report::DefaultResultsPath());
  if (Status s = rep.Emit(results); !s.ok()) return cli::Fail(s.message());
  return 0;
}

const cli::CommandRegistrar kReg(
    "tiers", "NVMe store / mover restore and demotion vs plain O_DIRECT (and host/NVMe -> HBM on a GPU)", Run,
    "[--dir DIR] [--blocks N] [--layers N] [--qd N] [--reps N] [--hbm-copy M] [--hbm-streams N]\n"
    "      [--results FILE | --no-append]\n"
    "  --dir DIR        where the NVMe files go (default /var/tmp)\n"
    "  --blocks N       blocks stored and restored, 8-100000 (default 192)\n"
    "  --layers N       layers per block, 1-1024 (default 80)\n"
    "  --qd N           io_uring queue depth, 1-4096 (default 64)\n"
    "  --reps N         repetitions; the median is reported, 1-100 (default 3)\n"
    "  --hbm-copy M     host -> HBM copy method of the pools: auto|kernel|batch|loop (default auto;\n"
    "                   the daemon's tiers.hbm.copy)\n"
    "  --hbm-streams N  copy-engine streams per direction, 1-8 (default 1; tiers.hbm.copy_streams)\n"
    + std::string(kvtier::bench::kResultsUsage));

}  // namespace
}  // namespace kvtier::bench
