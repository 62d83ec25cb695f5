// SlabAllocator (tiers/slab_allocator.h): the geometry of slabs and slot ids, slabs taken
// and returned by demand, slab moves between classes, refusals, and a randomized run
// checked against a model of which bytes each slot covers.
#include "tiers/slab_allocator.h"

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
