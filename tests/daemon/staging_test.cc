// StagingArea (daemon/staging.h): slots of several sizes in one area of granule units,
// first-fit, freed runs joined; the client's ids; the budget and its take-back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "daemon/staging.h"

namespace kvtier::daemon {
namespace {

constexpr uint64_t kUnit = 4096;

std::unique_ptr<StagingArea> Area(uint32_t units, uint32_t slots = 1000, std::shared_ptr<StagingBudget> b = nullptr) {
  auto a = StagingArea::Create("staging-test", units, kUnit, slots, 100, std::move(b));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? std::move(a.value()) : nullptr;
}

// Slots of 1, 3 and 2 units side by side, each with its own bytes; the client's id of a
// slot is first_id + its first unit; a freed run is reused first-fit, and freed neighbours
// join into one run that holds a larger slot.
TEST(StagingArea, SlotsOfSeveralSizesShareOneArea) {
  auto a = Area(8);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->bytes(), 8 * kUnit);
  std::vector<uint32_t> s;
  ASSERT_TRUE(a->Alloc(1, kUnit, kUnit, &s).ok());
  ASSERT_TRUE(a->Alloc(1, 3 * kUnit - 100, 3 * kUnit, &s).ok());
  ASSERT_TRUE(a->Alloc(2, 2 * kUnit, 2 * kUnit, &s).ok());
  ASSERT_EQ(s, (std::vector<uint32_t>{0, 1, 4, 6}));
  EXPECT_EQ(a->id_of(4), 104u);
  EXPECT_EQ(a->slot_ptr(4), a->slot_ptr(0) + 4 * kUnit);
  EXPECT_EQ(a->used(), 4u);
  EXPECT_EQ(a->used_bytes(), 8 * kUnit);
  for (uint32_t i : s) std::memset(a->slot_ptr(i), static_cast<int>(i + 1), kUnit);
  // Full: nothing taken, nothing changed.
  std::vector<uint32_t> more;
  EXPECT_EQ(a->Alloc(1, kUnit, kUnit, &more).code(), StatusCode::kRejected);
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(a->slot_ptr(1)[0], 2);
  // Freeing units 0 and 1-3 joins them: a 4-unit slot fits there, not a 5-unit one.
  a->Free(0);
  a->Free(1);
  a->Free(1);  // twice: ignored
  EXPECT_EQ(a->used(), 2u);
  EXPECT_EQ(a->Alloc(1, 5 * kUnit, 5 * kUnit, &more).code(), StatusCode::kRejected);
  ASSERT_TRUE(a->Alloc(1, 4 * kUnit, 4 * kUnit, &more).ok());
  EXPECT_EQ(more, (std::vector<uint32_t>{0}));
  // A slot size that is no whole number of units, or larger than the area: Invalid.
  EXPECT_EQ(a->Alloc(1, 100, 100, &more).code(), StatusCode::kInvalid);
  EXPECT_EQ(a->Alloc(1, kUnit, 9 * kUnit, &more).code(), StatusCode::kInvalid);
  a->Free(std::vector<uint32_t>{0, 4, 6, 7});  // 7 is no slot's start: skipped
  EXPECT_EQ(a->used(), 0u);
  ASSERT_TRUE(a->Alloc(1, 8 * kUnit, 8 * kUnit, &more).ok());  // one run again
}

// The cap on slots taken at once holds whatever the bytes left.
TEST(StagingArea, SlotCapHolds) {
  auto a = Area(16, 2);
  ASSERT_NE(a, nullptr);
  std::vector<uint32_t> s;
  ASSERT_TRUE(a->Alloc(2, kUnit, kUnit, &s).ok());
  EXPECT_EQ(a->Alloc(1, kUnit, kUnit, &s).code(), StatusCode::kRejected);
  a->Free(s[0]);
  EXPECT_TRUE(a->Alloc(1, kUnit, kUnit, &s).ok());
}

// The budget charges the pages a slot newly holds: a freed slot's pages stay charged and
// a later slot over them charges nothing; past the budget, freed pages are taken back
// (punched out) before an alloc gets Retry.
TEST(StagingArea, BudgetChargesNewPagesAndTakesBackFreedOnes) {
  auto budget = std::make_shared<StagingBudget>(6 * kUnit);
  auto a = Area(8, 1000, budget);
  auto b = Area(8, 1000, budget);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<uint32_t> s;
  ASSERT_TRUE(a->Alloc(1, 4 * kUnit, 4 * kUnit, &s).ok());
  EXPECT_EQ(budget->charged(), 4 * kUnit);
  a->Free(s[0]);
  EXPECT_EQ(a->charged(), 4 * kUnit);  // warm
  s.clear();
  ASSERT_TRUE(a->Alloc(2, kUnit, 2 * kUnit, &s).ok());  // one page each, over warm pages
  EXPECT_EQ(budget->charged(), 4 * kUnit);
  a->Free(s);
  // b needs 4 pages: 2 are left, so a's freed ones are taken back first.
  std::vector<uint32_t> t;
  ASSERT_TRUE(b->Alloc(1, 4 * kUnit, 4 * kUnit, &t).ok());
  EXPECT_GT(budget->taken_back(), 0u);
  EXPECT_LE(budget->charged(), 6 * kUnit);
  // Nothing left to take back: Retry, nothing taken.
  std::vector<uint32_t> u;
  ASSERT_TRUE(b->Alloc(1, 2 * kUnit, 2 * kUnit, &u).ok());
  EXPECT_EQ(b->Alloc(1, kUnit, kUnit, &u).code(), StatusCode::kRetry);
  EXPECT_EQ(u.size(), 1u);
}

}  // namespace
}  // namespace kvtier::daemon
