// SlabAllocator (tiers/slab_allocator.h): the geometry of slabs and slot ids, slabs taken
// and returned by demand, slab moves between classes, refusals, and a randomized run
// checked against a model of which bytes each slot covers.
#include "tiers/slab_allocator.h"

#include "formats/contract.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace kvtier::tiers {
namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;

SlabAllocator MakeOrDie(uint64_t arena, uint64_t slab, std::vector<uint64_t> sizes) {
  auto a = SlabAllocator::Make("host tier", arena, slab, std::move(sizes));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return a.ok() ? std::move(*a) : SlabAllocator{};
}

// The numbers docs/tiers.md quotes: 64 MiB slabs of 576 KiB and 1440 KiB slots.
TEST(SlabAllocator, GeometryOfTheDefaultSlabs) {
  SlabAllocator a = MakeOrDie(1024 * MiB + 5 * MiB, 64 * MiB, {1440 * KiB, 576 * KiB});
  EXPECT_EQ(a.num_slabs(), 16u);  // the 5 MiB tail holds no slab
  EXPECT_EQ(a.arena_bytes(), 1024 * MiB);
  ASSERT_EQ(a.num_classes(), 2u);
  EXPECT_EQ(a.class_bytes(0), 576 * KiB);  // smallest first
  EXPECT_EQ(a.class_bytes(1), 1440 * KiB);
  EXPECT_EQ(a.largest(), 1440 * KiB);
  EXPECT_EQ(a.slots_per_slab(0), 113u);
  EXPECT_EQ(a.slots_per_slab(1), 45u);
  EXPECT_EQ(64 * MiB - 113 * 576 * KiB, 448 * KiB);   // 0.68% of a slab
  EXPECT_EQ(64 * MiB - 45 * 1440 * KiB, 736 * KiB);   // 1.12%
  EXPECT_EQ(a.granule(), 32 * KiB);  // 1440 KiB = 45 x 32 KiB, 576 KiB = 18 x 32 KiB
  EXPECT_EQ(a.id_space(), 1024 * MiB / (32 * KiB));
  EXPECT_EQ(a.ClassFor(100 * KiB), 0);
  EXPECT_EQ(a.ClassFor(576 * KiB), 0);
  EXPECT_EQ(a.ClassFor(576 * KiB + 1), 1);
  EXPECT_EQ(a.ClassFor(1440 * KiB), 1);
  EXPECT_EQ(a.ClassFor(1440 * KiB + 1), -1);
  EXPECT_EQ(a.free_slabs(), 16u);
  EXPECT_EQ(a.free_count(0), 16u * 113);
  EXPECT_EQ(a.free_count(1), 16u * 45);
}

TEST(SlabAllocator, GranuleIsWhatEverySlotStartsOn) {
  EXPECT_EQ(MakeOrDie(64 * MiB, 64 * MiB, {4 * KiB}).granule(), 4 * KiB);
  EXPECT_EQ(MakeOrDie(64 * MiB, 64 * MiB, {1 * MiB}).granule(), 1 * MiB);
  EXPECT_EQ(MakeOrDie(64 * MiB, 64 * MiB, {16 * MiB, 24 * MiB}).granule(), 8 * MiB);
  EXPECT_EQ(MakeOrDie(64 * MiB, 48 * KiB, {12 * KiB, 8 * KiB}).granule(), 4 * KiB);
}

// One class in one slab: the arena of equal slots, ids 0..n-1, next-fit.
TEST(SlabAllocator, OneSlabOfOneClassIsTheUniformArena) {
  SlabAllocator a = MakeOrDie(8 * 1440 * KiB, 8 * 1440 * KiB, {1440 * KiB});
  EXPECT_EQ(a.granule(), 1440 * KiB);
  EXPECT_EQ(a.id_space(), 8u);
  for (uint32_t i = 0; i < 8; ++i) {
    auto s = a.Alloc(0);
    ASSERT_TRUE(s);
    EXPECT_EQ(*s, i);
    EXPECT_EQ(a.Offset(*s), uint64_t{i} * 1440 * KiB);
  }
  EXPECT_FALSE(a.Alloc(0));
  EXPECT_TRUE(a.Free(5));
  EXPECT_TRUE(a.Free(2));
  auto s = a.Alloc(0);
  ASSERT_TRUE(s);
  EXPECT_EQ(*s, 2u);  // next-fit wraps to the lowest free
}

// A class fills a slab before it takes the next; slots of one slab are neighbours.
TEST(SlabAllocator, SlotsOfASlabAreNeighboursAndInsideIt) {
  SlabAllocator a = MakeOrDie(256 * MiB, 64 * MiB, {1440 * KiB, 576 * KiB});
  std::vector<uint32_t> got;
  for (uint32_t i = 0; i < 45 + 1; ++i) {
    auto s = a.Alloc(1);
    ASSERT_TRUE(s);
    got.push_back(*s);
  }
  for (uint32_t i = 0; i < 45; ++i) {
    EXPECT_EQ(a.Offset(got[i]), uint64_t{i} * 1440 * KiB);
    EXPECT_EQ(a.SlabOf(got[i]), 0u);
    EXPECT_EQ(a.ClassOfSlot(got[i]), 1);
  }
  EXPECT_EQ(a.Offset(got[45]), 64 * MiB);  // the next slab, from its start
  EXPECT_EQ(a.slabs(1), 2u);
  EXPECT_EQ(a.free_slabs(), 2u);
  auto small = a.Alloc(0);
  ASSERT_TRUE(small);
  EXPECT_EQ(a.Offset(*small), 128 * MiB);  // a class of its own slabs
  EXPECT_EQ(a.used(1), 46u);
  EXPECT_EQ(a.used(0), 1u);
  EXPECT_EQ(a.used(), 47u);
  EXPECT_EQ(a.used_bytes(), 46 * 1440 * KiB + 576 * KiB);
  EXPECT_EQ(a.free_count(1), 44u + 1 * 45);  // the room of its open slab and of the free one
  EXPECT_EQ(a.free_count(0), 112u + 1 * 113);
}

// No fixed shares: one class may take the whole arena, and its emptied slabs go back to
// the pool for another.
TEST(SlabAllocator, BytesFollowDemand) {
  SlabAllocator a = MakeOrDie(4 * 64 * MiB, 64 * MiB, {1440 * KiB, 576 * KiB});
  std::vector<uint32_t> small;
  while (auto s = a.Alloc(0)) small.push_back(*s);
  EXPECT_EQ(small.size(), 4u * 113);
  EXPECT_EQ(a.free_slabs(), 0u);
  EXPECT_FALSE(a.Alloc(1));  // nothing for the other class without a move
  EXPECT_EQ(a.free_count(1), 0u);
  // Freeing all of one slab's slots returns it.
  for (uint32_t id : small) {
    if (a.SlabOf(id) == 2) {
      EXPECT_TRUE(a.Free(id));
    }
  }
  EXPECT_EQ(a.free_slabs(), 1u);
  EXPECT_EQ(a.SlabClass(2), -1);
  EXPECT_EQ(a.slabs(0), 3u);
  auto big = a.Alloc(1);
  ASSERT_TRUE(big);
  EXPECT_EQ(a.SlabOf(*big), 2u);
  EXPECT_EQ(a.SlabClass(2), 1);
  // A freed slot of a slab with others taken stays with its class and is handed out next.
  EXPECT_TRUE(a.Free(small[5]));
  EXPECT_EQ(a.free_slabs(), 0u);
  EXPECT_EQ(a.free_count(0), 1u);
  auto again = a.Alloc(0);
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, small[5]);
}

TEST(SlabAllocator, FreeRefusesWhatIsNotATakenSlot) {
  SlabAllocator a = MakeOrDie(128 * MiB, 64 * MiB, {1440 * KiB, 576 * KiB});
  auto s = a.Alloc(1);
  auto t = a.Alloc(1);
  ASSERT_TRUE(s && t);
  EXPECT_FALSE(a.Free(*s + 1));               // inside the slot, not its start
  EXPECT_FALSE(a.Free(a.id_space()));         // past the arena
  EXPECT_FALSE(a.Free(a.id_space() / 2));     // in a free slab
  EXPECT_FALSE(a.IsTaken(*s + 1));
  EXPECT_TRUE(a.Free(*s));
  EXPECT_FALSE(a.Free(*s));                   // twice
  EXPECT_EQ(a.used(1), 1u);
  EXPECT_TRUE(a.IsTaken(*t));
  EXPECT_FALSE(a.IsTaken(*s));
}

// Restore marks given slots taken (a reload from an index): it rebuilds the state Alloc
// made, and refuses what no Alloc could have made, changing nothing.
TEST(SlabAllocator, RestoreRebuildsTakenSlotsAndRefusesWhatDoesNotFit) {
  SlabAllocator a = MakeOrDie(3 * 64 * MiB, 64 * MiB, {1440 * KiB, 576 * KiB});
  std::vector<uint32_t> small, big;
  for (int i = 0; i < 3; ++i) small.push_back(*a.Alloc(0));
  for (int i = 0; i < 2; ++i) big.push_back(*a.Alloc(1));
  (void)a.Free(small[1]);
  SlabAllocator b = MakeOrDie(3 * 64 * MiB, 64 * MiB, {1440 * KiB, 576 * KiB});
  for (uint32_t id : {small[0], small[2]}) ASSERT_TRUE(b.Restore(id, 0).ok());
  for (uint32_t id : big) ASSERT_TRUE(b.Restore(id, 1).ok());
  for (int c : {0, 1}) {
    EXPECT_EQ(b.used(c), a.used(c));
    EXPECT_EQ(b.slabs(c), a.slabs(c));
    EXPECT_EQ(b.free_count(c), a.free_count(c));
  }
  EXPECT_EQ(b.free_slabs(), a.free_slabs());
  EXPECT_EQ(b.ClassOfSlot(small[2]), 0);
  EXPECT_EQ(b.ClassOfSlot(big[1]), 1);
  // Refused, nothing changed:
  const uint32_t used = b.used(), pool = b.free_slabs();
  const uint32_t slab0 = b.SlabOf(small[0]);
  EXPECT_FALSE(b.Restore(small[0], 0).ok());   // a taken slot
  EXPECT_FALSE(b.Restore(small[0] + 1, 0).ok());  // not a slot start (inside slot 0)
  EXPECT_FALSE(b.Restore(small[0], 1).ok());   // a slab of another class
  EXPECT_FALSE(b.Restore(b.SlotId(slab0, 113) , 0).ok());  // past the slab's last slot
  EXPECT_FALSE(b.Restore(b.id_space(), 0).ok());  // past the arena
  EXPECT_FALSE(b.Restore(small[1], 2).ok());   // no such class
  const uint32_t free_slab = 2;
  ASSERT_EQ(b.SlabClass(free_slab), -1);
  // In a free slab: 576 KiB is not a slot start of class 1440 KiB.
  EXPECT_FALSE(b.Restore(static_cast<uint32_t>((free_slab * 64 * MiB + 576 * KiB) / b.granule()), 1).ok());
  EXPECT_EQ(b.SlabClass(free_slab), -1);
  EXPECT_EQ(b.used(), used);
  EXPECT_EQ(b.free_slabs(), pool);
  // The freed slot is free again, and Alloc goes on from the restored state.
  ASSERT_TRUE(b.Restore(small[1], 0).ok());
  EXPECT_EQ(b.used(0), 3u);
  auto n = b.Alloc(0);
  ASSERT_TRUE(n);
  EXPECT_EQ(b.SlabOf(*n), slab0);
  // A slot of a free slab takes that slab for its class.
  ASSERT_TRUE(b.Restore(static_cast<uint32_t>(free_slab * 64 * MiB / b.granule()), 1).ok());
  EXPECT_EQ(b.SlabClass(free_slab), 1);
  EXPECT_EQ(b.free_slabs(), pool - 1);
}

// Layer-major classes (AddClass): one per (size, page bytes), appended, never sharing a
// slab with another geometry; ClassFor and largest() see only Make's sizes; PageOffset
// puts page l of slot j of a slab at l * N * P + j * P from the slab's start.
TEST(SlabAllocator, LayerMajorClassesAreKeyedBySizeAndPage) {
  SlabAllocator a = MakeOrDie(4 * 64 * MiB, 64 * MiB, {576 * KiB, 1440 * KiB});
  auto x = a.AddClass(576 * KiB, 18 * KiB);
  auto y = a.AddClass(576 * KiB, 9 * KiB);
  auto z = a.AddClass(1440 * KiB, 18 * KiB);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok()) << x.status().ToString();
  EXPECT_EQ(*x, 2);
  EXPECT_EQ(*y, 3);
  EXPECT_EQ(*z, 4);
  EXPECT_EQ(*a.AddClass(576 * KiB, 18 * KiB), 2);
  EXPECT_EQ(a.num_classes(), 5u);
  EXPECT_EQ(a.page_bytes(0), 0u);
  EXPECT_EQ(a.page_bytes(*y), 9 * KiB);
  EXPECT_EQ(a.slots_per_slab(*x), 113u);
  EXPECT_EQ(a.slots_per_slab(*z), 45u);
  EXPECT_EQ(a.ClassFor(500 * KiB), 0);
  EXPECT_EQ(a.ClassFor(1000 * KiB), 1);
  EXPECT_EQ(a.largest(), 1440 * KiB);
  EXPECT_EQ(a.granule(), 32 * KiB);
  EXPECT_TRUE(a.AddClass(720 * KiB, 18 * KiB).status().IsInvalid());
  EXPECT_TRUE(a.AddClass(576 * KiB, 0).status().IsInvalid());
  EXPECT_TRUE(a.AddClass(576 * KiB, 8).status().IsInvalid());
  EXPECT_TRUE(a.AddClass(576 * KiB, 577 * KiB).status().IsInvalid());
  auto sx = a.Alloc(*x), sy = a.Alloc(*y), sx2 = a.Alloc(*x);
  ASSERT_TRUE(sx && sy && sx2);
  EXPECT_NE(a.SlabOf(*sx), a.SlabOf(*sy));
  EXPECT_EQ(a.SlabOf(*sx), a.SlabOf(*sx2));
  const uint64_t slab = uint64_t{a.SlabOf(*sx2)} * 64 * MiB, j = (a.Offset(*sx2) - slab) / (576 * KiB);
  EXPECT_EQ(j, 1u);
  EXPECT_EQ(a.PageOffset(*sx2, *x, 0), slab + 18 * KiB);
  EXPECT_EQ(a.PageOffset(*sx2, *x, 31), slab + 31 * 113 * 18 * KiB + 18 * KiB);
  EXPECT_LE(a.PageOffset(*sx2, *x, 31) + 18 * KiB, slab + 64 * MiB);
  for (uint64_t page = 1024; a.num_classes() < kMaxArenaClasses; page += 1024) ASSERT_TRUE(a.AddClass(576 * KiB, page).ok());
  auto over = a.AddClass(1440 * KiB, 4096);
  EXPECT_TRUE(over.status().IsInvalid());
}

TEST(SlabAllocator, MakeRefusesBadGeometry) {
  EXPECT_FALSE(SlabAllocator::Make("t", 64 * MiB, 64 * MiB, {}).ok());
  EXPECT_FALSE(SlabAllocator::Make("t", 64 * MiB, 64 * MiB, {4 * KiB, 8 * KiB, 12 * KiB, 16 * KiB, 20 * KiB}).ok());
  EXPECT_FALSE(SlabAllocator::Make("t", 64 * MiB, 64 * MiB, {1000}).ok());
  EXPECT_FALSE(SlabAllocator::Make("t", 64 * MiB, 64 * MiB, {576 * KiB, 576 * KiB}).ok());
  EXPECT_FALSE(SlabAllocator::Make("t", 64 * MiB, 64 * MiB, {128 * MiB}).ok());
  EXPECT_FALSE(SlabAllocator::Make("t", 64 * MiB, 1000, {4 * KiB}).ok());
  EXPECT_FALSE(SlabAllocator::Make("t", 64 * MiB, 0, {4 * KiB}).ok());
  auto none = SlabAllocator::Make("host tier", 32 * MiB, 64 * MiB, {576 * KiB});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().ToString().find("host tier"), std::string::npos) << none.status().ToString();
}

// A move stops allocation from the slab; the Free of its last slot hands it to the taker.
TEST(SlabAllocator, AMovedSlabGoesToTheTakerWhenItsSlotsAreFreed) {
  SlabAllocator a = MakeOrDie(2 * 64 * MiB, 64 * MiB, {1440 * KiB, 576 * KiB});
  std::vector<uint32_t> big;
  while (auto s = a.Alloc(1)) big.push_back(*s);
  ASSERT_EQ(big.size(), 90u);
  ASSERT_TRUE(a.Free(big[3]));  // a hole in slab 0
  EXPECT_FALSE(a.Alloc(0));
  auto moving = a.BeginMove(0, 0);
  ASSERT_TRUE(moving.ok()) << moving.status().ToString();
  EXPECT_EQ(moving->size(), 44u);
  EXPECT_TRUE(a.Draining(0));
  EXPECT_EQ(a.free_count(1), 0u);  // the hole is not handed out any more
  EXPECT_FALSE(a.Alloc(1));
  EXPECT_FALSE(a.BeginMove(0, 0).ok());  // already moving
  EXPECT_FALSE(a.BeginMove(1, 1).ok());  // its own class
  for (size_t i = 0; i + 1 < moving->size(); ++i) {
    ASSERT_TRUE(a.Free((*moving)[i]));
    EXPECT_EQ(a.SlabClass(0), 1);
  }
  EXPECT_FALSE(a.Alloc(0));
  ASSERT_TRUE(a.Free(moving->back()));
  EXPECT_EQ(a.SlabClass(0), 0);
  EXPECT_FALSE(a.Draining(0));
  EXPECT_EQ(a.free_slabs(), 0u);  // to the taker, not the pool
  EXPECT_EQ(a.slabs(0), 1u);
  EXPECT_EQ(a.slabs(1), 1u);
  EXPECT_EQ(a.free_count(0), 113u);
  auto s = a.Alloc(0);
  ASSERT_TRUE(s);
  EXPECT_EQ(a.Offset(*s), 0u);
}

TEST(SlabAllocator, ACancelledMoveLeavesTheSlabWithItsClass) {
  SlabAllocator a = MakeOrDie(64 * MiB, 64 * MiB, {1440 * KiB, 576 * KiB});
  auto x = a.Alloc(1);
  auto y = a.Alloc(1);
  ASSERT_TRUE(x && y);
  auto moving = a.BeginMove(0, 0);
  ASSERT_TRUE(moving.ok());
  EXPECT_EQ(moving->size(), 2u);
  ASSERT_TRUE(a.Free(*x));
  a.CancelMove(0);
  EXPECT_FALSE(a.Draining(0));
  EXPECT_EQ(a.SlabClass(0), 1);
  EXPECT_EQ(a.free_count(1), 44u);
  auto z = a.Alloc(1);
  ASSERT_TRUE(z);
  EXPECT_EQ(a.SlabOf(*z), 0u);  // handed out from the slab again
  EXPECT_NE(*z, *y);
  // Moving to the pool (-1) frees the slab for anyone.
  ASSERT_TRUE(a.BeginMove(0, -1).ok());
  ASSERT_TRUE(a.Free(*y));
  ASSERT_TRUE(a.Free(*z));
  EXPECT_EQ(a.free_slabs(), 1u);
  EXPECT_EQ(a.SlabClass(0), -1);
}

// Random allocs, frees, moves and cancels over three classes, against a model: no two
// taken slots share a byte, every slot lies inside one slab of its class, and the counts
// match the model.
TEST(SlabAllocator, RandomRunKeepsSlotsApart) {
  const std::vector<uint64_t> sizes = {576 * KiB, 1440 * KiB, 8 * MiB};
  SlabAllocator a = MakeOrDie(8 * 64 * MiB, 64 * MiB, sizes);
  std::mt19937_64 rng(7);
  std::map<uint32_t, int> taken;  // id -> class
  for (int step = 0; step < 20000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5) {
      const int c = static_cast<int>(rng() % 3);
      const uint32_t before = a.free_count(c);
      auto s = a.Alloc(c);
      ASSERT_EQ(s.has_value(), before > 0) << step;
      if (s) {
        ASSERT_EQ(taken.count(*s), 0u);
        taken[*s] = c;
      }
    } else if (op < 9 && !taken.empty()) {
      auto it = taken.begin();
      std::advance(it, static_cast<long>(rng() % taken.size()));
      ASSERT_TRUE(a.Free(it->first));
      taken.erase(it);
    } else {
      const uint32_t slab = static_cast<uint32_t>(rng() % a.num_slabs());
      const int to = static_cast<int>(rng() % 4) - 1;
      if (a.Draining(slab)) {
        a.CancelMove(slab);
      } else if (a.SlabClass(slab) >= 0 && a.SlabClass(slab) != to) {
        auto moving = a.BeginMove(slab, to);
        ASSERT_TRUE(moving.ok());
        for (uint32_t id : *moving) ASSERT_EQ(taken.count(id), 1u);
      }
    }
    if (step % 500 != 0) continue;
    uint64_t end = 0;
    uint32_t per[3] = {};
    for (const auto& [id, c] : taken) {
      ASSERT_EQ(a.ClassOfSlot(id), c);
      const uint64_t off = a.Offset(id);
      ASSERT_GE(off, end) << "slots overlap";
      end = off + sizes[static_cast<size_t>(c)];
      ASSERT_EQ(a.SlabOf(id), (end - 1) / (64 * MiB)) << "slot crosses its slab";
      ++per[c];
    }
    for (int c = 0; c < 3; ++c) ASSERT_EQ(a.used(c), per[c]);
    uint32_t owned = a.free_slabs();
    for (int c = 0; c < 3; ++c) owned += a.slabs(c);
    ASSERT_EQ(owned, a.num_slabs());
  }
}

}  // namespace
}  // namespace kvtier::tiers

namespace kvtier::tiers {
namespace {

// The granule of an arena whose classes are made at registration: 4 KiB x 2^k, the
// smallest with at most 4 Mi slot ids, at most 64 KiB; from the arena's size alone.
TEST(SlabAllocatorAuto, GranuleFollowsTheArenaSize) {
  constexpr uint64_t GiB = 1024 * MiB;
  EXPECT_EQ(AutoGranule(64 * MiB), 4 * KiB);
  EXPECT_EQ(AutoGranule(2 * GiB), 4 * KiB);
  EXPECT_EQ(AutoGranule(16 * GiB), 4 * KiB);   // exactly 4 Mi ids
  EXPECT_EQ(AutoGranule(17 * GiB), 8 * KiB);
  EXPECT_EQ(AutoGranule(100 * GiB), 32 * KiB);
  EXPECT_EQ(AutoGranule(128 * GiB), 32 * KiB);  // exactly 4 Mi ids
  EXPECT_EQ(AutoGranule(256 * GiB), 64 * KiB);
  EXPECT_EQ(AutoGranule(4096 * GiB), 64 * KiB);  // capped: more ids rather than more rounding
  for (uint64_t a = 64 * MiB; a <= 256 * GiB; a = a * 3 / 2) {
    const uint64_t g = AutoGranule(a);
    EXPECT_LE(a / g, kMaxGranuleIds) << a;
    EXPECT_TRUE(g == 4 * KiB || a / (g / 2) > kMaxGranuleIds) << "not the smallest for " << a;
  }
}

TEST(SlabAllocatorAuto, SlabHoldsTheLargestBlock) {
  constexpr uint64_t GiB = 1024 * MiB;
  EXPECT_EQ(AutoSlabBytes(256 * MiB, 64 * MiB, 4 * KiB), 64 * MiB);
  EXPECT_EQ(AutoSlabBytes(512 * MiB, 64 * MiB, 4 * KiB), 128 * MiB);
  EXPECT_EQ(AutoSlabBytes(2 * GiB, 64 * MiB, 4 * KiB), 128 * MiB);
  EXPECT_EQ(AutoSlabBytes(4 * GiB, 64 * MiB, 4 * KiB), 256 * MiB);
  EXPECT_EQ(AutoSlabBytes(4 * GiB, 64 * MiB + 4 * KiB, 4 * KiB), 128 * MiB + 8 * KiB) << "an NVMe record's";
  EXPECT_EQ(AutoSlabBytes(100 * GiB, 64 * MiB, 32 * KiB), 256 * MiB);
  EXPECT_EQ(AutoSlabBytes(32 * MiB, 64 * MiB, 4 * KiB), 32 * MiB) << "a small arena is one slab";
  EXPECT_EQ(AutoSlabBytes(2 * GiB, 10 * MiB + 1, 64 * KiB), 4 * (10 * MiB + 64 * KiB)) << "rounded up to the granule";
  for (uint64_t a : {64 * MiB, 1 * GiB, 3 * GiB, 4 * GiB, 64 * GiB}) {
    const uint64_t g = AutoGranule(a), s = AutoSlabBytes(a, 64 * MiB, g);
    EXPECT_EQ(s % g, 0u) << a;
    EXPECT_GE(s, 64 * MiB) << a;
    EXPECT_GE(a / s, 1u) << a;
  }
}

// Classes made at registration: any granule multiple up to a slab, the same size reused,
// indexes stable, the granule never changes, refusals that change nothing.
TEST(SlabAllocatorAuto, ClassesAreMadeAsContractsRegister) {
  auto made = SlabAllocator::MakeOnGranule("host tier", 8 * 64 * MiB, 64 * MiB, 64 * KiB);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  SlabAllocator a = std::move(*made);
  EXPECT_EQ(a.num_classes(), 0u);
  EXPECT_EQ(a.ClassFor(4096), -1);
  EXPECT_EQ(a.largest(), 0u);
  EXPECT_EQ(a.id_space(), 8u * 1024);
  auto x = a.AddClass(2304 * KiB), y = a.AddClass(704 * KiB), z = a.AddClass(20 * MiB);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok()) << x.status().ToString();
  EXPECT_EQ(*x, 0);
  EXPECT_EQ(*y, 1);
  EXPECT_EQ(*z, 2);
  EXPECT_EQ(*a.AddClass(704 * KiB), 1) << "an existing class of that size is reused";
  EXPECT_EQ(a.granule(), 64 * KiB);
  EXPECT_EQ(a.slots_per_slab(*y), 93u);
  EXPECT_EQ(a.slots_per_slab(*z), 3u);
  EXPECT_EQ(a.ClassFor(600 * KiB), 1);
  EXPECT_EQ(a.ClassOfBytes(2304 * KiB), 0);
  EXPECT_EQ(a.ClassOfBytes(2240 * KiB), -1);
  EXPECT_EQ(a.largest(), 20 * MiB);
  EXPECT_TRUE(a.AddClass(700 * KiB).status().IsInvalid()) << "not a granule multiple";
  EXPECT_TRUE(a.AddClass(0).status().IsInvalid());
  EXPECT_TRUE(a.AddClass(64 * MiB + 64 * KiB).status().IsInvalid()) << "larger than a slab";
  EXPECT_TRUE(a.AddClass(64 * MiB).ok()) << "a block of a whole slab";
  EXPECT_EQ(a.num_classes(), 4u);
  // Slots of the new classes are granule-aligned slots inside their slabs.
  auto s1 = a.Alloc(*y), s2 = a.Alloc(*z), s3 = a.Alloc(*z);
  ASSERT_TRUE(s1 && s2 && s3);
  EXPECT_NE(a.SlabOf(*s1), a.SlabOf(*s2));
  EXPECT_EQ(a.Offset(*s3) - a.Offset(*s2), 20 * MiB);
  // Layer-major classes take a size of a class made here as well.
  EXPECT_TRUE(a.AddClass(704 * KiB, 18 * KiB).ok());
  EXPECT_TRUE(a.AddClass(768 * KiB, 18 * KiB).status().IsInvalid());
  // Up to kMaxArenaClasses, then a refusal that says so.
  for (uint64_t b = 64 * KiB; a.num_classes() < kMaxArenaClasses; b += 64 * KiB) ASSERT_TRUE(a.AddClass(b).ok()) << b;
  const size_t n = a.num_classes();
  auto over = a.AddClass(63 * MiB);
  ASSERT_TRUE(over.status().IsInvalid());
  EXPECT_NE(over.status().message().find(std::to_string(kMaxArenaClasses) + " slot classes already"), std::string::npos)
      << over.status().ToString();
  EXPECT_EQ(a.num_classes(), n);
  EXPECT_TRUE(a.AddClass(704 * KiB).ok()) << "an existing size is still served past the limit";
}

TEST(SlabAllocatorAuto, MakeOnGranuleRefusesBadGeometry) {
  EXPECT_FALSE(SlabAllocator::MakeOnGranule("t", 64 * MiB, 64 * MiB, 12 * KiB).ok()) << "not 4 KiB x 2^k";
  EXPECT_FALSE(SlabAllocator::MakeOnGranule("t", 64 * MiB, 64 * MiB, 2 * KiB).ok());
  EXPECT_FALSE(SlabAllocator::MakeOnGranule("t", 64 * MiB, 64 * MiB + 4 * KiB, 64 * KiB).ok()) << "slab not granules";
  EXPECT_FALSE(SlabAllocator::MakeOnGranule("t", 32 * MiB, 64 * MiB, 64 * KiB).ok()) << "no slab";
  EXPECT_FALSE(SlabAllocator::MakeOnGranule("t", 64 * MiB, 64 * MiB, 64 * KiB, {100 * KiB}).ok());
  EXPECT_FALSE(SlabAllocator::MakeOnGranule("t", 64 * MiB, 64 * MiB, 64 * KiB, {128 * KiB, 128 * KiB}).ok());
  auto ok = SlabAllocator::MakeOnGranule("t", 64 * MiB, 64 * MiB, 64 * KiB, {1 * MiB, 128 * KiB});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->class_bytes(0), 128 * KiB);
}

// A restart re-makes the classes of the known contracts in whatever order they come; the
// slots on disk are restored by the class of their size, not by a class index.
TEST(SlabAllocatorAuto, RestoreAfterClassesAreMadeInAnotherOrder) {
  auto before = SlabAllocator::MakeOnGranule("t", 4 * 64 * MiB, 64 * MiB, 64 * KiB);
  ASSERT_TRUE(before.ok());
  const int a1 = *before->AddClass(704 * KiB), b1 = *before->AddClass(5 * MiB);
  std::vector<std::pair<uint32_t, uint64_t>> taken;  // slot id, its class bytes
  for (int i = 0; i < 100; ++i) taken.emplace_back(*before->Alloc(a1), 704 * KiB);
  for (int i = 0; i < 15; ++i) taken.emplace_back(*before->Alloc(b1), 5 * MiB);
  auto after = SlabAllocator::MakeOnGranule("t", 4 * 64 * MiB, 64 * MiB, 64 * KiB);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after->AddClass(5 * MiB), 0);
  EXPECT_EQ(*after->AddClass(704 * KiB), 1);
  for (const auto& [id, bytes] : taken) {
    ASSERT_TRUE(after->Restore(id, after->ClassOfBytes(bytes)).ok()) << id;
    EXPECT_EQ(after->ClassOfSlot(id), after->ClassOfBytes(bytes));
  }
  EXPECT_EQ(after->used_bytes(), before->used_bytes());
  EXPECT_TRUE(after->Restore(taken[0].first, after->ClassOfBytes(5 * MiB)).IsInvalid()) << "a slab of another class";
}

// The model shapes kvtier is used with (Llama-3-8B: 32 layers, Llama-3-70B: 80, Qwen3-8B:
// 36; 8 KV heads of 128) in NVFP4, FP8 and BF16 at 16- and 64-token blocks, all in one
// arena whose classes are made as they register: the bytes of the slabs they take against
// the blocks' own bytes stay within 10% for each shape and for all, at the granule and slab
// size of an arena of each size (host and HBM), and for NVMe records (a 4 KiB header + the
// block rounded to 4 KiB, in slabs that hold the largest record).
std::vector<uint64_t> ListedBlockBytes() {
  std::vector<uint64_t> out;
  for (uint32_t layers : {32u, 80u, 36u}) {
    for (KvFormat f : {KvFormat::kNvfp4, KvFormat::kFp8, KvFormat::kBf16}) {
      for (uint32_t tokens : {16u, 64u}) {
        ScaleContract c;
        c.model_id = "kvtier/shape";
        c.format = f;
        c.geometry = Geometry{layers, 8, 128, tokens};
        c.SetUnitScales();
        EXPECT_TRUE(c.Validate().ok());
        out.push_back(c.block_bytes());
      }
    }
  }
  return out;
}

TEST(SlabAllocatorAuto, ListedModelShapesWasteAtMostTenPercent) {
  constexpr uint64_t GiB = 1024 * MiB;
  const std::vector<uint64_t> blocks = ListedBlockBytes();
  ASSERT_EQ(blocks.size(), 18u);
  EXPECT_EQ(*std::min_element(blocks.begin(), blocks.end()), 576 * KiB);
  EXPECT_EQ(*std::max_element(blocks.begin(), blocks.end()), 20 * MiB);
  struct Arena {
    const char* what;
    uint64_t bytes, granule, slab, header;
  };
  std::vector<Arena> arenas;
  for (uint64_t bytes : {256 * MiB, 2 * GiB, 8 * GiB, 100 * GiB, 512 * GiB}) {
    const uint64_t g = AutoGranule(bytes);
    arenas.push_back({"host/hbm", bytes, g, AutoSlabBytes(bytes, kDefaultMaxBlockBytes, g), 0});
  }
  for (uint64_t bytes : {1 * GiB, 64 * GiB, 2048 * GiB}) {
    arenas.push_back({"nvme", bytes, 4 * KiB, AutoSlabBytes(bytes, kDefaultMaxBlockBytes + 4 * KiB, 4 * KiB), 4 * KiB});
  }
  for (const Arena& ar : arenas) {
    SCOPED_TRACE(std::string(ar.what) + " arena of " + std::to_string(ar.bytes >> 20) + " MiB, granule " +
                 std::to_string(ar.granule) + ", slab " + std::to_string(ar.slab));
    // The granule and slab are the arena's; the allocator gets slabs enough for two of
    // each shape (the slab count changes no slab's waste).
    auto made = SlabAllocator::MakeOnGranule(ar.what, 2 * blocks.size() * ar.slab, ar.slab, ar.granule);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    SlabAllocator a = std::move(*made);
    std::vector<int> cls;
    for (uint64_t b : blocks) {
      const uint64_t slot = (ar.header + b + ar.granule - 1) / ar.granule * ar.granule;
      auto c = a.AddClass(slot);
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      cls.push_back(*c);
    }
    // Each shape alone: its slots in a slab against the slab.
    for (size_t i = 0; i < blocks.size(); ++i) {
      EXPECT_LE(static_cast<double>(a.slab_bytes()),
                1.10 * static_cast<double>(uint64_t{a.slots_per_slab(cls[i])} * blocks[i]))
          << "block of " << blocks[i] << " B";
    }
    // All mixed: blocks of every shape, interleaved, until each class (two shapes may
    // share one: 2304 KiB is 32 layers of 64-token NVFP4 and 36 of 16-token BF16) fills
    // two slabs; the slabs taken against the blocks stored.
    std::map<int, uint64_t> want;  // class -> slots to take
    for (size_t i = 0; i < blocks.size(); ++i) want[cls[i]] = 2 * uint64_t{a.slots_per_slab(cls[i])};
    uint64_t all_blocks = 0;
    for (bool more = true; more;) {
      more = false;
      for (size_t i = 0; i < blocks.size(); ++i) {
        if (want[cls[i]] == 0) continue;
        ASSERT_TRUE(a.Alloc(cls[i]).has_value());
        --want[cls[i]];
        all_blocks += blocks[i];
        more = true;
      }
    }
    uint64_t all_slabs = 0;
    for (const auto& [c, left] : want) {
      EXPECT_EQ(a.slabs(c), 2u) << a.class_bytes(c);
      all_slabs += uint64_t{a.slabs(c)} * a.slab_bytes();
    }
    EXPECT_EQ(a.free_slabs(), a.num_slabs() - 2 * want.size());
    EXPECT_LE(static_cast<double>(all_slabs), 1.10 * static_cast<double>(all_blocks));
  }
}

}  // namespace
}  // namespace kvtier::tiers
