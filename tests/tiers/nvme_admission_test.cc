// NvmeAdmission on its own: the three modes, the ghost list's bound, the forced admission
// of a flush, and the daily write budget with its window and refunds. ReuseAdmission:
// the budget goes to likely blocks first, to first offers only where it would be left;
// NvmeAdmission's reuse mode decides as it does.
#include "tiers/nvme_admission.h"

#include <gtest/gtest.h>

namespace kvtier::tiers {
namespace {

using Clock = NvmeAdmission::Clock;

BlockId Id(uint64_t i) { return BlockId{7, Key128{i, ~i}}; }

TEST(NvmeAdmission, AlwaysTakesEveryBlock) {
  NvmeAdmission a(Admission::kAlways, 0, 0);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_TRUE(a.Admit(Id(i), 8192, 0, false));
  EXPECT_EQ(a.rejects(), 0u);
  EXPECT_EQ(a.budget_used(), 100u * 8192);
}

TEST(NvmeAdmission, SecondHitRefusesTheFirstOfferAndTakesTheSecond) {
  NvmeAdmission a(Admission::kSecondHit, 0, 0);
  EXPECT_FALSE(a.Admit(Id(1), 8192, 1, false));
  EXPECT_TRUE(a.Admit(Id(1), 8192, 1, false));   // remembered: taken
  EXPECT_FALSE(a.Admit(Id(1), 8192, 1, false));  // taken once, forgotten: refused again
  EXPECT_TRUE(a.Admit(Id(2), 8192, 2, false));   // used twice: taken at once
  EXPECT_TRUE(a.Admit(Id(3), 8192, 0, true));    // forced (flush): taken at once
  EXPECT_EQ(a.rejects(), 2u);
}

TEST(NvmeAdmission, GhostListForgetsTheOldestPastItsCapacity) {
  NvmeAdmission a(Admission::kSecondHit, 0, 10);  // at least 1024 are remembered
  for (uint64_t i = 0; i < 1025; ++i) EXPECT_FALSE(a.Admit(Id(i), 4096, 0, false));
  EXPECT_FALSE(a.Admit(Id(0), 4096, 0, false)) << "the oldest refusal was forgotten";
  EXPECT_TRUE(a.Admit(Id(1024), 4096, 0, false)) << "the newest is remembered";
}

TEST(NvmeAdmission, DailyBudgetCapsWritesForcedOrNotAndResetsAfter24Hours) {
  const Clock::time_point t0 = Clock::now();
  NvmeAdmission a(Admission::kAlways, 3 * 8192, 0, t0);
  EXPECT_TRUE(a.Admit(Id(1), 8192, 0, false, t0));
  EXPECT_TRUE(a.Admit(Id(2), 8192, 0, true, t0));
  EXPECT_TRUE(a.Admit(Id(3), 8192, 0, false, t0));
  EXPECT_FALSE(a.Admit(Id(4), 8192, 0, false, t0));
  EXPECT_FALSE(a.Admit(Id(4), 8192, 0, true, t0)) << "a flush does not pass the budget";
  a.Refund(8192);  // a write that failed gives its bytes back
  EXPECT_TRUE(a.Admit(Id(4), 8192, 0, false, t0 + std::chrono::hours(23)));
  EXPECT_FALSE(a.Admit(Id(5), 8192, 0, false, t0 + std::chrono::hours(23)));
  EXPECT_TRUE(a.Admit(Id(5), 8192, 0, false, t0 + std::chrono::hours(24))) << "a new window";
  EXPECT_EQ(a.budget_used(), 8192u);
  EXPECT_EQ(a.rejects(), 3u);
}

TEST(NvmeAdmission, RefundNeverGoesBelowZero) {
  NvmeAdmission a(Admission::kAlways, 8192, 0);
  a.Refund(4096);
  EXPECT_EQ(a.budget_used(), 0u);
  EXPECT_TRUE(a.Admit(Id(1), 8192, 0, false));
  EXPECT_FALSE(a.Admit(Id(2), 1, 0, false));
}

TEST(NvmeAdmission, ConfigureSwitchesModeAndBudget) {
  NvmeAdmission a(Admission::kAlways, 0, 0);
  EXPECT_TRUE(a.Admit(Id(1), 8192, 0, false));
  a.Configure(Admission::kSecondHit, 8192 * 2);
  EXPECT_FALSE(a.Admit(Id(2), 8192, 0, false));
  EXPECT_TRUE(a.Admit(Id(2), 8192, 0, false));
  EXPECT_FALSE(a.Admit(Id(3), 8192, 5, false)) << "the budget counts the bytes before the switch";
}

TEST(ClientWriteBudget, EachClientSpendsItsOwnPartAndAWindowResetsIt) {
  const Clock::time_point t0 = Clock::now();
  ClientWriteBudget b(2 * 8192, t0);
  for (uint64_t client : {1, 2}) {
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(b.Fits(client, 8192, t0)) << client;
      b.Charge(client, 8192);
    }
  }
  EXPECT_FALSE(b.Fits(1, 8192, t0));
  EXPECT_FALSE(b.Fits(2, 1, t0));
  EXPECT_TRUE(b.Fits(3, 8192, t0)) << "a third client has its own part";
  EXPECT_TRUE(b.Fits(0, 1 << 20, t0)) << "a block no client committed counts against the global budget only";
  b.Refund(1, 8192);  // client 1's write failed
  EXPECT_TRUE(b.Fits(1, 8192, t0));
  b.Refund(1, 1 << 20);
  EXPECT_EQ(b.used(1), 0u) << "a refund never goes below zero";
  EXPECT_TRUE(b.Fits(2, 8192, t0 + std::chrono::hours(24))) << "a new window";
  EXPECT_EQ(b.used(2), 0u);
  EXPECT_EQ(b.rejects(), 2u);
  b.Configure(0);  // no limit per client
  b.Charge(2, 1 << 30);
  EXPECT_TRUE(b.Fits(2, 1 << 30, t0 + std::chrono::hours(24)));
}

ReuseAdmission::Options ReuseOpts(uint64_t budget, double window_s = 100.0) {
  ReuseAdmission::Options o;
  o.budget_bytes = budget;
  o.window_s = window_s;
  o.memory = 1024;
  return o;
}

TEST(ReuseAdmission, WithoutABudgetEveryBlockIsWritten) {
  ReuseAdmission a(ReuseOpts(0));
  for (uint64_t i = 0; i < 100; ++i) EXPECT_TRUE(a.Admit(Id(i), 4096, 1, static_cast<double>(i)));
  EXPECT_EQ(a.rejects(), 0u);
}

// Half a window gone, half the budget spent: a first offer is refused, a block used twice
// or offered before is written, up to the budget and never past it.
TEST(ReuseAdmission, AheadOfThePaceOnlyLikelyBlocksAreWritten) {
  ReuseAdmission a(ReuseOpts(4 * 4096));
  EXPECT_TRUE(a.Admit(Id(1), 4096, 1, 0.0));   // nothing spent, not ahead: a first offer goes
  EXPECT_FALSE(a.Admit(Id(2), 4096, 1, 10.0)); // 25% spent, 10% of the window gone
  EXPECT_TRUE(a.Admit(Id(3), 4096, 2, 10.0));  // used twice: likely
  EXPECT_TRUE(a.Admit(Id(2), 4096, 1, 20.0));  // offered before: likely
  EXPECT_TRUE(a.Admit(Id(4), 4096, 1, 80.0));  // 75% spent, 80% gone: behind the pace
  EXPECT_FALSE(a.Admit(Id(5), 4096, 9, 90.0)) << "the budget is a hard cap";
  EXPECT_EQ(a.budget_used(), 4u * 4096);
  EXPECT_EQ(a.rejects(), 2u);
  EXPECT_TRUE(a.Admit(Id(6), 4096, 1, 100.0)) << "a new window";
  a.Refund(8192);
  EXPECT_EQ(a.budget_used(), 0u);
}

TEST(ReuseAdmission, RemembersTheLastOffersOnly) {
  // Spent ahead of the pace (t = 0): only a remembered key passes as likely. 1025
  // offers with a memory of 1024.
  ReuseAdmission b(ReuseOpts(2));
  EXPECT_TRUE(b.Admit(Id(0), 1, 1, 0.0));
  for (uint64_t i = 1; i <= 1024; ++i) EXPECT_FALSE(b.Admit(Id(i), 1, 1, 0.0));
  EXPECT_FALSE(b.Admit(Id(0), 1, 1, 0.0)) << "the oldest offer was forgotten";
  EXPECT_TRUE(b.Admit(Id(1024), 1, 1, 0.0)) << "the newest is remembered";
  EXPECT_EQ(ReuseOpts(0).Check(), "");
  auto bad = ReuseOpts(0);
  bad.memory = 10;
  EXPECT_NE(bad.Check(), "");
  bad = ReuseOpts(0, 0.0);
  EXPECT_NE(bad.Check(), "");
}

TEST(NvmeAdmission, ReuseWithoutABudgetTakesEveryBlock) {
  NvmeAdmission a(Admission::kReuse, 0, 0);
  for (uint64_t i = 0; i < 100; ++i) EXPECT_TRUE(a.Admit(Id(i), 8192, 1, false));
  EXPECT_EQ(a.rejects(), 0u);
}

// A day's budget of four blocks, a quarter of the day gone: a first offer is refused once
// the spent share passes the elapsed share; a block used twice, a block offered before
// and a flush are taken; the budget caps them all.
TEST(NvmeAdmission, ReuseUnderABudgetTakesLikelyBlocksAndFirstOffersOnlyBehindThePace) {
  const Clock::time_point t0 = Clock::now();
  const Clock::time_point t1 = t0 + std::chrono::hours(1);
  NvmeAdmission a(Admission::kReuse, 4 * 8192, 0, t0);
  EXPECT_TRUE(a.Admit(Id(1), 8192, 1, false, t0)) << "nothing spent: a first offer goes";
  EXPECT_FALSE(a.Admit(Id(2), 8192, 1, false, t1)) << "25% spent, 4% of the day gone";
  EXPECT_TRUE(a.Admit(Id(3), 8192, 2, false, t1)) << "used twice";
  EXPECT_TRUE(a.Admit(Id(2), 8192, 1, false, t1)) << "offered before";
  EXPECT_FALSE(a.Admit(Id(4), 8192, 1, false, t1));
  EXPECT_TRUE(a.Admit(Id(5), 8192, 0, true, t1)) << "a flush skips the rule";
  EXPECT_FALSE(a.Admit(Id(6), 8192, 5, true, t1)) << "but not the budget";
  EXPECT_EQ(a.budget_used(), 4u * 8192);
  EXPECT_EQ(a.rejects(), 3u);
  EXPECT_TRUE(a.Admit(Id(7), 8192, 1, false, t0 + std::chrono::hours(24))) << "a new window";
}

// The daemon's reuse mode and the simulator's ReuseAdmission take the same blocks from the
// same offers within one window.
TEST(NvmeAdmission, ReuseDecidesAsReuseAdmission) {
  const Clock::time_point t0 = Clock::now();
  const uint64_t budget = 300 * 4096;
  NvmeAdmission daemon(Admission::kReuse, budget, 2048, t0);
  ReuseAdmission::Options o;
  o.budget_bytes = budget;
  o.window_s = 86400.0;
  o.memory = 2048;
  ReuseAdmission sim(o, 0.0);
  uint64_t x = 88172645463325252ull, taken = 0;
  for (int i = 0; i < 5000; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const double t = 86000.0 * i / 5000;
    const BlockId id = Id(x % 3000);
    const uint32_t uses = 1 + static_cast<uint32_t>((x >> 20) % 3);
    const bool d = daemon.Admit(id, 4096, uses, false,
                                t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t)));
    ASSERT_EQ(d, sim.Admit(id, 4096, uses, t)) << "offer " << i;
    taken += d;
  }
  EXPECT_EQ(daemon.budget_used(), sim.budget_used());
  EXPECT_EQ(daemon.rejects(), sim.rejects());
  EXPECT_GT(taken, 0u);
  EXPECT_GT(daemon.rejects(), 0u);
}

}  // namespace
}  // namespace kvtier::tiers
