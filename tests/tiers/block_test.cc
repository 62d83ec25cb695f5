// MayGo (tiers/block.h), the one rule that every eviction, demotion, flush, operator
// eviction and erasure asks: never a held, pinned or moving block or copy.
#include "tiers/block.h"

#include <gtest/gtest.h>

namespace kvtier::tiers {
namespace {

Block Cached() {
  Block b;
  b.slot[kH] = 3;
  b.slot[kS] = 5;
  b.nvme = true;
  return b;
}

TEST(MayGo, AnIdleBlockMayGoFromEveryTier) {
  const Block b = Cached();
  for (int t : {kH, kS, kN, kAllTiers}) EXPECT_TRUE(MayGo(b, t)) << t;
}

// A method that holds a block (an acquire that lets the lock go while it sends copies, a
// remote fetch between staging and acquiring) relies on it staying cached: no path may
// take it, the operator's eviction included.
TEST(MayGo, AHeldBlockMayGoFromNoTier) {
  Block b = Cached();
  b.holds = 1;
  for (int t : {kH, kS, kN, kAllTiers}) EXPECT_FALSE(MayGo(b, t)) << t;
}

TEST(MayGo, APinOrACopyInFlightKeepsItsTierAndTheBlock) {
  for (int t : {kH, kS}) {
    Block pinned = Cached();
    pinned.pins[t] = 1;
    EXPECT_FALSE(MayGo(pinned, t));
    EXPECT_TRUE(MayGo(pinned, t == kH ? kS : kH));
    EXPECT_FALSE(MayGo(pinned, kAllTiers));

    Block busy = Cached();
    busy.busy[t] = true;
    EXPECT_FALSE(MayGo(busy, t));
    EXPECT_FALSE(MayGo(busy, kAllTiers));

    Block moving = Cached();
    moving.promo[t] = std::make_shared<Promotion>();
    EXPECT_FALSE(MayGo(moving, kAllTiers));
  }
  Block reading = Cached();
  reading.io_pins[kN] = 1;
  EXPECT_FALSE(MayGo(reading, kN));
  EXPECT_FALSE(MayGo(reading, kAllTiers));
  Block writing = Cached();
  writing.busy[kS] = true;  // host -> NVMe write in flight
  EXPECT_FALSE(MayGo(writing, kN));
}

TEST(MayGo, ATierWithoutACopyHasNothingToLetGo) {
  Block b;
  b.nvme = true;
  EXPECT_FALSE(MayGo(b, kH));
  EXPECT_FALSE(MayGo(b, kS));
  EXPECT_TRUE(MayGo(b, kN));
}

}  // namespace
}  // namespace kvtier::tiers
