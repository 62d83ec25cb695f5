// Host slot size classes in the TierManager (tiers/slab_allocator.h): each contract takes
// the smallest class that holds its block, the classes share the host tier's slabs by
// demand, a starved class takes a slab from another by evicting its blocks (dropped, or
// demoted to NVMe first), and a slab with a pinned block never moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <thread>

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

// The policy's shares count blocks the tier holds, not slots of its smallest class: with
// only 1440 KiB blocks the tier holds 180 (4 slabs of 45), not the 452 of 576 KiB. reuse
// with its protected share at one half: 180 blocks read twice fill protected, then 180
// new ones come. Protected gives up blocks down to 90 and the new ones keep the rest;
// sized by the smallest class (target 226) it would never give one up, and every new
// block would push out the one before it.
TEST_F(SlabClassesTest, PolicySharesCountTheBlocksTheTierHolds) {
  opts_.host.policy = PolicyKind::kReuse;
  opts_.host.policy_options.reuse_adapt = false;
  opts_.host.policy_options.reuse_protected_fraction = 0.5;
  Open();
  for (uint64_t i = 0; i < 180; ++i) ASSERT_TRUE(Store(big_, i).ok()) << i;
  ASSERT_EQ(HostBlocks(), 180u);
  ASSERT_EQ(Held(big_, 180).size(), 180u);  // read: now in protected
  for (uint64_t i = 180; i < 360; ++i) ASSERT_TRUE(Store(big_, i).ok()) << i;
  const auto held = Held(big_, 360);
  const size_t old = static_cast<size_t>(std::count_if(held.begin(), held.end(), [](uint64_t i) { return i < 180; }));
  EXPECT_EQ(held.size(), 180u);
  EXPECT_GE(old, 88u);
  EXPECT_LE(old, 92u) << "protected kept " << old << " of 180 blocks at a share of one half";
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

// With quota groups a slab move never takes a block of a group within its share. Group A
// (share 0.5) and group B (no share: always over it) fill slabs 0 and 1 side by side with
// small blocks, B fills slabs 2 and 3 alone; group C's first big block needs a slab. The
// coldest block over a share is B's first, in slab 0, whose move would take half of A's
// blocks: a pure-B slab moves instead, and A keeps all 113.
TEST_F(SlabClassesTest, ASlabMoveNeverTakesABlockOfAGroupWithinItsShare) {
  opts_.groups.resize(4);
  opts_.groups[1].share[1] = 0.5;   // A: small blocks, within its share (64 of 128 MiB)
  opts_.groups[3].share[1] = 0.25;  // C: big blocks, the requester
  auto tm = TierManager::Open(opts_);
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  tm_ = std::move(*tm);
  ScaleContract flood = Model(32);
  flood.model_id = "kvtier/flood";
  ASSERT_TRUE(tm_->RegisterContractAs(small_, small_.Id(), 1).ok());
  ASSERT_TRUE(tm_->RegisterContractAs(flood, flood.Id(), 2).ok());
  ASSERT_TRUE(tm_->RegisterContractAs(big_, big_.Id(), 3).ok());
  for (uint64_t i = 0; i < 113; ++i) {
    ASSERT_TRUE(Store(small_, i).ok()) << i;
    ASSERT_TRUE(Store(flood, i).ok()) << i;
  }
  for (uint64_t i = 113; i < 339; ++i) ASSERT_TRUE(Store(flood, i).ok()) << i;
  ASSERT_EQ(HostBlocks(), 4u * 113);
  ASSERT_TRUE(Store(big_, 0).ok());
  EXPECT_EQ(Held(small_, 113).size(), 113u) << "a slab move took blocks of a group within its share";
  EXPECT_EQ(Held(big_, 1).size(), 1u);
  EXPECT_EQ(HostBlocks(), 3u * 113 + 1);
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

// ---- NVMe record classes (tiers/nvme/nvme_store.h) -----------------------------------------

class NvmeClassesTest : public SlabClassesTest {
 protected:
  void SetUp() override {
    SlabClassesTest::SetUp();
    opts_.slot_classes = {144 * KiB, 576 * KiB, 720 * KiB, 1440 * KiB};  // the default config's
    opts_.nvme.dir = dir_.path() + "/nvme";
    opts_.nvme.queue_depth = 32;
    opts_.nvme.tier.high_watermark = 1.0;  // no background eviction: the test fills it
    opts_.nvme.tier.low_watermark = 1.0;
  }
  TierStats Nvme() {
    for (const auto& s : tm_->Stats()) {
      if (s.tier == Tier::kNvme) return s;
    }
    return {};
  }
  // Which of blocks [0, n) of a contract a lookup finds (and where).
  std::vector<uint64_t> Found(const ScaleContract& c, uint64_t n, Tier in) {
    std::vector<uint64_t> out;
    for (uint64_t i = 0; i < n; ++i) {
      const Key128 k = K(c.geometry.num_layers, i);
      LookupResult r = tm_->Lookup(c.Id(), std::span<const Key128>(&k, 1));
      if (r.hit_blocks == 1 && r.tiers[0] == in) out.push_back(i);
    }
    return out;
  }
  // Acquires each of blocks [0, n) of a contract into host (from wherever it is) and
  // checks its bytes; returns the ones served.
  std::vector<uint64_t> Served(const ScaleContract& c, uint64_t n) {
    std::vector<uint64_t> out;
    for (uint64_t i = 0; i < n; ++i) {
      const Key128 k = K(c.geometry.num_layers, i);
      std::promise<std::pair<Status, std::vector<SlotRef>>> p;
      auto f = p.get_future();
      tm_->Acquire(c.Id(), std::span<const Key128>(&k, 1), Tier::kHost,
                   [&p](Status s, std::vector<SlotRef> v) { p.set_value({s, std::move(v)}); });
      auto [st, slots] = f.get();
      if (!st.ok() || slots.size() != 1) continue;
      EXPECT_TRUE(testing::Matches(Slot(slots[0]), c.block_bytes(), c.geometry.num_layers * 100000 + i)) << i;
      EXPECT_TRUE(tm_->Unpin(slots[0]).ok());
      out.push_back(i);
    }
    return out;
  }
  testing::TempDir dir_;
};

// The default classes with a 576 KiB and a 1440 KiB contract: each block demoted to NVMe
// takes a record of 4 KiB + its class, within 10% of the block plus its header (one record
// size would give the 576 KiB blocks 1444 KiB records: 2.49x).
TEST_F(NvmeClassesTest, EachContractsRecordsPadUnderTenPercent) {
  opts_.nvme.tier.capacity_bytes = 4 * kDefaultSlabBytes;
  Open();
  for (uint64_t i = 0; i < 100; ++i) ASSERT_TRUE(Store(small_, i).ok()) << i;
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  const TierStats a = Nvme();
  ASSERT_EQ(a.blocks, 100u);
  const double small_per_block = static_cast<double>(a.used_bytes) / 100.0;
  for (uint64_t i = 0; i < 40; ++i) ASSERT_TRUE(Store(big_, i).ok()) << i;
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  const TierStats b = Nvme();
  ASSERT_EQ(b.blocks, 140u);
  const double big_per_block = static_cast<double>(b.used_bytes - a.used_bytes) / 40.0;
  std::printf("NVMe bytes a block: 576 KiB contract %.0f KiB, 1440 KiB contract %.0f KiB\n", small_per_block / KiB,
              big_per_block / KiB);
  EXPECT_LE(small_per_block, 1.1 * (576 * KiB + 4096));
  EXPECT_LE(big_per_block, 1.1 * (1440 * KiB + 4096));
  EXPECT_EQ(a.used_bytes, 100 * (576 * KiB + 4096));
  EXPECT_EQ(b.used_bytes, 100 * (576 * KiB + 4096) + 40 * (1440 * KiB + 4096));
  EXPECT_EQ(b.capacity_bytes, 4 * kDefaultSlabBytes);
  for (uint64_t i = 0; i < 100; ++i) {
    auto info = tm_->InspectBlock(small_.Id(), K(32, i));
    ASSERT_TRUE(info.ok());
    EXPECT_TRUE(info->in_nvme);
  }
  VerifyReport rep;
  ASSERT_TRUE(tm_->VerifyNvme(0, 1000, &rep).ok());
  EXPECT_EQ(rep.ok, 140u);
  EXPECT_EQ(rep.corrupt, 0u);
}

// Every block of both classes comes back after a restart, byte-exact; the same folder
// with other slot classes is refused naming both geometries.
TEST_F(NvmeClassesTest, RestartWithMixedClassesServesEveryBlockAndAClassChangeIsRefused) {
  opts_.nvme.tier.capacity_bytes = 4 * kDefaultSlabBytes;
  Open();
  for (uint64_t i = 0; i < 150; ++i) ASSERT_TRUE(Store(small_, i).ok()) << i;
  for (uint64_t i = 0; i < 50; ++i) ASSERT_TRUE(Store(big_, i).ok()) << i;
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  const uint64_t used = Nvme().used_bytes;
  tm_.reset();
  Open();
  EXPECT_EQ(Nvme().blocks, 200u);
  EXPECT_EQ(Nvme().used_bytes, used);
  EXPECT_EQ(Found(small_, 150, Tier::kNvme).size(), 150u);
  EXPECT_EQ(Served(small_, 150).size(), 150u);  // promoted to host, bytes checked
  EXPECT_EQ(Served(big_, 50).size(), 50u);
  tm_.reset();
  TierManagerOptions o = opts_;
  o.slot_classes = {576 * KiB, 1440 * KiB};
  auto bad = TierManager::Open(o);
  ASSERT_FALSE(bad.ok());
  const std::string m = bad.status().message();
  EXPECT_NE(m.find("was made with 4 slabs of 64 MiB (4 a file), records of 148 KiB, 580 KiB, 724 KiB, 1444 KiB"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("the settings give 4 slabs of 64 MiB (4 a file), records of 580 KiB, 1444 KiB"), std::string::npos)
      << m;
}

// A starved record class takes a slab from another: with the NVMe tier full of 576 KiB
// blocks, a 1440 KiB demotion moves the slab of the coldest one to its class; that slab's
// blocks are gone from NVMe (and its index), the rest and the new block are served
// byte-exact, before and after a restart.
TEST_F(NvmeClassesTest, AStarvedClassTakesASlabOnNvme) {
  opts_.nvme.tier.capacity_bytes = 2 * kDefaultSlabBytes;  // 2 slabs: 224 records of 580 KiB
  Open();
  for (uint64_t i = 0; i < 224; ++i) ASSERT_TRUE(Store(small_, i).ok()) << i;
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  ASSERT_EQ(Nvme().blocks, 224u);
  EXPECT_EQ(Nvme().slab_moves, 0u);
  ASSERT_TRUE(Store(big_, 0).ok());
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  EXPECT_EQ(Nvme().slab_moves, 1u);
  EXPECT_EQ(Nvme().blocks, 112u + 1);
  EXPECT_EQ(Found(big_, 1, Tier::kNvme).size(), 1u);
  const auto kept = Found(small_, 224, Tier::kNvme);
  EXPECT_EQ(kept.size(), 112u);
  EXPECT_EQ(Nvme().used_bytes, 112 * (576 * KiB + 4096) + (1440 * KiB + 4096));
  tm_.reset();
  Open();
  EXPECT_EQ(Nvme().blocks, 113u);
  EXPECT_EQ(Found(small_, 224, Tier::kNvme), kept);
  EXPECT_EQ(Served(small_, 224), kept);  // bytes checked
  EXPECT_EQ(Served(big_, 1).size(), 1u);
}

// ---- Classes made at registration (TierManagerOptions::classes_at_registration) --------

// The model shapes kvtier is used with: Llama-3-8B (32 layers), Llama-3-70B (80), Qwen3-8B
// (36), 8 KV heads of 128, in NVFP4, FP8 and BF16 at 16- and 64-token blocks: 576 KiB to
// 20 MiB a block.
std::vector<ScaleContract> ListedShapes() {
  std::vector<ScaleContract> out;
  for (uint32_t layers : {32u, 80u, 36u}) {
    for (KvFormat f : {KvFormat::kNvfp4, KvFormat::kFp8, KvFormat::kBf16}) {
      for (uint32_t tokens : {16u, 64u}) {
        ScaleContract c;
        c.model_id = "kvtier/shape";
        c.format = f;
        c.geometry = Geometry{layers, 8, 128, tokens};
        c.SetUnitScales();
        out.push_back(c);
      }
    }
  }
  return out;
}

// A BF16 contract of 64-token blocks, 8 KV heads of head_dim 128: 256 KiB a layer.
ScaleContract Bf16Block(const char* model_id, uint32_t layers) {
  ScaleContract c;
  c.model_id = model_id;
  c.format = KvFormat::kBf16;
  c.geometry = Geometry{layers, 8, 128, 64};
  c.SetUnitScales();
  return c;
}

class AutoClassesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    opts_.classes_at_registration = true;
    opts_.slot_bytes = 24 * MiB;             // the largest block: 21 slabs of 48 MiB in 1 GiB
    opts_.host.capacity_bytes = 1024 * MiB;
    opts_.host.high_watermark = 1.0;
    opts_.host.low_watermark = 1.0;
    opts_.nvme.dir = dir_.path() + "/nvme";
    opts_.nvme.tier.capacity_bytes = 1024 * MiB;
    opts_.nvme.queue_depth = 32;
    opts_.nvme.tier.high_watermark = 1.0;
    opts_.nvme.tier.low_watermark = 1.0;
  }
  void Open() {
    auto tm = TierManager::Open(opts_);
    ASSERT_TRUE(tm.ok()) << tm.status().ToString();
    tm_ = std::move(*tm);
  }
  static uint64_t Seed(size_t shape, uint64_t i) { return shape * 1000 + i; }
  static Key128 Key(size_t shape, uint64_t i) { return Key128{0xC1A55 + shape, i + 1}; }
  Status Store(const ScaleContract& c, size_t shape, uint64_t i) {
    std::vector<SlotRef> s;
    Status st;
    for (int tries = 0; tries < 200; ++tries) {
      s.clear();
      st = tm_->AllocSlots(c.Id(), 1, Tier::kHost, &s);
      if (st.code() != StatusCode::kRetry) break;
      tm_->Drain();
    }
    if (!st.ok()) return st;
    EXPECT_EQ(tm_->host_slot_ptr(s[0].slot), tm_->host_slot_ptr(0) + uint64_t{s[0].slot} * tm_->host_geometry().granule);
    testing::Fill(tm_->host_slot_ptr(s[0].slot), c.block_bytes(), Seed(shape, i));
    st = tm_->Commit(c.Id(), s[0], Key(shape, i), Key128{});
    return st.ok() ? tm_->Unpin(s[0]) : st;
  }
  // Acquires block i of a shape into host (from wherever it is); false when not served.
  bool Served(const ScaleContract& c, size_t shape, uint64_t i) {
    const Key128 k = Key(shape, i);
    std::promise<std::pair<Status, std::vector<SlotRef>>> p;
    auto f = p.get_future();
    tm_->Acquire(c.Id(), std::span<const Key128>(&k, 1), Tier::kHost,
                 [&p](Status s, std::vector<SlotRef> v) { p.set_value({s, std::move(v)}); });
    auto [st, slots] = f.get();
    if (!st.ok() || slots.size() != 1) return false;
    const bool same = testing::Matches(tm_->host_slot_ptr(slots[0].slot), c.block_bytes(), Seed(shape, i));
    EXPECT_TRUE(same) << "shape " << shape << " block " << i << " bytes differ";
    EXPECT_TRUE(tm_->Unpin(slots[0]).ok());
    return same;
  }
  TierStats Stat(Tier t) {
    for (const auto& s : tm_->Stats()) {
      if (s.tier == t) return s;
    }
    return {};
  }
  testing::TempDir dir_;
  TierManagerOptions opts_;
  std::unique_ptr<TierManager> tm_;
};

// Every listed shape registers on one daemon (a class each, made at registration), their
// blocks are stored mixed, and each tier's slot bytes in use stay within 10% of the blocks'
// own bytes (host: the block rounded to the granule; NVMe: plus the 4 KiB header). After a
// restart (the NVMe classes come from the records on disk, the host's are made again as
// the contracts register, in another order) every block is read back byte-exact.
TEST_F(AutoClassesTest, EveryListedShapeSharesOneDaemonWithinTenPercentAndSurvivesARestart) {
  const std::vector<ScaleContract> shapes = ListedShapes();
  constexpr uint64_t kEach = 2;
  Open();
  EXPECT_EQ(tm_->host_geometry().classes.size(), 0u);
  EXPECT_EQ(tm_->host_geometry().granule, 4096u);
  EXPECT_EQ(tm_->host_geometry().slab_bytes, 48 * MiB);
  uint64_t block_bytes = 0;
  for (size_t j = 0; j < shapes.size(); ++j) {
    ASSERT_TRUE(tm_->RegisterContract(shapes[j]).ok()) << j;
    const SlotFit f = tm_->FitOf(shapes[j].Id());
    ASSERT_GE(f.cls, 0) << j;
    EXPECT_EQ(f.slot_bytes, (shapes[j].slot_bytes() + 4095) / 4096 * 4096) << j;
    EXPECT_EQ(tm_->host_geometry().classes[static_cast<size_t>(f.cls)], f.slot_bytes) << j;
  }
  EXPECT_EQ(tm_->host_geometry().classes.size(), 17u) << "2304 KiB is two shapes' block";
  for (uint64_t i = 0; i < kEach; ++i) {
    for (size_t j = 0; j < shapes.size(); ++j) {
      ASSERT_TRUE(Store(shapes[j], j, i).ok()) << j << " " << i;
      block_bytes += shapes[j].block_bytes();
    }
  }
  const TierStats host = Stat(Tier::kHost);
  ASSERT_EQ(host.blocks, kEach * shapes.size()) << "every block is in host (a slab per class fits)";
  EXPECT_GE(host.used_bytes, block_bytes);
  EXPECT_LE(static_cast<double>(host.used_bytes), 1.10 * static_cast<double>(block_bytes));
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  const TierStats nvme = Stat(Tier::kNvme);
  ASSERT_EQ(nvme.blocks, kEach * shapes.size());
  EXPECT_EQ(nvme.used_bytes, block_bytes + kEach * shapes.size() * 4096);
  EXPECT_LE(static_cast<double>(nvme.used_bytes), 1.10 * static_cast<double>(block_bytes));
  std::printf("%zu shapes x %llu blocks: %.1f MiB of blocks, host slots %.1f MiB, NVMe records %.1f MiB\n",
              shapes.size(), static_cast<unsigned long long>(kEach), static_cast<double>(block_bytes) / MiB,
              static_cast<double>(host.used_bytes) / MiB, static_cast<double>(nvme.used_bytes) / MiB);
  tm_.reset();

  Open();
  EXPECT_EQ(Stat(Tier::kNvme).blocks, kEach * shapes.size());
  EXPECT_EQ(Stat(Tier::kNvme).used_bytes, nvme.used_bytes);
  for (size_t j = shapes.size(); j-- > 0;) ASSERT_TRUE(tm_->RegisterContract(shapes[j]).ok()) << j;  // reversed
  EXPECT_EQ(tm_->host_geometry().classes[0], (shapes.back().slot_bytes() + 4095) / 4096 * 4096);
  for (size_t j = 0; j < shapes.size(); ++j) {
    for (uint64_t i = 0; i < kEach; ++i) EXPECT_TRUE(Served(shapes[j], j, i)) << j << " " << i;
  }
}

// The geometry sessions read (host_geometry(), hbm_geometry()) while registrations add
// classes: every copy is whole (as many sizes as per-slab counts and maxima, each class
// as the tier has it) and grows only, and the final copy has every class, with each
// contract's slot (ContractSlotBytes) among them.
TEST_F(AutoClassesTest, GeometryCopiesStayWholeWhileRegistrationsAddClasses) {
  const std::vector<ScaleContract> shapes = ListedShapes();
  opts_.nvme.tier.capacity_bytes = 0;
  Open();
  std::atomic<bool> done{false};
  std::atomic<uint64_t> copies{0}, bad{0};
  std::thread reader([&] {
    size_t seen = 0;
    while (!done.load()) {
      const HostGeometry g = tm_->host_geometry();
      const bool whole = g.classes.size() == g.per_slab.size() && g.classes.size() == g.most.size() &&
                         g.classes.size() >= seen && g.granule == 4096;
      bool sizes = true;
      for (size_t c = 0; c < g.classes.size(); ++c) {
        sizes = sizes && g.classes[c] % g.granule == 0 && g.per_slab[c] == g.slab_bytes / g.classes[c];
      }
      bad.fetch_add(whole && sizes ? 0 : 1);
      seen = g.classes.size();
      copies.fetch_add(1);
    }
  });
  for (const ScaleContract& c : shapes) ASSERT_TRUE(tm_->RegisterContract(c).ok());
  while (copies.load() < 100) std::this_thread::yield();
  done = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0u) << "of " << copies.load() << " copies";
  const HostGeometry g = tm_->host_geometry();
  EXPECT_EQ(g.classes.size(), 17u);
  for (const ScaleContract& c : shapes) {
    const uint64_t slot = tm_->ContractSlotBytes(c.Id(), Tier::kHost);
    EXPECT_EQ(slot, (c.block_bytes() + 4095) / 4096 * 4096);
    EXPECT_NE(std::find(g.classes.begin(), g.classes.end(), slot), g.classes.end());
    EXPECT_EQ(tm_->ContractSlotBytes(c.Id(), Tier::kHbm), 0u);  // no HBM tier here
  }
  ScaleContract unknown = shapes[0];
  unknown.model_id = "kvtier/unregistered";
  EXPECT_EQ(tm_->ContractSlotBytes(unknown.Id(), Tier::kHost), 0u);
}

// A block up to the limit (tiers.slot_bytes: 64 MiB by default) registers and is stored;
// one byte-of-a-page more is refused with an error that names the limit, and nothing
// changes.
TEST_F(AutoClassesTest, ABlockUpToTheLimitRegistersAndALargerOneIsRefusedByName) {
  opts_.slot_bytes = kDefaultMaxBlockBytes;
  opts_.nvme.tier.capacity_bytes = 0;
  opts_.host.capacity_bytes = 256 * MiB;  // 4 slabs of 64 MiB (too few for 128 MiB ones)
  Open();
  EXPECT_EQ(tm_->host_geometry().slab_bytes, 64 * MiB);
  const ScaleContract top = Bf16Block("kvtier/limit", 256);  // 256 layers of 256 KiB: 64 MiB
  ASSERT_EQ(top.block_bytes(), 64 * MiB);
  ASSERT_TRUE(tm_->RegisterContract(top).ok());
  ASSERT_TRUE(Store(top, 0, 0).ok());
  EXPECT_TRUE(Served(top, 0, 0));
  ScaleContract over = top;
  over.geometry.num_layers = 257;
  over.SetUnitScales();
  const Status st = tm_->RegisterContract(over);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("larger than the largest block this daemon holds (67108864 bytes: tiers.slot_bytes)"),
            std::string::npos)
      << st.ToString();
  EXPECT_FALSE(tm_->HasContract(over.Id()));
  EXPECT_EQ(tm_->host_geometry().classes.size(), 1u);
  TierManagerOptions fixed = opts_;
  fixed.classes_at_registration = false;
  EXPECT_TRUE(tm_->Reconfigure(fixed).IsInvalid()) << "a restart changes how classes are made, not a reload";
}

// An NVMe tier smaller than the limit's record (slot_bytes + 4 KiB) starts: its capacity
// caps the blocks the daemon takes, like a slab does, and the refusal names it. A block
// that fits is stored, flushed to NVMe and read back byte-exact.
TEST_F(AutoClassesTest, AnNvmeTierSmallerThanTheLimitCapsTheBlocksItTakes) {
  opts_.slot_bytes = kDefaultMaxBlockBytes;  // 64 MiB
  opts_.host.capacity_bytes = 256 * MiB;
  opts_.nvme.tier.capacity_bytes = 32 * MiB;
  Open();
  const ScaleContract fits = Bf16Block("kvtier/nvme-cap", 64);  // 64 layers of 256 KiB: 16 MiB
  ASSERT_EQ(fits.block_bytes(), 16 * MiB);
  ASSERT_TRUE(tm_->RegisterContract(fits).ok());
  ASSERT_TRUE(Store(fits, 0, 0).ok());
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  EXPECT_EQ(Stat(Tier::kNvme).blocks, 1u);
  EXPECT_TRUE(Served(fits, 0, 0));
  ScaleContract big = fits;
  big.geometry.num_layers = 160;  // 40 MiB: under tiers.slot_bytes, over the NVMe tier
  big.SetUnitScales();
  const Status st = tm_->RegisterContract(big);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_NE(st.message().find("(33550336 bytes: tiers.slot_bytes, and the NVMe tier's capacity"), std::string::npos)
      << st.ToString();
  EXPECT_FALSE(tm_->HasContract(big.Id()));
}

TEST_F(AutoClassesTest, ListedClassesAreRefusedWithIt) {
  TierManagerOptions o = opts_;
  o.slot_classes = {576 * KiB, 24 * MiB};
  auto both = TierManager::Open(o);
  ASSERT_TRUE(both.status().IsInvalid());
  EXPECT_NE(both.status().message().find("listed and made at registration"), std::string::npos)
      << both.status().ToString();
}

}  // namespace
}  // namespace kvtier::tiers
