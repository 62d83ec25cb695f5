// SlotAllocator: next-fit over a hierarchical bitmap, checked against a plain model.
#include "tiers/slot_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <vector>

namespace kvtier::tiers {
namespace {

// The model: the lowest free id at or after the cursor, else the lowest free id.
struct Model {
  std::vector<bool> taken;
  uint32_t cursor = 0;
  explicit Model(uint32_t n) : taken(n, false) {}
  std::optional<uint32_t> Alloc() {
    const uint32_t n = static_cast<uint32_t>(taken.size());
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t id = (cursor + k) % n;
      if (!taken[id]) {
        taken[id] = true;
        cursor = id + 1 < n ? id + 1 : 0;
        return id;
      }
    }
    return std::nullopt;
  }
};

TEST(SlotAllocator, FreshArenaGivesAscendingIdsThenRefuses) {
  SlotAllocator a(130);
  for (uint32_t i = 0; i < 130; ++i) {
    auto s = a.Alloc();
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(*s, i);
  }
  EXPECT_FALSE(a.Alloc().has_value());
  EXPECT_EQ(a.used(), 130u);
  EXPECT_EQ(a.free_count(), 0u);
}

TEST(SlotAllocator, DoubleFreeAndUnknownIdsAreRefused) {
  SlotAllocator a(10);
  EXPECT_FALSE(a.Free(3));  // never allocated
  auto s = a.Alloc();
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(a.Free(*s));
  EXPECT_FALSE(a.Free(*s));
  EXPECT_FALSE(a.Free(10));
  EXPECT_FALSE(a.Free(0xffffffffu));
  EXPECT_EQ(a.used(), 0u);
}

// After scattered frees, a run of allocations continues from the cursor in ascending
// order (what makes a restore's HBM slots neighbours) and wraps to the lowest free id.
TEST(SlotAllocator, NextFitContinuesFromTheCursorAndWraps) {
  SlotAllocator a(300);
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(a.Alloc().has_value());
  for (uint32_t id : {5u, 7u, 150u, 151u}) ASSERT_TRUE(a.Free(id));
  // cursor at 200: 200..299 come first, ascending, then the holes from the lowest.
  for (uint32_t i = 200; i < 300; ++i) EXPECT_EQ(a.Alloc(), std::optional<uint32_t>(i));
  EXPECT_EQ(a.Alloc(), std::optional<uint32_t>(5));
  EXPECT_EQ(a.Alloc(), std::optional<uint32_t>(7));
  EXPECT_EQ(a.Alloc(), std::optional<uint32_t>(150));
  EXPECT_EQ(a.Alloc(), std::optional<uint32_t>(151));
  EXPECT_FALSE(a.Alloc().has_value());
}

// Random alloc/free against the model, on sizes that cross the bitmap's level boundaries
// (64, 4096, 262144 bits).
TEST(SlotAllocator, MatchesTheModelOnRandomTraces) {
  std::mt19937_64 rng(20261129);
  for (uint32_t n : {1u, 63u, 64u, 65u, 4095u, 4096u, 4097u, 70000u, 262145u}) {
    SlotAllocator a(n);
    Model m(n);
    std::vector<uint32_t> live;
    const int steps = n > 10000 ? 60000 : 20000;
    for (int step = 0; step < steps; ++step) {
      const bool alloc = live.empty() || (rng() % 100) < 55;
      if (alloc) {
        auto got = a.Alloc();
        auto want = m.Alloc();
        ASSERT_EQ(got, want) << "n=" << n << " step " << step;
        if (got) live.push_back(*got);
      } else {
        const size_t k = rng() % live.size();
        const uint32_t id = live[k];
        live[k] = live.back();
        live.pop_back();
        ASSERT_TRUE(a.Free(id));
        m.taken[id] = false;
      }
      ASSERT_EQ(a.used(), live.size());
    }
    for (uint32_t id = 0; id < n; ++id) ASSERT_EQ(a.IsTaken(id), static_cast<bool>(m.taken[id])) << id;
  }
}

TEST(SlotAllocator, ResetTakenRebuildsTheFreeSet) {
  SlotAllocator a;
  a.ResetTaken(100, {0, 1, 2, 50, 99, 1000 /* out of range: ignored */, 50 /* twice */});
  EXPECT_EQ(a.used(), 5u);
  std::set<uint32_t> got;
  while (auto s = a.Alloc()) got.insert(*s);
  EXPECT_EQ(got.size(), 95u);
  for (uint32_t id : {0u, 1u, 2u, 50u, 99u}) EXPECT_EQ(got.count(id), 0u);
}

}  // namespace
}  // namespace kvtier::tiers
