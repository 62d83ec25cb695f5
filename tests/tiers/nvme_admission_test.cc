// NvmeAdmission on its own: the two modes, the ghost list's bound, the forced admission
// of a flush, and the daily write budget with its window and refunds.
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

}  // namespace
}  // namespace kvtier::tiers
