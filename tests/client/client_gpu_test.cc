// The HBM path through kvtierd (label gpu): attach with a GPU, the CUDA IPC handle in the
// attach reply, acquire into HBM, and the promoted bytes read back through the IPC
// mapping. Skips, saying why, where the daemon has no HBM tier (no GPU or no CUDA build).
#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

TEST(ClientGpu, AcquireIntoHbmAndReadThroughIpc) {
  DaemonConfig cfg;
  cfg.extra = "[tiers.hbm]\ncapacity = \"1MiB\"\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_connect_options o{};
  o.name = "gpu-test";
  o.has_gpu = 1;
  kvtier_client* c = nullptr;
  ASSERT_EQ(kvtier_connect(d.socket().c_str(), &o, &c), KVTIER_OK) << kvtier_last_error();
  uint8_t handle[64];
  if (kvtier_hbm_ipc_handle(c, handle) != KVTIER_OK) {
    kvtier_close(c);
    GTEST_SKIP() << "no CUDA device: the daemon has no HBM tier (" << kvtier_last_error() << ")";
  }
  const auto desc = SmallContract();
  uint64_t cid = 0, lease = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  std::vector<kvtier_key> keys{{1, 11}, {2, 22}, {3, 33}};
  std::vector<kvtier_slot> slots(3);
  ASSERT_EQ(kvtier_alloc(c, cid, 3, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK);
  uint64_t arena_bytes = 0;
  auto* arena = static_cast<uint8_t*>(kvtier_host_arena(c, &arena_bytes));
  const uint64_t sb = kvtier_slot_bytes(c);
  std::vector<kvtier_commit_item> items;
  for (size_t i = 0; i < 3; ++i) {
    FillBlock(arena + slots[i].slot * sb, 576, cid, keys[i]);
    items.push_back({slots[i], keys[i], i ? keys[i - 1] : kvtier_key{0, 0}});
  }
  ASSERT_EQ(kvtier_commit(c, cid, lease, items.data(), 3, nullptr), KVTIER_OK);
  ASSERT_EQ(kvtier_release(c, lease), KVTIER_OK);
  size_t n = 0;
  ASSERT_EQ(kvtier_acquire(c, cid, keys.data(), 3, KVTIER_TIER_HBM, &lease, slots.data(), &n), KVTIER_OK)
      << kvtier_last_error();
  ASSERT_EQ(n, 3u);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(slots[i].tier, KVTIER_TIER_HBM);
  kvtier_lookup_result lr{};
  std::vector<uint8_t> tiers(3);
  ASSERT_EQ(kvtier_lookup(c, cid, keys.data(), 3, &lr, tiers.data()), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 3u);
  for (auto t : tiers) EXPECT_EQ(t, KVTIER_TIER_HBM);
#if KVTIER_HAVE_CUDA
  void* dev = nullptr;
  ASSERT_EQ(kvtier_hbm_open(c, &dev), KVTIER_OK) << kvtier_last_error();
  std::vector<uint8_t> back(576);
  for (size_t i = 0; i < n; ++i) {
    std::fill(back.begin(), back.end(), 0xEE);  // poisoned first
    ASSERT_EQ(cudaMemcpy(back.data(), static_cast<uint8_t*>(dev) + slots[i].slot * sb, 576,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_TRUE(CheckBlock(back.data(), 576, cid, keys[i])) << "HBM slot " << slots[i].slot;
  }
#endif
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
#if !KVTIER_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: the HBM bytes were not read back through the IPC handle";
#endif
}

// HBM slot classes: with tiers.slot_classes the HBM tier has the host's classes in slabs
// of its own, each contract's blocks in the smallest class that holds them (no block padded
// to slot_bytes), slot s at the arena + s * kvtier_hbm_granule. Two contracts of different
// block sizes are committed into HBM and read back byte for byte through the IPC mapping
// at that address; HBM's used bytes are their classes' (4 KiB and 12 KiB), not slot_bytes
// for each; a client of protocol 6 (which would address HBM slot s at s * slot_bytes) gets
// no HBM handle.
TEST(ClientGpu, HbmSlotClassesHoldEachBlockInItsClass) {
  DaemonConfig cfg;
  cfg.slot_bytes = "12KiB";
  cfg.host_capacity = "240KiB";
  cfg.extra = "[tiers.hbm]\ncapacity = \"480KiB\"\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start({"--set", "tiers.slot_classes=4KiB,12KiB", "--set", "tiers.slab_bytes=48KiB", "--set",
                       "daemon.max_tier_share_per_client=1"}))
      << d.log();
  kvtier_connect_options o{};
  o.name = "gpu-classes";
  o.has_gpu = 1;
  kvtier_client* c = nullptr;
  ASSERT_EQ(kvtier_connect(d.socket().c_str(), &o, &c), KVTIER_OK) << kvtier_last_error();
  uint8_t handle[64];
  if (kvtier_hbm_ipc_handle(c, handle) != KVTIER_OK) {
    kvtier_close(c);
    GTEST_SKIP() << "no CUDA device: the daemon has no HBM tier (" << kvtier_last_error() << ")";
  }
  EXPECT_EQ(kvtier_hbm_granule(c), 4096u);
  EXPECT_EQ(kvtier_hbm_arena_bytes(c), 480u << 10);
  kvtier_contract_desc small = SmallContract("test/small"), large = SmallContract("test/large");
  small.num_layers = 14;  // 4032 B: the 4 KiB class
  large.num_layers = 40;  // 11520 B: the 12 KiB class
  uint64_t cs = 0, cl = 0, bs = 0, bl = 0;
  ASSERT_EQ(kvtier_contract_block_bytes(&small, &bs), KVTIER_OK);
  ASSERT_EQ(kvtier_contract_block_bytes(&large, &bl), KVTIER_OK);
  ASSERT_EQ(kvtier_register_contract(c, &small, &cs), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_register_contract(c, &large, &cl), KVTIER_OK) << kvtier_last_error();
#if KVTIER_HAVE_CUDA
  void* dev = nullptr;
  ASSERT_EQ(kvtier_hbm_open(c, &dev), KVTIER_OK) << kvtier_last_error();
  auto* hbm = static_cast<uint8_t*>(dev);
  const uint64_t g = kvtier_hbm_granule(c);
  struct Stored {
    uint64_t cid, bytes;
    std::vector<kvtier_key> keys;
    std::vector<kvtier_slot> slots;
  };
  std::vector<Stored> stored;
  // Interleaved: 6 small blocks, 4 large, 6 small; each commit's slots in its class.
  for (const auto& [cid, bytes, n, tag] : {std::tuple{cs, bs, 6u, 1u}, std::tuple{cl, bl, 4u, 2u},
                                            std::tuple{cs, bs, 6u, 3u}}) {
    Stored st{cid, bytes, {}, std::vector<kvtier_slot>(n)};
    uint64_t lease = 0;
    ASSERT_EQ(kvtier_alloc(c, cid, n, KVTIER_TIER_HBM, &lease, st.slots.data()), KVTIER_OK) << kvtier_last_error();
    std::vector<kvtier_commit_item> items;
    std::vector<uint8_t> buf(bytes);
    for (uint32_t i = 0; i < n; ++i) {
      st.keys.push_back({tag, i + 1});
      FillBlock(buf.data(), bytes, cid, st.keys[i]);
      ASSERT_EQ(cudaMemcpy(hbm + st.slots[i].slot * g, buf.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      items.push_back({st.slots[i], st.keys[i], i ? st.keys[i - 1] : kvtier_key{0, 0}});
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(kvtier_commit(c, cid, lease, items.data(), n, nullptr), KVTIER_OK) << kvtier_last_error();
    ASSERT_EQ(kvtier_release(c, lease), KVTIER_OK);
    stored.push_back(std::move(st));
  }
  kvtier_tier_stats ts[4];
  size_t nts = 0;
  ASSERT_EQ(kvtier_stats(c, ts, 4, &nts), KVTIER_OK);
  ASSERT_GE(nts, 1u);
  EXPECT_EQ(ts[0].tier, KVTIER_TIER_HBM);
  EXPECT_EQ(ts[0].used_bytes, 12u * 4096 + 4u * 12288) << "every block in a slot of its class";
  // Read back through the IPC mapping at slot * granule (acquired again: the slots named by
  // the acquire), after a round trip through host for the first commit's blocks.
  ASSERT_EQ(kvtier_flush_to(c, KVTIER_TIER_HOST), KVTIER_OK) << kvtier_last_error();
  for (const Stored& st : stored) {
    std::vector<kvtier_slot> slots(st.keys.size());
    uint64_t lease = 0;
    size_t got = 0;
    ASSERT_EQ(kvtier_acquire(c, st.cid, st.keys.data(), st.keys.size(), KVTIER_TIER_HBM, &lease, slots.data(), &got),
              KVTIER_OK)
        << kvtier_last_error();
    EXPECT_EQ(got, st.keys.size());
    std::vector<uint8_t> back(st.bytes);
    for (size_t i = 0; i < got; ++i) {
      std::fill(back.begin(), back.end(), 0xEE);
      ASSERT_EQ(cudaMemcpy(back.data(), hbm + uint64_t{slots[i].slot} * g, st.bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_TRUE(CheckBlock(back.data(), st.bytes, st.cid, st.keys[i])) << "HBM slot " << slots[i].slot;
    }
    EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  }
#endif
  // Protocol 6 with the GPU flag: no handle, since it would place slot s at s * slot_bytes.
  RawClient v5;
  wire::AttachReply reply;
  ASSERT_TRUE(v5.Attach(d.socket(), &reply, 6, wire::kAttachHasGpu));
  ASSERT_EQ(reply.status, 0) << reply.message;
  EXPECT_EQ(reply.flags & wire::kReplyHasHbm, 0u);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
#if !KVTIER_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA: the HBM bytes were not read back through the IPC handle";
#endif
}

// The HBM arena's IPC handle goes only to a client that attached with the GPU flag: a raw
// attach without it gets none (flag clear, handle zero), libkvtier says why, and HBM alloc
// and acquire are refused with the reason.
TEST(ClientGpu, HbmHandleOnlyForGpuClients) {
  DaemonConfig cfg;
  cfg.extra = "[tiers.hbm]\ncapacity = \"1MiB\"\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_connect_options o{};
  o.name = "host-only";
  kvtier_client* host_only = nullptr;
  ASSERT_EQ(kvtier_connect(d.socket().c_str(), &o, &host_only), KVTIER_OK) << kvtier_last_error();
  uint8_t handle[64];
  EXPECT_EQ(kvtier_hbm_ipc_handle(host_only, handle), KVTIER_INVALID);
  EXPECT_NE(std::string(kvtier_last_error()).find("has_gpu"), std::string::npos) << kvtier_last_error();
  o.name = "gpu";
  o.has_gpu = 1;
  kvtier_client* gpu = nullptr;
  ASSERT_EQ(kvtier_connect(d.socket().c_str(), &o, &gpu), KVTIER_OK) << kvtier_last_error();
  if (kvtier_hbm_ipc_handle(gpu, handle) != KVTIER_OK) {
    kvtier_close(gpu);
    kvtier_close(host_only);
    GTEST_SKIP() << "no CUDA device: the daemon has no HBM tier (" << kvtier_last_error() << ")";
  }
  RawClient raw;  // attach flags 0
  wire::AttachReply reply;
  ASSERT_TRUE(raw.Attach(d.socket(), &reply));
  ASSERT_EQ(reply.status, 0);
  EXPECT_EQ(reply.flags & wire::kReplyHasHbm, 0u);
  bool zero = true;
  for (uint8_t b : reply.hbm_ipc_handle) zero = zero && b == 0;
  EXPECT_TRUE(zero) << "a client without the GPU flag got the HBM arena's handle";
  const auto desc = SmallContract();
  uint64_t cid = 0, lease = 0;
  ASSERT_EQ(kvtier_register_contract(host_only, &desc, &cid), KVTIER_OK);
  kvtier_slot slot{};
  EXPECT_EQ(kvtier_alloc(host_only, cid, 1, KVTIER_TIER_HBM, &lease, &slot), KVTIER_INVALID);
  EXPECT_NE(std::string(kvtier_last_error()).find("without a GPU"), std::string::npos) << kvtier_last_error();
  kvtier_key k{1, 11};
  size_t n = 0;
  EXPECT_EQ(kvtier_acquire(host_only, cid, &k, 1, KVTIER_TIER_HBM, &lease, &slot, &n), KVTIER_INVALID);
  EXPECT_NE(std::string(kvtier_last_error()).find("without a GPU"), std::string::npos) << kvtier_last_error();
  ASSERT_EQ(kvtier_alloc(gpu, cid, 1, KVTIER_TIER_HBM, &lease, &slot), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(kvtier_release(gpu, lease), KVTIER_OK);
  raw.Close();
  kvtier_close(gpu);
  kvtier_close(host_only);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

#if KVTIER_HAVE_CUDA
// A GPU client commits three HBM blocks, then overwrites the middle one through its IPC
// mapping (CUDA IPC maps read-write). Pushed down (flush to host, then to NVMe, then a
// restart), the changed block is dropped, counted (tier stats and /metrics) and logged with
// the client that committed it, and is never served from host or NVMe; the untouched
// blocks go down and come back byte-exact.
TEST(ClientGpu, BlockChangedThroughIpcIsDroppedNotDemoted) {
  DaemonConfig cfg;
  cfg.extra = "[tiers.hbm]\ncapacity = \"1MiB\"\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_connect_options o{};
  o.name = "gpu-writer";
  o.has_gpu = 1;
  kvtier_client* c = nullptr;
  ASSERT_EQ(kvtier_connect(d.socket().c_str(), &o, &c), KVTIER_OK) << kvtier_last_error();
  uint8_t handle[64];
  if (kvtier_hbm_ipc_handle(c, handle) != KVTIER_OK) {
    kvtier_close(c);
    GTEST_SKIP() << "no CUDA device: the daemon has no HBM tier (" << kvtier_last_error() << ")";
  }
  const auto desc = SmallContract();
  uint64_t cid = 0, lease = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  uint64_t bb = 0;
  ASSERT_EQ(kvtier_contract_block_bytes(&desc, &bb), KVTIER_OK);
  const uint64_t sb = kvtier_slot_bytes(c);
  void* dev = nullptr;
  ASSERT_EQ(kvtier_hbm_open(c, &dev), KVTIER_OK) << kvtier_last_error();
  auto* hbm = static_cast<uint8_t*>(dev);
  std::vector<kvtier_key> keys{{7, 1}, {7, 2}, {7, 3}};
  std::vector<kvtier_slot> slots(3);
  ASSERT_EQ(kvtier_alloc(c, cid, 3, KVTIER_TIER_HBM, &lease, slots.data()), KVTIER_OK) << kvtier_last_error();
  std::vector<kvtier_commit_item> items;
  std::vector<uint8_t> buf(bb);
  for (size_t i = 0; i < 3; ++i) {
    FillBlock(buf.data(), bb, cid, keys[i]);
    ASSERT_EQ(cudaMemcpy(hbm + slots[i].slot * sb, buf.data(), bb, cudaMemcpyHostToDevice), cudaSuccess);
    items.push_back({slots[i], keys[i], i ? keys[i - 1] : kvtier_key{0, 0}});
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the writes land before the commit hashes them
  ASSERT_EQ(kvtier_commit(c, cid, lease, items.data(), 3, nullptr), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_release(c, lease), KVTIER_OK);
  // After commit and release: eight bytes of the middle block, through the IPC mapping.
  // The daemon's hash runs on the GPU shortly after kvtier_commit returns (on a stream of
  // its own); the change is made well after it.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(cudaMemset(hbm + slots[1].slot * sb + 100, 0xAB, 8), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(kvtier_flush_to(c, KVTIER_TIER_HOST), KVTIER_OK) << kvtier_last_error();

  kvtier_tier_stats st[4];
  size_t nst = 0;
  ASSERT_EQ(kvtier_stats(c, st, 4, &nst), KVTIER_OK);
  ASSERT_GE(nst, 1u);
  EXPECT_EQ(st[0].tier, KVTIER_TIER_HBM);
  EXPECT_EQ(st[0].checksum_failures, 1u);
  EXPECT_EQ(MetricValue(HttpGet(d.metrics_port(), "/metrics"), "kvtier_tier_checksum_failures_total{tier=\"hbm\"}"), 1);
  const std::string log = d.log();
  EXPECT_NE(log.find("failed its check on the way out of HBM"), std::string::npos) << log;
  EXPECT_NE(log.find("committed by client"), std::string::npos) << log;

  // Host: the changed block is gone; the others are there, exact.
  auto acquire_one = [&](kvtier_client* cl, const kvtier_key& k, std::vector<uint8_t>* out) -> size_t {
    kvtier_slot s{};
    size_t got = 0;
    uint64_t l = 0;
    EXPECT_EQ(kvtier_acquire(cl, cid, &k, 1, KVTIER_TIER_HOST, &l, &s, &got), KVTIER_OK) << kvtier_last_error();
    if (got == 1) {
      const auto* p = static_cast<const uint8_t*>(kvtier_host_slot(cl, s.slot));
      out->assign(p, p + bb);
    }
    EXPECT_EQ(kvtier_release(cl, l), KVTIER_OK);
    return got;
  };
  std::vector<uint8_t> got;
  EXPECT_EQ(acquire_one(c, keys[1], &got), 0u) << "the changed block was served from host";
  for (size_t i : {0u, 2u}) {
    ASSERT_EQ(acquire_one(c, keys[i], &got), 1u) << i;
    EXPECT_TRUE(CheckBlock(got.data(), bb, cid, keys[i])) << i;
  }
  // NVMe, across a restart.
  ASSERT_EQ(kvtier_flush(c), KVTIER_OK) << kvtier_last_error();
  kvtier_close(c);
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start()) << d.log();
  o.name = "reader";
  o.has_gpu = 0;
  ASSERT_EQ(kvtier_connect(d.socket().c_str(), &o, &c), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  EXPECT_EQ(acquire_one(c, keys[1], &got), 0u) << "the changed block was served from NVMe";
  for (size_t i : {0u, 2u}) {
    ASSERT_EQ(acquire_one(c, keys[i], &got), 1u) << i;
    EXPECT_TRUE(CheckBlock(got.data(), bb, cid, keys[i])) << i;
  }
  ASSERT_EQ(kvtier_stats(c, st, 4, &nst), KVTIER_OK);
  for (size_t i = 0; i < nst; ++i) {
    if (st[i].tier == KVTIER_TIER_NVME) {
      EXPECT_EQ(st[i].checksum_failures, 0u);
    }
  }
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// An asynchronous acquire into HBM of blocks on NVMe only (NVMe -> host -> HBM): the
// eventfd wakes per ready step, readiness only grows, every ready slot is an HBM slot whose
// bytes (read through the IPC mapping while the rest still restores) are the block's, and
// the result is what the blocking acquire into HBM answers.
TEST(ClientGpu, AsyncAcquireIntoHbmFromNvme) {
  DaemonConfig cfg;
  cfg.extra = "[tiers.hbm]\ncapacity = \"1MiB\"\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_connect_options o{};
  o.name = "gpu-async";
  o.has_gpu = 1;
  kvtier_client* c = nullptr;
  ASSERT_EQ(kvtier_connect(d.socket().c_str(), &o, &c), KVTIER_OK) << kvtier_last_error();
  uint8_t handle[64];
  if (kvtier_hbm_ipc_handle(c, handle) != KVTIER_OK) {
    kvtier_close(c);
    GTEST_SKIP() << "no CUDA device: the daemon has no HBM tier (" << kvtier_last_error() << ")";
  }
  const auto desc = SmallContract();
  uint64_t cid = 0, lease = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  constexpr size_t kN = 40;
  const uint64_t sb = kvtier_slot_bytes(c);
  std::vector<kvtier_key> keys;
  for (uint64_t i = 0; i < kN; ++i) keys.push_back({9, i + 1});
  std::vector<kvtier_slot> slots(kN);
  ASSERT_EQ(kvtier_alloc(c, cid, kN, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK) << kvtier_last_error();
  uint64_t ab = 0;
  auto* arena = static_cast<uint8_t*>(kvtier_host_arena(c, &ab));
  std::vector<kvtier_commit_item> items;
  for (size_t i = 0; i < kN; ++i) {
    FillBlock(arena + slots[i].slot * sb, 576, cid, keys[i]);
    items.push_back({slots[i], keys[i], i ? keys[i - 1] : kvtier_key{0, 0}});
  }
  ASSERT_EQ(kvtier_commit(c, cid, lease, items.data(), kN, nullptr), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_release(c, lease), KVTIER_OK);
  ASSERT_EQ(kvtier_flush(c), KVTIER_OK) << kvtier_last_error();
  kvtier_close(c);
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start()) << d.log();  // every block on NVMe only
  ASSERT_EQ(kvtier_connect(d.socket().c_str(), &o, &c), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  void* dev = nullptr;
  ASSERT_EQ(kvtier_hbm_open(c, &dev), KVTIER_OK) << kvtier_last_error();
  kvtier_acquire_op* op = nullptr;
  ASSERT_EQ(kvtier_acquire_async(c, cid, keys.data(), kN, KVTIER_TIER_HBM, 4, &op), KVTIER_OK) << kvtier_last_error();
  const int fd = kvtier_acquire_async_fd(op);
  size_t last = 0;
  std::vector<kvtier_slot> early(kN);
  std::vector<uint8_t> back(576);
  while (true) {
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 10000), 1) << "no wake-up within 10 s";
    uint64_t count = 0;
    ASSERT_EQ(::read(fd, &count, sizeof count), static_cast<ssize_t>(sizeof count));
    const bool finished = kvtier_acquire_async_wait(op, 0) == KVTIER_OK;
    size_t ready = 0;
    ASSERT_EQ(kvtier_acquire_async_ready(op, early.data(), kN, &ready), KVTIER_OK) << kvtier_last_error();
    ASSERT_GE(ready, last);
    for (size_t i = last; i < ready; ++i) {  // usable now: read through the IPC mapping
      ASSERT_EQ(early[i].tier, KVTIER_TIER_HBM) << i;
      std::fill(back.begin(), back.end(), 0xEE);
      ASSERT_EQ(cudaMemcpy(back.data(), static_cast<uint8_t*>(dev) + early[i].slot * sb, 576, cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_TRUE(CheckBlock(back.data(), 576, cid, keys[i])) << "HBM slot " << early[i].slot << " of block " << i;
    }
    last = ready;
    if (finished) break;
  }
  EXPECT_EQ(last, kN);
  size_t n = 0;
  std::vector<kvtier_slot> got(kN);
  ASSERT_EQ(kvtier_acquire_async_result(op, &lease, got.data(), &n), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(n, kN);
  for (size_t i = 0; i < kN; ++i) {
    EXPECT_EQ(got[i].slot, early[i].slot) << i;
    EXPECT_EQ(got[i].from_tier, KVTIER_TIER_NVME) << i;
  }
  kvtier_acquire_async_free(op);
  uint64_t lease2 = 0;
  size_t n2 = 0;
  std::vector<kvtier_slot> again(kN);
  ASSERT_EQ(kvtier_acquire(c, cid, keys.data(), kN, KVTIER_TIER_HBM, &lease2, again.data(), &n2), KVTIER_OK);
  ASSERT_EQ(n2, kN);
  for (size_t i = 0; i < kN; ++i) EXPECT_EQ(again[i].slot, got[i].slot) << i;
  EXPECT_EQ(kvtier_release(c, lease2), KVTIER_OK);
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}
#endif

}  // namespace
}  // namespace kvtier::testing
