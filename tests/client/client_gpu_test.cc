// The HBM path through kvtierd (label gpu): attach with a GPU, the CUDA IPC handle in the
// attach reply, acquire into HBM, and the promoted bytes read back through the IPC
// mapping. Skips, saying why, where the daemon has no HBM tier (no GPU or no CUDA build).
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace kvtier::testing
