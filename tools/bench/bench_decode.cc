// kvtier-bench decode: the GPU kernels' speed against the pure-read roofline, in one run.
//
// Measures, on the current GPU: a streaming-read kernel (the roofline), kvtier's paged
// decode over BF16, FP8 and NVFP4 pages at (batch, context) in {(1,32K), (1,128K),
// (16,64K), (64,8K)} with 32 query heads, 8 KV heads, D=128, T=16 and 64, and
// quantize_append (both scale rules). Bandwidths count the bytes a kernel must move (KV
// pages read; for quantize, activations read plus pages written). Each configuration
// rotates over enough distinct slots that its data is several times the L2, and block
// tables are random permutations (pages scattered as in a real pool). Each decode is also
// run on a daemon-shaped HBM arena (the block's L layers per slot, L up to 32, random slot
// ids over the arena, one layer decoded) in both layouts: block-major (one layer's pages a
// block apart) and layer-major (kvtierd's: 64 MiB slabs whose slots store layer after
// layer), with the time against the one-layer pool's, and block-major on kvtierd's own HBM
// arena: a tiers::HbmPool made by another process (this program, re-run with
// --export-hbm-arena) and imported over CUDA IPC, as an engine maps the daemon's arena.
// Median of --iters.
// torch SDPA's baseline is measured by tools/gpu/decode_baseline.py (needs torch).
// Each timing also reports the mean SM clock over its launches (NVML, when the driver has
// it) and how often the board's power cap throttled it; --sustain-ms N first runs each
// kernel back to back for N ms, so the time is the one a GPU held at that load reaches.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "formats/layout.h"
#include "formats/nvfp4.h"
#include "tools/bench/gpu_clock.h"
#include "tools/bench/report.h"
#include "tools/cli.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/include/kvtier/kernels.h"
#include "kernels/reference.h"
#include "tiers/hbm/hbm_pool.h"
#endif

extern char** environ;

namespace kvtier::bench {
namespace {

#if KVTIER_HAVE_CUDA

#define BENCH_CUDA(x)                                                                   \
  do {                                                                                  \
    const cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                            \
      return cli::Fail(std::string(#x) + ": " + cudaGetErrorString(e_));                \
    }                                                                                   \
  } while (0)

struct Timer {
  cudaEvent_t a, b;
  Timer() {
    cudaEventCreate(&a);
    cudaEventCreate(&b);
  }
  ~Timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

template <class T>
cudaError_t Alloc(T** p, size_t n) {
  return cudaMalloc(reinterpret_cast<void**>(p), n);
}

// Host pattern of `n` slots of valid random pages (no NaN scales / values).
std::vector<uint8_t> PatternSlots(KvFormat f, const Geometry& g, size_t slot_bytes, size_t n,
                                  std::mt19937_64& rng) {
  std::vector<uint8_t> p(slot_bytes * n);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  const PageLayout pl = MakePageLayout(f, g);
  for (size_t s = 0; s < n; ++s) {
    uint8_t* page = p.data() + s * slot_bytes;
    if (f == KvFormat::kNvfp4) {
      for (size_t r : {pl.k_scale, pl.v_scale}) {
        for (size_t i = 0; i < pl.v_data - pl.k_scale; ++i) page[r + i] = static_cast<uint8_t>(0x30 + rng() % 0x18);
      }
    } else if (f == KvFormat::kFp8) {
      for (size_t i = 0; i < pl.page_bytes; ++i) page[i] = static_cast<uint8_t>((rng() % 0x50) | (rng() & 0x80));
    } else {
      std::normal_distribution<float> nd(0.f, 1.f);
      for (size_t i = 0; i + 1 < pl.page_bytes; i += 2) {
        const uint16_t b = kernels::FloatToBf16(nd(rng));
        std::memcpy(page + i, &b, 2);
      }
    }
  }
  return p;
}

// ---- kvtierd's HBM arena, as an engine maps it -----------------------------------------
// The arena rows' third layout: the pages in a tiers::HbmPool (the daemon's own allocation
// code) made by a child process, which prints the arena's CUDA IPC handle and holds the
// arena until its stdin closes; this process imports it (cudaIpcOpenMemHandle, as
// libkvtier does) and decodes from it.

// The child: `kvtier-bench decode --export-hbm-arena SLOT_BYTES,SLOTS`.
int ExportHbmArena(const std::string& spec) {
  unsigned long long slot_bytes = 0, slots = 0;
  int used = 0;
  if (std::sscanf(spec.c_str(), "%llu,%llu%n", &slot_bytes, &slots, &used) != 2 ||
      used != static_cast<int>(spec.size()) || slots == 0 || slots > UINT32_MAX) {
    return cli::Fail("--export-hbm-arena wants SLOT_BYTES,SLOTS", 2);
  }
  tiers::HbmPoolOptions o;
  o.slot_bytes = slot_bytes;
  o.slots = static_cast<uint32_t>(slots);
  auto pool = tiers::HbmPool::Create(o);
  if (!pool.ok()) return cli::Fail("export hbm arena: " + pool.status().message());
  uint8_t h[64];
  if (Status st = (*pool)->IpcHandle(h); !st.ok()) return cli::Fail("export hbm arena: " + st.message());
  for (uint8_t b : h) std::printf("%02x", b);
  std::printf(" %llu\n", static_cast<unsigned long long>((*pool)->arena_bytes()));
  std::fflush(stdout);
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
  return 0;
}

// The parent's side: the child, its pipe, the imported mapping. Closing it unmaps, closes
// the child's stdin and reaps it.
struct ImportedArena {
  pid_t pid = -1;
  int to_child = -1;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  ImportedArena() = default;
  ImportedArena(const ImportedArena&) = delete;
  ImportedArena& operator=(const ImportedArena&) = delete;
  ~ImportedArena() {
    if (base != nullptr) cudaIpcCloseMemHandle(base);
    if (to_child >= 0) close(to_child);
    if (pid > 0) waitpid(pid, nullptr, 0);
  }
};

// Starts the child with an HbmPool of `slots` slots of `slot_bytes` and maps its arena.
Status ImportHbmArena(uint64_t slot_bytes, uint64_t slots, ImportedArena* a) {
  int in[2], out[2];
  if (pipe(in) != 0) return Status::IoError("pipe");
  if (pipe(out) != 0) {
    close(in[0]);
    close(in[1]);
    return Status::IoError("pipe");
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
  for (int fd : {in[0], in[1], out[0], out[1]}) posix_spawn_file_actions_addclose(&fa, fd);
  const std::string spec = std::to_string(slot_bytes) + "," + std::to_string(slots);
  std::string exe = "/proc/self/exe", cmd = "decode", flag = "--export-hbm-arena";
  char* argv[] = {exe.data(), cmd.data(), flag.data(), const_cast<char*>(spec.c_str()), nullptr};
  const int rc = posix_spawn(&a->pid, exe.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  a->to_child = in[1];
  if (rc != 0) {
    a->pid = -1;
    close(out[0]);
    return Status::IoError(std::string("posix_spawn: ") + std::strerror(rc));
  }
  std::string line;
  char c;
  while (read(out[0], &c, 1) == 1 && c != '\n') line.push_back(c);
  close(out[0]);
  cudaIpcMemHandle_t h;
  unsigned long long bytes = 0;
  if (line.size() < 130 || std::sscanf(line.c_str() + 129, "%llu", &bytes) != 1) {
    return Status::IoError("the arena's process gave no handle (it says why above)");
  }
  for (int i = 0; i < 64; ++i) {
    unsigned v = 0;
    std::sscanf(line.c_str() + 2 * i, "%2x", &v);
    reinterpret_cast<uint8_t*>(&h)[i] = static_cast<uint8_t>(v);
  }
  void* p = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) return Status::IoError(std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(e));
  a->base = static_cast<uint8_t*>(p);
  a->bytes = bytes;
  return Status::Ok();
}

struct Row {
  std::string what;
  int batch = 0, ctx = 0, T = 0;
  double us = 0, gbps = 0, frac = 0;
  ClockStats clock;  // SM clock and power cap during the timed launches
};

int RunDecodeBench(const std::vector<std::string>& argv) {
  auto args = cli::Args::Parse(argv, {"quick", "no-arena"});
  if (!args.ok()) return cli::Fail(args.status().message(), 2);
  if (auto spec = args->Get("export-hbm-arena")) return ExportHbmArena(*spec);
  if (Status s = args->CheckKnown({"quick", "no-arena", "iters", "json", "results", "formats", "shapes", "block-tokens", "splits", "sustain-ms", "kernels"});
      !s.ok()) {
    return cli::Fail(s.message(), 2);
  }
  // --formats bf16,fp8,nvfp4  --shapes 16x65536,1x131072  --block-tokens 16,64 (defaults: all)
  // --splits N (default 0: chosen by the library)
  const std::string formats = args->Get("formats").value_or("bf16,fp8,nvfp4");
  auto list_has = [](const std::string& list, const std::string& item) {
    return ("," + list + ",").find("," + item + ",") != std::string::npos;
  };
  // --kernels decode,quantize: which tables after the roofline (default both)
  const std::string kernel_list = args->Get("kernels").value_or("decode,quantize");
  const bool run_decode = list_has(kernel_list, "decode"), run_quantize = list_has(kernel_list, "quantize");
  if (!run_decode && !run_quantize) return cli::Fail("--kernels wants decode, quantize or both", 2);
  const bool quick = args->Has("quick");
  const bool arena = !args->Has("no-arena");
  constexpr size_t kArenaCap = size_t{64} << 30;       // bytes of a daemon-shaped arena at most
  constexpr size_t kDefaultSlab = size_t{64} << 20;    // kvtierd's default slab
  auto iters_or = args->GetInt("iters", quick ? 5 : 30);
  if (!iters_or.ok()) return cli::Fail(iters_or.status().message(), 2);
  const int iters = static_cast<int>(*iters_or);
  // --splits N: KV splits per sequence for every decode (default 0: the library's choice)
  auto splits_or = args->GetInt("splits", 0);
  if (!splits_or.ok()) return cli::Fail(splits_or.status().message(), 2);
  if (*splits_or < 0 || *splits_or > 65536) return cli::Fail("--splits must be in [0, 65536]", 2);
  const int splits = static_cast<int>(*splits_or);
  // --sustain-ms N: each kernel runs back to back for N ms before it is timed (default 0)
  auto sustain_or = args->GetInt("sustain-ms", 0);
  if (!sustain_or.ok()) return cli::Fail(sustain_or.status().message(), 2);
  if (*sustain_or < 0 || *sustain_or > 600000) return cli::Fail("--sustain-ms must be in [0, 600000]", 2);
  const int sustain_ms = static_cast<int>(*sustain_or);
  const std::string json_path = args->Get("json").value_or("");
  const std::string results = args->Get("results").value_or(Report::DefaultResultsPath());

  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return cli::Fail("no CUDA device");
  cudaDeviceProp prop{};
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  char bus_id[32] = {};
  BENCH_CUDA(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id, 0));
  GpuClockSampler clock(bus_id);
  ClockStats last_clock;  // of the latest time_it
  std::mt19937_64 rng(std::random_device{}());
  std::vector<Row> rows;
  Timer tm;
  // Median over 5 repetitions of the mean of `iters` back-to-back launches: the GPU never
  // waits for the host, so launch gaps stay out of the numbers.
  auto time_it = [&](auto&& fn) -> double {
    for (int i = 0; i < 3; ++i) fn(i);
    cudaDeviceSynchronize();
    if (sustain_ms > 0) {
      const auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(sustain_ms)) {
        for (int i = 0; i < iters; ++i) fn(i);
        cudaDeviceSynchronize();
      }
    }
    clock.Start();
    std::vector<double> ts;
    for (int r = 0; r < 5; ++r) {
      cudaEventRecord(tm.a);
      for (int i = 0; i < iters; ++i) fn(i);
      cudaEventRecord(tm.b);
      cudaEventSynchronize(tm.b);
      float ms = 0;
      cudaEventElapsedTime(&ms, tm.a, tm.b);
      ts.push_back(ms * 1e3 / iters);
    }
    last_clock = clock.Stop();
    return Median(ts);
  };

  // ---- roofline: streaming read of 2 GiB ------------------------------------------------
  const size_t probe_bytes = size_t{2} << 30;
  void* probe = nullptr;
  uint32_t* sink = nullptr;
  BENCH_CUDA(Alloc(&probe, probe_bytes));
  BENCH_CUDA(Alloc(&sink, 4));
  BENCH_CUDA(cudaMemset(probe, 0x5A, probe_bytes));
  int rc = 0;
  const double probe_us = time_it([&](int) { rc |= kvt_read_bandwidth_probe(probe, probe_bytes, sink, nullptr); });
  if (rc != KVT_OK) return cli::Fail(std::string("read probe: ") + kvt_last_error());
  cudaFree(probe);
  const double roof = probe_bytes / probe_us / 1e3;  // GB/s
  rows.push_back({"pure read (roofline)", 0, 0, 0, probe_us, roof, 1.0, last_clock});

  // ---- decode ---------------------------------------------------------------------------
  struct Shape {
    int B, L;
  };
  std::vector<Shape> shapes = {{1, 32768}, {1, 131072}, {16, 65536}, {64, 8192}};
  if (quick) shapes = {{1, 32768}, {16, 8192}};
  if (auto sl = args->Get("shapes")) {
    shapes.clear();
    size_t pos = 0;
    while (pos < sl->size()) {
      size_t end = sl->find(',', pos);
      if (end == std::string::npos) end = sl->size();
      const std::string item = sl->substr(pos, end - pos);
      int b = 0, l = 0;
      if (std::sscanf(item.c_str(), "%dx%d", &b, &l) != 2 || b < 1 || l < 64 || l % 64 != 0) {
        return cli::Fail("bad --shapes item '" + item + "' (want BxL, L a multiple of 64)", 2);
      }
      shapes.push_back({b, l});
      pos = end + 1;
    }
  }
  const std::string tlist = args->Get("block-tokens").value_or("16,64");
  const int Hq = 32, Hkv = 8, D = 128;
  const size_t l2 = static_cast<size_t>(prop.l2CacheSize);
  std::vector<double> nvfp4_vs_fp8;
  for (int T : {16, 64}) {
    if (!run_decode || !list_has(tlist, std::to_string(T))) continue;
    for (const Shape& sh : shapes) {
      double t_fmt[3] = {0, 0, 0};
      for (KvFormat f : {KvFormat::kBf16, KvFormat::kFp8, KvFormat::kNvfp4}) {
        if (!list_has(formats, KvFormatName(f))) continue;
        Geometry g;
        g.num_layers = 1;
        g.num_kv_heads = Hkv;
        g.head_dim = D;
        g.block_tokens = static_cast<uint32_t>(T);
        const size_t slot_bytes = SlotBytes(f, g);
        const size_t page = PageBytes(f, g);
        const size_t blocks = static_cast<size_t>(sh.B) * (sh.L / T);
        const size_t iter_bytes = blocks * page;
        const size_t nsets = std::max<size_t>(1, (4 * l2 + iter_bytes - 1) / iter_bytes);
        const size_t slots = blocks * nsets;
        uint8_t* pool = nullptr;
        BENCH_CUDA(Alloc(&pool, slots * slot_bytes));
        const size_t pat_n = std::min<size_t>(64, slots);
        const std::vector<uint8_t> pat = PatternSlots(f, g, slot_bytes, pat_n, rng);
        BENCH_CUDA(cudaMemcpy(pool, pat.data(), pat.size(), cudaMemcpyHostToDevice));
        for (size_t s = pat_n; s < slots; s += pat_n) {
          const size_t n = std::min(pat_n, slots - s);
          BENCH_CUDA(cudaMemcpy(pool + s * slot_bytes, pool, n * slot_bytes, cudaMemcpyDeviceToDevice));
        }
        // nsets block tables, each a random permutation of its own region of slots.
        std::vector<int32_t> bt(nsets * blocks);
        for (size_t k = 0; k < nsets; ++k) {
          std::iota(bt.begin() + k * blocks, bt.begin() + (k + 1) * blocks, static_cast<int32_t>(k * blocks));
          std::shuffle(bt.begin() + k * blocks, bt.begin() + (k + 1) * blocks, rng);
        }
        std::vector<int32_t> lens(sh.B, sh.L);
        std::vector<uint16_t> q(static_cast<size_t>(sh.B) * Hq * D);
        std::normal_distribution<float> nd(0.f, 1.f);
        for (auto& x : q) x = kernels::FloatToBf16(nd(rng));
        int32_t *dbt = nullptr, *dlen = nullptr;
        void *dq = nullptr, *dout = nullptr;
        BENCH_CUDA(Alloc(&dbt, bt.size() * 4));
        BENCH_CUDA(Alloc(&dlen, lens.size() * 4));
        BENCH_CUDA(Alloc(&dq, q.size() * 2));
        BENCH_CUDA(Alloc(&dout, q.size() * 2));
        BENCH_CUDA(cudaMemcpy(dbt, bt.data(), bt.size() * 4, cudaMemcpyHostToDevice));
        BENCH_CUDA(cudaMemcpy(dlen, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice));
        BENCH_CUDA(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
        kvt_pool pd{};
        pd.base = pool;
        pd.slot_bytes = slot_bytes;
        pd.num_slots = slots;
        pd.num_layers = 1;
        pd.num_kv_heads = Hkv;
        pd.head_dim = D;
        pd.block_tokens = static_cast<uint32_t>(T);
        pd.format = static_cast<uint32_t>(f);
        kvt_decode_params p{};
        p.q = dq;
        p.out = dout;
        p.seq_lens = dlen;
        p.batch = sh.B;
        p.num_q_heads = Hq;
        p.max_blocks = static_cast<int32_t>(sh.L / T);
        p.max_seq_len = sh.L;
        p.k_scale = p.v_scale = f == KvFormat::kBf16 ? 1.f : 0.02f;
        p.softmax_scale = 1.f / std::sqrt(static_cast<float>(D));
        p.block_table = dbt;
        p.num_splits = splits;
        const uint64_t ws = kvt_decode_workspace_bytes(&pd, &p);
        void* dws = nullptr;
        if (ws) BENCH_CUDA(Alloc(&dws, ws));
        p.workspace = dws;
        p.workspace_bytes = ws;
        int drc = 0;
        const double us = time_it([&](int i) {
          kvt_decode_params pi = p;
          pi.block_table = dbt + (i % nsets) * blocks;
          drc |= kvt_decode(&pd, &pi, nullptr);
        });
        if (drc != KVT_OK) return cli::Fail(std::string("decode: ") + kvt_last_error());
        BENCH_CUDA(cudaDeviceSynchronize());
        const double gbps = static_cast<double>(iter_bytes) / us / 1e3;
        const int fi = static_cast<int>(f);
        t_fmt[fi] = us;
        rows.push_back({std::string("decode ") + KvFormatName(f) + " (splits " +
                            std::to_string(kvt_decode_num_splits(&pd, &p)) + ")",
                        sh.B, sh.L, T, us, gbps, gbps / roof, last_clock});
        if (f == KvFormat::kNvfp4) {
          // The memory side alone: the decode's copy pipeline over the same pages, no math.
          const double rus = time_it([&](int i) {
            kvt_decode_params pi = p;
            pi.block_table = dbt + (i % nsets) * blocks;
            drc |= kvt_decode_read_probe(&pd, &pi, nullptr);
          });
          if (drc != KVT_OK) return cli::Fail(std::string("decode read probe: ") + kvt_last_error());
          const double rgbps = static_cast<double>(iter_bytes) / rus / 1e3;
          rows.push_back({"  nvfp4 page read (the decode's copies, no math)", sh.B, sh.L, T, rus, rgbps,
                          rgbps / roof, last_clock});
          // The same number of bytes read by the roofline's kernel in one contiguous run
          // (set k's slots, rotating like the decode): what one kernel of this size gets
          // at best, its launch, first bytes and tail included.
          int prc = 0;
          const double pus = time_it([&](int i) {
            prc |= kvt_read_bandwidth_probe(pool + (i % nsets) * blocks * slot_bytes, iter_bytes, sink, nullptr);
          });
          if (prc != KVT_OK) return cli::Fail(std::string("read probe: ") + kvt_last_error());
          const double pgbps = static_cast<double>(iter_bytes) / pus / 1e3;
          rows.push_back({"  pure read of the same bytes (one contiguous run)", sh.B, sh.L, T, pus, pgbps,
                          pgbps / roof, last_clock});
        }
        cudaFree(pool);
        pool = nullptr;
        // The same decode on a daemon-shaped HBM arena: the model's L layers per block, the
        // blocks at random slot ids over the whole arena, decoding one layer (the middle
        // one), block-major (a slot's L pages side by side, one layer's pages a block apart)
        // and layer-major (64 MiB slabs of N slots, one layer's pages of a slab dense;
        // kvt_pool.slab_bytes). Up to 32 layers, as many as fit kArenaCap. Then block-major
        // again on kvtierd's own arena (an HbmPool of one slot more than the blocks, in another
        // process, imported over CUDA IPC): the pages as an engine reads them.
        if (arena) {
          const size_t layer_bytes = blocks * page;
          const uint32_t L = static_cast<uint32_t>(std::min<size_t>(32, kArenaCap / layer_bytes));
          if (L >= 2) {
            const size_t cls = (L * page + 4095) / 4096 * 4096;  // a slot of the block, 4 KiB multiple
            const size_t slab = kDefaultSlab;
            const size_t per_slab = slab / cls;
            for (int major = 0; major < 3 && per_slab > 0; ++major) {
              const bool daemon = major == 2;  // block-major, kvtierd's arena
              // Block-major: one slot per block; layer-major: whole slabs, the slot-id
              // stride the daemon's granule (gcd of the slab and the class).
              const size_t nslabs = (blocks + per_slab - 1) / per_slab;
              const size_t arena_bytes = major == 0 ? blocks * cls : daemon ? (blocks + 1) * cls : nslabs * slab;
              const size_t stride = major == 1 ? std::gcd(slab, cls) : cls;
              kvt_pool pa = pd;
              pa.num_layers = L;
              pa.slot_bytes = stride;
              pa.num_slots = arena_bytes / stride;
              if (major == 1) {
                pa.slab_bytes = slab;
                pa.class_bytes = cls;
              }
              pa.base = reinterpret_cast<void*>(uintptr_t{256});  // checked before the arena is taken
              if (kvt_check_pool(&pa) != KVT_OK) return cli::Fail(std::string("decode (arena): ") + kvt_last_error());
              uint8_t* ar = nullptr;
              ImportedArena imported;
              if (daemon) {
                if (Status st = ImportHbmArena(cls, blocks + 1, &imported); !st.ok()) {
                  std::fprintf(stderr, "decode: kvtierd's arena of %zu MiB: %s: not measured\n", arena_bytes >> 20,
                               st.message().c_str());
                  continue;
                }
                ar = imported.base;
              } else if (cudaMalloc(reinterpret_cast<void**>(&ar), arena_bytes) != cudaSuccess) {
                cudaGetLastError();
                std::fprintf(stderr, "decode: an arena of %zu MiB does not fit the GPU: not measured\n",
                             arena_bytes >> 20);
                continue;
              }
              // Every page-sized piece of the arena holds a valid page: a pattern of 64 pages,
              // then doubling device copies.
              const std::vector<uint8_t> pp = PatternSlots(f, g, page, 64, rng);
              const size_t pbytes = std::min(pp.size(), arena_bytes / page * page);
              BENCH_CUDA(cudaMemcpy(ar, pp.data(), pbytes, cudaMemcpyHostToDevice));
              for (size_t done = pbytes; done < arena_bytes;) {
                const size_t n = std::min(done, arena_bytes - done) / page * page;
                if (n == 0) break;
                BENCH_CUDA(cudaMemcpy(ar + done, ar, n, cudaMemcpyDeviceToDevice));
                done += n;
              }
              // Slot ids: the arena's slots in random order.
              std::vector<int32_t> ids;
              if (major != 1) {
                for (size_t k = 0; k < blocks; ++k) ids.push_back(static_cast<int32_t>(k));
              } else {
                for (size_t k = 0; k < nslabs * per_slab; ++k) {
                  ids.push_back(static_cast<int32_t>((k / per_slab * slab + k % per_slab * cls) / stride));
                }
              }
              std::shuffle(ids.begin(), ids.end(), rng);
              ids.resize(blocks);
              BENCH_CUDA(cudaMemcpy(dbt, ids.data(), blocks * 4, cudaMemcpyHostToDevice));
              pa.base = ar;
              kvt_decode_params pl = p;
              pl.layer = L / 2;
              pl.block_table = dbt;
              const double aus = time_it([&](int) { drc |= kvt_decode(&pa, &pl, nullptr); });
              if (drc != KVT_OK) return cli::Fail(std::string("decode (arena): ") + kvt_last_error());
              const double agbps = static_cast<double>(iter_bytes) / aus / 1e3;
              rows.push_back({Fmt("  on a %u-layer arena of %zu MiB, %s: %.2fx the one-layer pool's time", L,
                                  arena_bytes >> 20,
                                  major == 0 ? "block-major"
                                  : daemon   ? "block-major, kvtierd's (HbmPool in another process, CUDA IPC)"
                                             : "layer-major 64 MiB slabs",
                                  aus / us),
                              sh.B, sh.L, T, aus, agbps, agbps / roof, last_clock});
              if (!daemon) cudaFree(ar);
            }
          }
        }
        cudaFree(dws);
        cudaFree(dbt);
        cudaFree(dlen);
        cudaFree(dq);
        cudaFree(dout);
      }
      if (t_fmt[0] > 0 && t_fmt[1] > 0 && t_fmt[2] > 0) {
        rows.push_back({"  nvfp4/fp8 time, nvfp4/bf16 time", sh.B, sh.L, T, 0, t_fmt[0] / t_fmt[1],
                        t_fmt[0] / t_fmt[2], ClockStats{}});
      }
    }
  }

  // ---- quantize_append ----------------------------------------------------------------
  if (run_quantize && list_has(formats, "nvfp4")) {
    const int N = quick ? 8192 : 65536, H = 8, T = 16;
    Geometry g;
    g.num_layers = 1;
    g.num_kv_heads = H;
    g.head_dim = D;
    g.block_tokens = T;
    const size_t slot_bytes = SlotBytes(KvFormat::kNvfp4, g);
    const size_t slots = N / T;
    uint8_t* pool = nullptr;
    void *dk = nullptr, *dv = nullptr;
    int32_t *ds = nullptr, *dp = nullptr;
    const size_t n_el = static_cast<size_t>(N) * H * D;
    BENCH_CUDA(Alloc(&pool, slots * slot_bytes));
    BENCH_CUDA(Alloc(&dk, n_el * 2));
    BENCH_CUDA(Alloc(&dv, n_el * 2));
    BENCH_CUDA(Alloc(&ds, N * 4));
    BENCH_CUDA(Alloc(&dp, N * 4));
    std::vector<uint16_t> x(n_el);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : x) v = kernels::FloatToBf16(nd(rng));
    BENCH_CUDA(cudaMemcpy(dk, x.data(), n_el * 2, cudaMemcpyHostToDevice));
    std::reverse(x.begin(), x.end());
    BENCH_CUDA(cudaMemcpy(dv, x.data(), n_el * 2, cudaMemcpyHostToDevice));
    std::vector<int32_t> sl(N), ps(N);
    std::vector<int32_t> perm(slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int i = 0; i < N; ++i) {
      sl[i] = perm[i / T];
      ps[i] = i % T;
    }
    BENCH_CUDA(cudaMemcpy(ds, sl.data(), N * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA(cudaMemcpy(dp, ps.data(), N * 4, cudaMemcpyHostToDevice));
    kvt_pool pd{};
    pd.base = pool;
    pd.slot_bytes = slot_bytes;
    pd.num_slots = slots;
    pd.num_layers = 1;
    pd.num_kv_heads = H;
    pd.head_dim = D;
    pd.block_tokens = T;
    pd.format = KVT_FORMAT_NVFP4;
    const double bytes = static_cast<double>(n_el) * 2 * 2 + static_cast<double>(N) * PageBytes(KvFormat::kNvfp4, g) / T;
    for (uint32_t rule : {0u, 1u}) {
      kvt_quantize_params q{};
      q.k = dk;
      q.v = dv;
      q.num_tokens = N;
      q.slot_ids = ds;
      q.positions = dp;
      q.k_scale = q.v_scale = 0.002f;
      q.scale_rule = rule;
      int qrc = 0;
      const double us = time_it([&](int) { qrc |= kvt_quantize_append(&pd, &q, nullptr); });
      if (qrc != KVT_OK) return cli::Fail(std::string("quantize_append: ") + kvt_last_error());
      const double gbps = bytes / us / 1e3;
      rows.push_back({std::string("quantize_append ") + (rule ? "4over6" : "max6") + " (N=" + std::to_string(N) + ", H=8)",
                      0, 0, T, us, gbps, gbps / roof, last_clock});
    }
    cudaFree(pool);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(ds);
    cudaFree(dp);
  }

  Report rep("decode: kvtier paged decode (BF16 / FP8 / NVFP4) and quantize_append vs pure read",
             "kvtier-bench decode" + std::string(quick ? " --quick" : "") + " --iters " + std::to_string(iters) +
                 (sustain_ms > 0 ? " --sustain-ms " + std::to_string(sustain_ms) : std::string()) +
                 (run_decode && run_quantize ? std::string() : " --kernels " + kernel_list));
  rep.SetDevice(prop.name);
  rep.SetColumns({"kernel", "batch", "context", "T", "time us", "GB/s (bytes it must move)", "of pure read", "SM clock"});
  for (const Row& r : rows) {
    if (r.us == 0) {
      rep.AddRow({r.what, std::to_string(r.batch), std::to_string(r.ctx), std::to_string(r.T), "",
                  Fmt("nvfp4/fp8 time = %.3f", r.gbps), Fmt("nvfp4/bf16 time = %.3f", r.frac), ""});
    } else {
      rep.AddRow({r.what, r.batch ? std::to_string(r.batch) : "", r.ctx ? std::to_string(r.ctx) : "",
                  r.T ? std::to_string(r.T) : "", Fmt("%.1f", r.us), Fmt("%.0f", r.gbps), Fmt("%.1f%%", 100 * r.frac),
                  GpuClockSampler::Describe(r.clock)});
    }
  }
  rep.AddNote("32 query heads, 8 KV heads, D=128, one layer; KV bytes per token and head: bf16 512, fp8 256, nvfp4 144. "
              "Data rotates over >= 4x L2 of distinct slots; block tables are random permutations. Time: median of 5 means of " +
              std::to_string(iters) + " back-to-back launches. SM clock: mean over the timed launches (NVML; n/a without it), "
              "and the share of samples the board's power cap throttled." +
              (sustain_ms > 0 ? " Each kernel first ran back to back for " + std::to_string(sustain_ms) +
                                    " ms (--sustain-ms): the GPU at that load."
                              : std::string(" Bursts of well under a second: the driver's power average may not reach the cap.")));
  if (Status s = rep.Emit(results); !s.ok()) return cli::Fail(s.message());
  if (!json_path.empty()) {
    std::ofstream js(json_path);
    js << "{\"device\": \"" << prop.name << "\", \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      js << "  {\"what\": \"" << r.what << "\", \"batch\": " << r.batch << ", \"context\": " << r.ctx
         << ", \"T\": " << r.T << ", \"us\": " << r.us << ", \"gbps\": " << r.gbps << ", \"frac\": " << r.frac
         << ", \"sm_mhz\": " << r.clock.mean_sm_mhz << ", \"power_capped\": " << r.clock.power_capped << "}"
         << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    js << "]}\n";
  }
  return 0;
}

#else

int RunDecodeBench(const std::vector<std::string>&) {
  return cli::Fail("kvtier-bench decode needs a CUDA build (this one was built without CUDA)");
}

#endif

const cli::CommandRegistrar kReg(
    "decode", "GPU decode (bf16/fp8/nvfp4 pages) and quantize_append vs pure-read bandwidth", RunDecodeBench,
    "[--quick] [--no-arena] [--iters N] [--formats F,...] [--shapes BxL,...] [--block-tokens T,...] [--splits N] "
    "[--sustain-ms N] [--kernels K,...] [--json FILE] [--results FILE]\n"
    "  --quick          two small shapes, 5 launches per timing\n"
    "  --no-arena       skip the decode on daemon-shaped arenas (up to 32 layers per block at random\n"
    "                   slot ids, block-major and layer-major, and block-major on kvtierd's own\n"
    "                   arena imported over CUDA IPC), measured by default after each pool\n"
    "  --iters N        back-to-back launches per timing; the median of 5 means is reported (default 30)\n"
    "  --formats F,...  of bf16, fp8, nvfp4 (default all three)\n"
    "  --shapes BxL,... batch x context, L a multiple of 64 (default 1x32768,1x131072,16x65536,64x8192)\n"
    "  --block-tokens T,...  page sizes of 16 and 64 tokens (default 16,64)\n"
    "  --splits N       KV splits per sequence, 0-65536 (default 0: the library's choice)\n"
    "  --sustain-ms N   run each kernel back to back for N ms before timing it, 0-600000 (default 0);\n"
    "                   the time a GPU held at that load gets (an H200 then hits its power cap)\n"
    "  --kernels K,...  of decode, quantize (default both); the roofline row is always measured\n"
    "  --json FILE      also write the rows as JSON\n"
    "  --results FILE   append the table to FILE (default: bench/history/results.md)\n"
    "Each row also gives the mean SM clock over its timed launches and the share of them\n"
    "throttled by the board's power cap (NVML; n/a without it).");

}  // namespace
}  // namespace kvtier::bench
