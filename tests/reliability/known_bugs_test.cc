// Bugs found by the reliability work in code owned by others, each kept as a regression
// test once fixed. A bug not fixed yet is DISABLED_ (run with
// --gtest_also_run_disabled_tests); remove DISABLED_ with the fix.
#include <gtest/gtest.h>

#include <thread>

#include "tests/reliability/reliability_util.h"

namespace kvtier::reliability {
namespace {

using testing::DaemonProcess;

// tiers/tier_manager.cc, AllocLocked (the `ts.free() < n` branch) and
// MaintainLocked: when the tier holds committed, unpinned blocks that are not yet on
// NVMe ("dirty"), AllocSlots frees only clean blocks (EvictCleanLocked) and otherwise
// calls MaintainLocked, which demotes only while the tier is above its high watermark
// and only down to the low one. A request for more slots than (free + clean + the
// high->low margin) therefore returns RETRY forever although nothing is pinned
// (tier_manager.h promises RETRY only "when the tier is full of pinned blocks").
// Fixed: a Retry'd alloc records the free slots it waits for (TierState::want_free), and
// MaintainLocked demotes until they exist.
TEST(KnownBugs, AllocOfMoreThanTheWatermarkMarginDemotesUnpinnedBlocks) {
  DaemonProcess d;  // host: 64 slots, watermarks 0.95 / 0.85
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK);
  // 56 committed blocks (87.5%: below the high watermark), every lease released.
  for (uint64_t i = 0; i < 56; i += 4) {
    std::vector<kvtier_key> keys;
    for (uint64_t j = 0; j < 4; ++j) keys.push_back(MakeKey(30, i + j));
    size_t done = 0;
    ASSERT_EQ(c.Store(keys, [](const kvtier_key&) {}, &done), KVTIER_OK);
  }
  EXPECT_EQ(d.WaitMetric("kvtier_tier_pinned_blocks{tier=\"host\"}", 0), 0);
  // Nothing is pinned: 32 slots must become available (by demoting to NVMe).
  uint64_t lease = 0;
  std::vector<kvtier_slot> slots(32);
  kvtier_status s = KVTIER_RETRY;
  for (int i = 0; i < 250 && s != KVTIER_OK; ++i) {  // 5 s
    s = kvtier_alloc(c.c, c.contract, 32, KVTIER_TIER_HOST, &lease, slots.data());
    if (s != KVTIER_OK) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(s, KVTIER_OK) << kvtier_last_error();
}

}  // namespace
}  // namespace kvtier::reliability
