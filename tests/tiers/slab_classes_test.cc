// Host slot size classes in the TierManager (tiers/slab_allocator.h): each contract takes
// the smallest class that holds its block, the classes share the host tier's slabs by
// demand, a starved class takes a slab from another by evicting its blocks (dropped, or
// demoted to NVMe first), and a slab with a pinned block never moves.
#include <gtest/gtest.h>

#include <future>
#include <map>

#include "tests/tiers/test_util.h"
#include "tiers/tier_manager.h"

namespace kvtier::tiers {
namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;

ScaleContract Model(uint32_t layers) {
  ScaleContract c;
  c.model_id = "kvtier/fit";
  c.geometry = Geometry{layers, 8, 128, 16};  // NVFP4: 18 KiB a layer
  c.SetUnitScales();
  return c;
}

Key128 K(uint64_t model, uint64_t i) { return Key128{model, i + 1}; }

class SlabClassesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    opts_.slot_bytes = 1440 * KiB;
    opts_.slot_classes = {576 * KiB, 1440 * KiB};
    opts_.slab_bytes = 64 * MiB;
    opts_.host.capacity_bytes = 4 * 64 * MiB;  // 4 slabs
    opts_.host.high_watermark = 1.0;            // no background demotion: the test moves
    opts_.host.low_watermark = 1.0;
  }
  void Open() {
    auto tm = TierManager::Open(opts_);
    ASSERT_TRUE(tm.ok()) << tm.status().ToString();
    tm_ = std::move(*tm);
    ASSERT_TRUE(tm_->RegisterContract(small_).ok());
    ASSERT_TRUE(tm_->RegisterContract(big_).ok());
  }
  // The daemon's writable address of a host slot: slot s at s * granule.
  uint8_t* Slot(SlotRef r) {
    uint8_t* p = tm_->host_slot_ptr(r.slot);
    EXPECT_EQ(p, tm_->host_slot_ptr(0) + uint64_t{r.slot} * tm_->host_geometry().granule);
    return p;
  }
  // Block i of a contract: key K(layers, i), bytes pattern layers * 100000 + i.
  Status Store(const ScaleContract& c, uint64_t i, bool unpin = true, SlotRef* held = nullptr) {
    std::vector<SlotRef> s;
    Status st;
    for (int tries = 0; tries < 200; ++tries) {
      s.clear();
      st = tm_->AllocSlots(c.Id(), 1, Tier::kHost, &s);
      if (st.code() != StatusCode::kRetry) break;
      tm_->Drain();
    }
    if (!st.ok()) return st;
    testing::Fill(Slot(s[0]), c.block_bytes(), c.geometry.num_layers * 100000 + i);
    st = tm_->Commit(c.Id(), s[0], K(c.geometry.num_layers, i), Key128{});
    if (!st.ok()) return st;
    if (held) *held = s[0];
    return unpin ? tm_->Unpin(s[0]) : Status::Ok();
  }
  // Which of blocks [0, n) of a contract the host tier holds; each one's bytes checked.
  std::vector<uint64_t> Held(const ScaleContract& c, uint64_t n) {
    std::vector<uint64_t> out;
    for (uint64_t i = 0; i < n; ++i) {
      const Key128 k = K(c.geometry.num_layers, i);
      LookupResult r = tm_->Lookup(c.Id(), std::span<const Key128>(&k, 1));
      if (r.hit_blocks == 0 || r.tiers[0] != Tier::kHost) continue;
      std::promise<std::pair<Status, std::vector<SlotRef>>> p;
      auto f = p.get_future();
      tm_->Acquire(c.Id(), std::span<const Key128>(&k, 1), Tier::kHost,
                   [&p](Status s, std::vector<SlotRef> v) { p.set_value({s, std::move(v)}); });
      auto [st, slots] = f.get();
      EXPECT_TRUE(st.ok()) << st.ToString();
      if (slots.size() != 1) continue;
      EXPECT_TRUE(testing::Matches(Slot(slots[0]), c.block_bytes(), c.geometry.num_layers * 100000 + i)) << i;
      EXPECT_TRUE(tm_->Unpin(slots[0]).ok());
      out.push_back(i);
    }
    return out;
  }
  uint64_t HostBlocks() {
    for (const auto& s : tm_->Stats()) {
      if (s.tier == Tier::kHost) return s.blocks;
    }
    return 0;
  }

  TierManagerOptions opts_;
  const ScaleContract small_ = Model(32);  // Llama-3-8B-shaped: 576 KiB blocks
  const ScaleContract big_ = Model(80);    // 1440 KiB
  std::unique_ptr<TierManager> tm_;
};

TEST_F(SlabClassesTest, EachContractTakesTheSmallestClassThatHoldsIt) {
  Open();
  ASSERT_EQ(small_.block_bytes(), 576 * KiB);
  ASSERT_EQ(big_.block_bytes(), 1440 * KiB);
  const HostGeometry& g = tm_->host_geometry();
  EXPECT_EQ(g.granule, 32 * KiB);
  EXPECT_EQ(g.num_slabs, 4u);
  EXPECT_EQ(g.classes, (std::vector<uint64_t>{576 * KiB, 1440 * KiB}));
  EXPECT_EQ(g.per_slab, (std::vector<uint32_t>{113, 45}));
  SlotFit f = tm_->Fit(small_);
  EXPECT_EQ(f.cls, 0);
  EXPECT_EQ(f.slot_bytes, 576 * KiB);
  EXPECT_DOUBLE_EQ(f.fill, 1.0);
  f = tm_->Fit(big_);
  EXPECT_EQ(f.cls, 1);
  EXPECT_DOUBLE_EQ(f.fill, 1.0);
  f = tm_->Fit(Model(20));  // 360 KiB in 576 KiB
  EXPECT_EQ(f.slot_bytes, 576 * KiB);
  EXPECT_DOUBLE_EQ(f.fill, 360.0 / 576.0);
  EXPECT_EQ(tm_->Fit(Model(100)).cls, -1);
  Status s = tm_->RegisterContract(Model(100));
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  std::vector<SlotRef> a, b;
  ASSERT_TRUE(tm_->AllocSlots(small_.Id(), 4, Tier::kHost, &a).ok());
  ASSERT_TRUE(tm_->AllocSlots(big_.Id(), 4, Tier::kHost, &b).ok());
  for (const auto& r : a) EXPECT_EQ(tm_->HostSlotClass(r.slot), 0);
  for (const auto& r : b) EXPECT_EQ(tm_->HostSlotClass(r.slot), 1);
  for (const auto& r : a) ASSERT_TRUE(tm_->FreeSlot(r).ok());
  for (const auto& r : b) ASSERT_TRUE(tm_->FreeSlot(r).ok());
  // Options that name classes without slot_bytes as the largest, or a slab smaller than a
  // slot, are refused.
  TierManagerOptions o = opts_;
  o.slot_classes = {576 * KiB, 1024 * KiB};
  EXPECT_FALSE(TierManager::Open(o).ok());
  o = opts_;
  o.slab_bytes = 1024 * KiB;
  EXPECT_FALSE(TierManager::Open(o).ok());
}

// One class alone takes every slab; a second class, starving, takes slabs from it by
// evicting the first class's coldest blocks, and both keep what they hold intact.
TEST_F(SlabClassesTest, ClassesShareTheTierByDemand) {
  Open();
  for (uint64_t i = 0; i < 600; ++i) ASSERT_TRUE(Store(small_, i).ok()) << i;
  EXPECT_EQ(HostBlocks(), 4u * 113);  // the whole tier: 2.48x the 182 slots of 1440 KiB
  // The big class holds no slab: the slab of the coldest small block moves to it.
  for (uint64_t i = 0; i < 45; ++i) ASSERT_TRUE(Store(big_, i).ok()) << i;
  EXPECT_EQ(HostBlocks(), 3u * 113 + 45);
  // Its slab is full and the tier's coldest blocks are small ones: it evicts within its
  // class 45 times in a row (a slab's worth), then the next slab moves.
  for (uint64_t i = 45; i < 90; ++i) ASSERT_TRUE(Store(big_, i).ok()) << i;
  EXPECT_EQ(HostBlocks(), 2u * 113 + 46);
  EXPECT_EQ(Held(big_, 90), [] {
    std::vector<uint64_t> v;
    for (uint64_t i = 44; i < 90; ++i) v.push_back(i);
    return v;
  }());
  const auto small = Held(small_, 600);
  ASSERT_EQ(small.size(), 2u * 113);
  EXPECT_GT(small.front(), 148u);  // 148, the coldest when the slabs moved, went with them
  // Now the big blocks are the coldest (the small ones were read last): the big class
  // fills its two slabs, then evicts within itself.
  for (uint64_t i = 90; i < 200; ++i) ASSERT_TRUE(Store(big_, i).ok()) << i;
  EXPECT_EQ(Held(big_, 200).size(), 90u);
  EXPECT_EQ(Held(small_, 600).size(), 2u * 113);
  EXPECT_EQ(HostBlocks(), 2u * 113 + 90);
}

// The watermarks count each class against what it holds and could take without a move: a
// class over its high watermark evicts its own blocks down to the low one (dropped here:
// no NVMe), never another class's.
TEST_F(SlabClassesTest, AClassOverItsWatermarkEvictsOnlyItsOwnBlocks) {
  opts_.host.high_watermark = 0.95;
  opts_.host.low_watermark = 0.85;
  Open();
  // 40 of the big class's 45 slots: under its high watermark (42.75).
  for (uint64_t i = 0; i < 40; ++i) ASSERT_TRUE(Store(big_, i).ok()) << i;
  // The small class may hold the other 3 slabs: 339 slots, high at 322, low at 288.
  for (uint64_t i = 0; i < 330; ++i) ASSERT_TRUE(Store(small_, i).ok()) << i;
  tm_->Drain();
  EXPECT_EQ(Held(big_, 40).size(), 40u);
  const size_t small = Held(small_, 330).size();
  EXPECT_LE(small, 322u);
  EXPECT_GE(small, 288u - 1);
}

// A slab holding a pinned block never moves: with every small block pinned, the big class
// gets no slot, and every pinned block stays as it was.
TEST_F(SlabClassesTest, ASlabWithAPinnedBlockNeverMoves) {
  Open();
  std::vector<SlotRef> pinned;
  for (uint64_t i = 0; i < 4 * 113; ++i) {
    SlotRef r;
    ASSERT_TRUE(Store(small_, i, /*unpin=*/false, &r).ok()) << i;
    pinned.push_back(r);
  }
  std::vector<SlotRef> s;
  Status st = tm_->AllocSlots(big_.Id(), 1, Tier::kHost, &s);
  EXPECT_EQ(st.code(), StatusCode::kRetry) << st.ToString();
  for (uint64_t i = 0; i < pinned.size(); ++i) {
    ASSERT_TRUE(testing::Matches(Slot(pinned[i]), small_.block_bytes(), 32 * 100000 + i)) << i;
  }
  // One slab's pins go: that slab (its blocks unpinned) moves; the others stay pinned.
  for (uint64_t i = 0; i < 113; ++i) ASSERT_TRUE(tm_->Unpin(pinned[i]).ok());
  ASSERT_TRUE(Store(big_, 0).ok());
  EXPECT_EQ(HostBlocks(), 3u * 113 + 1);
  for (uint64_t i = 113; i < pinned.size(); ++i) {
    ASSERT_TRUE(testing::Matches(Slot(pinned[i]), small_.block_bytes(), 32 * 100000 + i)) << i;
    ASSERT_TRUE(tm_->Unpin(pinned[i]).ok());
  }
}

// With NVMe below, a moving slab's blocks are demoted before the slab changes class: the
// alloc waits (Retry) for the writes, then succeeds, and the demoted blocks are served
// from NVMe.
TEST_F(SlabClassesTest, AMovingSlabDemotesItsBlocksToNvme) {
  testing::TempDir dir;
  opts_.nvme.tier.capacity_bytes = 256 * (1440 * KiB + 4096);
  opts_.nvme.dir = dir.path() + "/nvme";
  opts_.nvme.queue_depth = 32;
  Open();
  for (uint64_t i = 0; i < 4 * 113; ++i) ASSERT_TRUE(Store(small_, i).ok()) << i;
  ASSERT_TRUE(Store(big_, 0).ok());  // after a Retry or more: the slab's blocks went to NVMe
  tm_->Drain();
  EXPECT_EQ(HostBlocks(), 3u * 113 + 1);
  uint64_t on_nvme = 0;
  for (uint64_t i = 0; i < 4 * 113; ++i) {
    const Key128 k = K(32, i);
    LookupResult r = tm_->Lookup(small_.Id(), std::span<const Key128>(&k, 1));
    ASSERT_EQ(r.hit_blocks, 1u) << "block " << i << " was lost";
    on_nvme += r.tiers[0] == Tier::kNvme ? 1 : 0;
  }
  EXPECT_EQ(on_nvme, 113u);
  EXPECT_EQ(Held(small_, 4 * 113).size(), 3u * 113);
}

}  // namespace
}  // namespace kvtier::tiers
