// The TierManager on this CPU machine: host tier (memfd arena, mapped here the way a client
// maps it) + NVMe tier (real io_uring, real RocksDB in a temp folder). No mocks.
#include "tiers/tier_manager.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <random>
#include <thread>
#include <tuple>

#include "formats/contract.h"
#include "tests/tiers/test_util.h"
#include "tiers/block_index.h"
#include "tiers/nvme/nvme_store.h"
#include "tiers/policy/policy.h"

namespace kvtier::tiers {
namespace {

using testing::K;

ScaleContract SmallContract() {
  ScaleContract c;
  c.model_id = "test/model";
  c.geometry = Geometry{8, 8, 128, 16};  // 147456-byte NVFP4 blocks
  c.SetUnitScales();
  return c;
}

class TierManagerTest : public ::testing::TestWithParam<PolicyKind> {
 protected:
  void SetUp() override {
    contract_ = SmallContract();
    ASSERT_TRUE(contract_.Validate().ok());
    cid_ = contract_.Id();
    slot_ = contract_.slot_bytes();
    opts_.slot_bytes = slot_;
    opts_.host.capacity_bytes = 8 * slot_;
    opts_.host.high_watermark = 0.75;
    opts_.host.low_watermark = 0.5;
    opts_.host.policy = GetParam();
    opts_.nvme.tier.capacity_bytes = 64 * (slot_ + 4096);
    opts_.nvme.tier.policy = GetParam();
    opts_.nvme.dir = dir_.path() + "/nvme";
    opts_.nvme.queue_depth = 32;
  }
  void TearDown() override { Close(); }

  void OpenTm() {
    auto tm = TierManager::Open(opts_);
    ASSERT_TRUE(tm.ok()) << tm.status().ToString();
    tm_ = std::move(tm.value());
    ASSERT_TRUE(tm_->RegisterContract(contract_).ok());
    arena_ = tm_->host_slot_ptr(0);  // the daemon side of the arena: writable in this process only
    ASSERT_NE(arena_, nullptr);
  }
  void Close() {
    arena_ = nullptr;
    tm_.reset();
  }
  uint8_t* Slot(SlotRef r) { return arena_ + uint64_t{r.slot} * slot_; }
  uint64_t Bytes() const { return contract_.block_bytes(); }

  // Stores block i (key K(i), parent K(i-1), bytes pattern i) in the host tier and unpins it.
  // AllocSlots, retrying while the tier is busy demoting (Retry), as a client does.
  Status Alloc(uint32_t n, std::vector<SlotRef>* s) {
    Status st;
    for (int tries = 0; tries < 200; ++tries) {
      s->clear();
      st = tm_->AllocSlots(cid_, n, Tier::kHost, s);
      if (st.code() != StatusCode::kRetry) break;
      tm_->Drain();
    }
    return st;
  }
  void Store(uint64_t i, bool unpin = true) {
    std::vector<SlotRef> s;
    Status st = Alloc(1, &s);
    ASSERT_TRUE(st.ok()) << st.ToString();
    testing::Fill(Slot(s[0]), Bytes(), i);
    ASSERT_TRUE(tm_->Commit(cid_, s[0], K(i), i == 0 ? Key128{} : K(i - 1)).ok());
    if (unpin) {
      ASSERT_TRUE(tm_->Unpin(s[0]).ok());
    }
  }
  std::vector<Key128> Keys(uint64_t from, uint64_t to) {
    std::vector<Key128> k;
    for (uint64_t i = from; i < to; ++i) k.push_back(K(i));
    return k;
  }
  std::pair<Status, std::vector<SlotRef>> AcquireSync(const std::vector<Key128>& keys, Tier t = Tier::kHost) {
    std::promise<std::pair<Status, std::vector<SlotRef>>> p;
    auto f = p.get_future();
    tm_->Acquire(cid_, keys, t, [&p](Status s, std::vector<SlotRef> v) { p.set_value({s, std::move(v)}); });
    return f.get();
  }
  TierStats StatsOf(Tier t) {
    for (auto& s : tm_->Stats())
      if (s.tier == t) return s;
    return {};
  }
  // Acquires keys [from, to) in host in small groups and checks every byte.
  void CheckAll(uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; i += 3) {
      auto keys = Keys(i, std::min(to, i + 3));
      auto [st, slots] = AcquireSync(keys);
      ASSERT_TRUE(st.ok()) << st.ToString();
      ASSERT_EQ(slots.size(), keys.size()) << "blocks from " << i;
      for (size_t k = 0; k < slots.size(); ++k) {
        EXPECT_TRUE(testing::Matches(Slot(slots[k]), Bytes(), i + k)) << "block " << i + k;
        ASSERT_TRUE(tm_->Unpin(slots[k]).ok());
      }
      tm_->Drain();
    }
  }

  testing::TempDir dir_;
  ScaleContract contract_;
  uint64_t cid_ = 0, slot_ = 0;
  TierManagerOptions opts_;
  std::unique_ptr<TierManager> tm_;
  uint8_t* arena_ = nullptr;
};

TEST_P(TierManagerTest, StoreLookupAcquire) {
  OpenTm();
  EXPECT_TRUE(tm_->has_tier(Tier::kHost));
  EXPECT_TRUE(tm_->has_tier(Tier::kNvme));
  for (uint64_t i = 0; i < 4; ++i) Store(i);
  auto keys = Keys(0, 6);
  LookupResult r = tm_->Lookup(cid_, keys);
  EXPECT_EQ(r.hit_blocks, 4u);
  for (Tier t : r.tiers) EXPECT_EQ(t, Tier::kHost);
  EXPECT_EQ(tm_->Lookup(cid_ + 1, keys).hit_blocks, 0u);  // unknown contract: a miss
  auto [st, slots] = AcquireSync(keys);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(slots.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(testing::Matches(Slot(slots[i]), Bytes(), i));
  EXPECT_EQ(StatsOf(Tier::kHost).pinned, 4u);
  for (auto s : slots) ASSERT_TRUE(tm_->Unpin(s).ok());
  EXPECT_EQ(StatsOf(Tier::kHost).pinned, 0u);
}

// More blocks than the host tier holds: the watermark demotes to NVMe, everything stays
// findable, and every block comes back byte-exact (NVMe -> host by io_uring).
TEST_P(TierManagerTest, WatermarksDemoteToNvmeAndRestoreExactly) {
  OpenTm();
  for (uint64_t i = 0; i < 24; ++i) Store(i);
  tm_->Drain();
  TierStats host = StatsOf(Tier::kHost);
  EXPECT_LE(host.slots_used, 6u) << "above the high watermark after draining";
  EXPECT_GT(host.demotions_out, 0u);
  EXPECT_EQ(host.evictions_dropped, 0u);
  LookupResult r = tm_->Lookup(cid_, Keys(0, 24));
  EXPECT_EQ(r.hit_blocks, 24u);
  CheckAll(0, 24);
  EXPECT_GT(StatsOf(Tier::kHost).promotions_in, 0u);
}

TEST_P(TierManagerTest, PinnedBlocksAreNeverEvicted) {
  OpenTm();
  std::vector<SlotRef> pinned;
  for (uint64_t i = 0; i < 8; ++i) Store(i, /*unpin=*/false);
  tm_->Drain();
  EXPECT_EQ(StatsOf(Tier::kHost).slots_used, 8u);  // over the watermark, all pinned: stays
  std::vector<SlotRef> s;
  EXPECT_EQ(tm_->AllocSlots(cid_, 1, Tier::kHost, &s).code(), StatusCode::kRetry);
  EXPECT_TRUE(s.empty());
  auto [st, slots] = AcquireSync(Keys(0, 8));
  ASSERT_EQ(slots.size(), 8u);
  for (size_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(testing::Matches(Slot(slots[i]), Bytes(), i));
    ASSERT_TRUE(tm_->Unpin(slots[i]).ok());  // the acquire's pin
    ASSERT_TRUE(tm_->Unpin(slots[i]).ok());  // the commit's pin
  }
  EXPECT_TRUE(tm_->Unpin(slots[0]).IsInvalid());  // no pin left
  tm_->Drain();
  EXPECT_LE(StatsOf(Tier::kHost).slots_used, 6u);
}

TEST_P(TierManagerTest, WarmRestartFindsEveryCommittedBlockAndNoUncommittedOne) {
  OpenTm();
  for (uint64_t i = 0; i < 10; ++i) Store(i);
  // Two slots written but never committed (the engine died between write and commit).
  std::vector<SlotRef> loose;
  ASSERT_TRUE(Alloc(2, &loose).ok());
  testing::Fill(Slot(loose[0]), Bytes(), 100);
  testing::Fill(Slot(loose[1]), Bytes(), 101);
  ASSERT_TRUE(tm_->Flush().ok());
  EXPECT_EQ(StatsOf(Tier::kNvme).blocks, 10u);
  Close();
  OpenTm();
  LookupResult r = tm_->Lookup(cid_, Keys(0, 10));
  EXPECT_EQ(r.hit_blocks, 10u);
  for (Tier t : r.tiers) EXPECT_EQ(t, Tier::kNvme);
  EXPECT_EQ(tm_->Lookup(cid_, std::vector<Key128>{K(100)}).hit_blocks, 0u);
  EXPECT_EQ(tm_->Lookup(cid_, std::vector<Key128>{K(101)}).hit_blocks, 0u);
  CheckAll(0, 10);
}

TEST_P(TierManagerTest, FlippedRecordOnDiskIsAMissAndCounted) {
  OpenTm();
  for (uint64_t i = 0; i < 5; ++i) Store(i);
  ASSERT_TRUE(tm_->Flush().ok());
  Close();
  {  // flip one payload byte of block 2, as a bad disk would
    NvmeStoreOptions no;
    no.dir = opts_.nvme.dir;
    no.slot_bytes = slot_;
    no.capacity_bytes = opts_.nvme.tier.capacity_bytes;
    auto s = NvmeStore::Open(no);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    uint32_t file;
    uint64_t off;
    (*s)->RecordLocation((*s)->Find(BlockId{cid_, K(2)})->record, &file, &off);
    std::string path = (*s)->DataPath(file);
    s->reset();
    int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b;
    ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(off + 4096 + 12345)), 1);
    b ^= 0xFF;
    ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(off + 4096 + 12345)), 1);
    close(fd);
  }
  OpenTm();
  EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 5)).hit_blocks, 5u);  // not yet read: not yet known bad
  auto [st, slots] = AcquireSync(Keys(0, 5));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(slots.size(), 2u) << "the prefix must stop at the corrupt block";
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(testing::Matches(Slot(slots[i]), Bytes(), i));
    ASSERT_TRUE(tm_->Unpin(slots[i]).ok());
  }
  EXPECT_EQ(StatsOf(Tier::kNvme).checksum_failures, 1u);
  EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 5)).hit_blocks, 2u);
}

TEST_P(TierManagerTest, ConcurrentAcquiresShareOnePromotion) {
  OpenTm();
  for (uint64_t i = 0; i < 4; ++i) Store(i);
  ASSERT_TRUE(tm_->Flush().ok());
  EXPECT_EQ(StatsOf(Tier::kHost).slots_used, 0u);
  const uint64_t before = StatsOf(Tier::kHost).promotions_in;
  std::promise<std::vector<SlotRef>> p1, p2;
  auto keys = Keys(0, 4);
  tm_->Acquire(cid_, keys, Tier::kHost, [&](Status, std::vector<SlotRef> v) { p1.set_value(v); });
  tm_->Acquire(cid_, keys, Tier::kHost, [&](Status, std::vector<SlotRef> v) { p2.set_value(v); });
  auto a = p1.get_future().get(), b = p2.get_future().get();
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(a[i].slot, b[i].slot);
    EXPECT_TRUE(testing::Matches(Slot(a[i]), Bytes(), i));
  }
  EXPECT_EQ(StatsOf(Tier::kHost).promotions_in - before, 4u);  // one read per block, not two
  EXPECT_EQ(StatsOf(Tier::kHost).slots_used, 4u);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(tm_->Unpin(a[i]).ok());
    ASSERT_TRUE(tm_->Unpin(b[i]).ok());
  }
}

TEST_P(TierManagerTest, SecondHitAdmission) {
  opts_.nvme.admission = Admission::kSecondHit;
  OpenTm();
  // Blocks 0..3 are used twice (commit + acquire) before pressure; 10..29 once.
  for (uint64_t i = 0; i < 4; ++i) Store(i);
  auto [st, slots] = AcquireSync(Keys(0, 4));
  ASSERT_EQ(slots.size(), 4u);
  for (auto s : slots) ASSERT_TRUE(tm_->Unpin(s).ok());
  for (uint64_t i = 10; i < 30; ++i) Store(i);
  tm_->Drain();
  for (uint64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(tm_->Lookup(cid_, std::vector<Key128>{K(i)}).hit_blocks, 1u) << "reused block " << i << " lost";
  }
  EXPECT_GT(StatsOf(Tier::kNvme).admission_rejects, 0u);
  uint64_t on_nvme = 0;
  for (uint64_t i = 10; i < 30; ++i) {
    LookupResult r = tm_->Lookup(cid_, std::vector<Key128>{K(i)});
    on_nvme += r.hit_blocks == 1 && r.tiers[0] == Tier::kNvme;
  }
  EXPECT_EQ(on_nvme, 0u) << "single-use blocks must not be written to NVMe";
}

TEST_P(TierManagerTest, DailyWriteBudgetCapsNvmeWrites) {
  opts_.nvme.daily_write_budget_bytes = 3 * (slot_ + 4096);
  OpenTm();
  for (uint64_t i = 0; i < 20; ++i) Store(i);
  tm_->Drain();
  TierStats nv = StatsOf(Tier::kNvme);
  EXPECT_EQ(nv.blocks, 3u);
  EXPECT_LE(nv.bytes_written, opts_.nvme.daily_write_budget_bytes);
  EXPECT_GT(nv.admission_rejects, 0u);
}

TEST_P(TierManagerTest, DropTierNeverWritesNvme) {
  opts_.host.on_evict = OnEvict::kDrop;
  OpenTm();
  for (uint64_t i = 0; i < 20; ++i) Store(i);
  tm_->Drain();
  EXPECT_EQ(StatsOf(Tier::kNvme).blocks, 0u);
  EXPECT_GT(StatsOf(Tier::kHost).evictions_dropped, 0u);
  EXPECT_LE(StatsOf(Tier::kHost).slots_used, 6u);
}

// Several threads acquire overlapping prefixes from a host tier too small for all of them
// while another flushes and evicts: every block handed out has exactly its bytes, nothing
// hangs, and no pin is left behind.
TEST_P(TierManagerTest, ConcurrentAcquireFlushEvictStress) {
  OpenTm();
  for (uint64_t i = 0; i < 16; ++i) Store(i);
  std::atomic<int> bad{0}, served{0};
  std::atomic<bool> stop{false};
  auto worker = [&](int seed) {
    std::mt19937 rng(static_cast<unsigned>(seed));
    for (int it = 0; it < 150; ++it) {
      const uint64_t start = rng() % 13;
      auto keys = Keys(start, start + 3);
      auto [st, slots] = AcquireSync(keys);
      if (!st.ok()) ++bad;
      for (size_t k = 0; k < slots.size(); ++k) {
        if (slots[k].tier != Tier::kHost || !testing::Matches(Slot(slots[k]), Bytes(), start + k)) ++bad;
        ++served;
      }
      for (auto s : slots) {
        if (!tm_->Unpin(s).ok()) ++bad;
      }
    }
  };
  std::thread operator_thread([&] {
    std::mt19937 rng(99);
    while (!stop.load()) {
      (void)tm_->Flush();
      Status e = tm_->Evict(cid_, K(14));  // acquired by some workers: pinned (Rejected) or gone
      if (!e.ok() && e.code() != StatusCode::kRejected && !e.IsNotFound()) ++bad;
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 5));
    }
  });
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) ts.emplace_back(worker, t + 1);
  for (auto& t : ts) t.join();
  stop = true;
  operator_thread.join();
  tm_->Drain();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_GT(served.load(), 4 * 150);
  EXPECT_EQ(StatsOf(Tier::kHost).pinned, 0u);
  EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 14)).hit_blocks, 14u);
}

// Making room for one block of a prefix must not evict another block of the same prefix
// (here the coldest host block, a drop tier, is exactly the second block of the acquire).
TEST_P(TierManagerTest, RoomForOneBlockNeverEvictsAnotherOfTheSamePrefix) {
  opts_.host.on_evict = OnEvict::kDrop;
  opts_.host.high_watermark = 1.0;
  opts_.host.low_watermark = 0.99;
  OpenTm();
  Store(0);
  ASSERT_TRUE(tm_->Flush().ok());  // block 0: NVMe only
  Store(1);                        // block 1: host only, the coldest host block
  for (uint64_t i = 100; i < 107; ++i) Store(i);
  ASSERT_EQ(StatsOf(Tier::kHost).slots_used, 8u);
  auto [st, slots] = AcquireSync(Keys(0, 2));
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(slots.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(testing::Matches(Slot(slots[i]), Bytes(), i));
    ASSERT_TRUE(tm_->Unpin(slots[i]).ok());
  }
}

TEST_P(TierManagerTest, RepeatedKeysInOneAcquire) {
  OpenTm();
  for (uint64_t i = 0; i < 2; ++i) Store(i);
  ASSERT_TRUE(tm_->Flush().ok());  // both on NVMe only: the repeats share one promotion
  std::vector<Key128> keys = {K(0), K(0), K(1)};
  auto [st, slots] = AcquireSync(keys);
  ASSERT_TRUE(st.ok());
  ASSERT_EQ(slots.size(), 3u);
  EXPECT_EQ(slots[0].slot, slots[1].slot);
  EXPECT_TRUE(testing::Matches(Slot(slots[0]), Bytes(), 0));
  EXPECT_TRUE(testing::Matches(Slot(slots[2]), Bytes(), 1));
  for (auto x : slots) ASSERT_TRUE(tm_->Unpin(x).ok());
  EXPECT_TRUE(tm_->Unpin(slots[0]).IsInvalid());
  EXPECT_EQ(StatsOf(Tier::kHost).pinned, 0u);
}

// Blocks already in the target tier: the answer comes inline, on the caller's thread,
// before Acquire returns, with no TierManager lock held (the callback calls back in).
// Blocks that must move still complete on the mover.
TEST_P(TierManagerTest, ResidentAcquireAnswersInlineAndMovingOneOnTheMover) {
  OpenTm();
  for (uint64_t i = 0; i < 3; ++i) Store(i);
  const auto caller = std::this_thread::get_id();
  bool ran = false;
  std::thread::id where;
  std::vector<SlotRef> got;
  std::vector<Key128> keys = {K(0), K(1), K(1), K(2)};  // a repeat: held and pinned twice
  tm_->Acquire(cid_, keys, Tier::kHost, [&](Status s, std::vector<SlotRef> v) {
    EXPECT_TRUE(s.ok()) << s.ToString();
    where = std::this_thread::get_id();
    EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 3)).hit_blocks, 3u);  // would deadlock under mu_
    got = std::move(v);
    ran = true;
  });
  ASSERT_TRUE(ran) << "an acquire with nothing to move must answer before Acquire returns";
  EXPECT_EQ(where, caller);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[1].slot, got[2].slot);
  for (const SlotRef& x : got) EXPECT_EQ(x.from, Tier::kHost) << "already in host";
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(testing::Matches(Slot(got[i]), Bytes(), i == 0 ? 0 : i == 3 ? 2 : 1));
  }
  EXPECT_EQ(StatsOf(Tier::kHost).pinned, 3u);
  for (auto x : got) ASSERT_TRUE(tm_->Unpin(x).ok());
  EXPECT_EQ(StatsOf(Tier::kHost).pinned, 0u);
  EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 3)).hit_blocks, 3u);  // the held blocks were not erased

  // A miss is answered inline too (nothing to move), with no slots.
  ran = false;
  tm_->Acquire(cid_, Keys(50, 52), Tier::kHost, [&](Status s, std::vector<SlotRef> v) {
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE(v.empty());
    ran = true;
  });
  EXPECT_TRUE(ran);

  // On NVMe only: the promotion runs on the mover, and so does the answer.
  ASSERT_TRUE(tm_->Flush().ok());
  std::promise<std::pair<std::thread::id, std::vector<SlotRef>>> p;
  auto f = p.get_future();
  tm_->Acquire(cid_, Keys(0, 2), Tier::kHost, [&](Status, std::vector<SlotRef> v) {
    p.set_value({std::this_thread::get_id(), std::move(v)});
  });
  auto [tid, slots] = f.get();
  EXPECT_NE(tid, caller);
  ASSERT_EQ(slots.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(slots[i].from, Tier::kNvme) << "the acquire says where it promoted block " << i << " from";
    EXPECT_EQ(slots[i].tier, Tier::kHost);
    EXPECT_TRUE(testing::Matches(Slot(slots[i]), Bytes(), i));
    ASSERT_TRUE(tm_->Unpin(slots[i]).ok());
  }
}

// The block index hashes (contract, key) to 64 bits (tiers/block_index.h), so ids of
// different contracts or keys can share a hash; each must still find only its own block,
// by Lookup and by LookupInto.
TEST_P(TierManagerTest, BlockIndexCollisionsNeverMixBlocks) {
  // With the index's seed known, keys whose low half is the seed collide (the product in
  // the hash is zero) whatever their high half and contract.
  constexpr uint64_t kSeed = 0x5eed5eed12345678ull;
  opts_.index_seed = kSeed;
  OpenTm();
  ScaleContract other = SmallContract();
  other.model_id = "test/other-model";
  ASSERT_TRUE(tm_->RegisterContract(other).ok());
  const uint64_t cid2 = other.Id();
  ASSERT_NE(cid2, cid_);
  const Key128 a{K(1).hi, kSeed};
  const Key128 b{a.hi ^ 0x77, kSeed};  // other contract, same hash
  const Key128 c{a.hi ^ 1, kSeed};     // same contract, same hash
  ASSERT_EQ(BlockIndexHashOf({cid_, a}, kSeed), BlockIndexHashOf({cid2, b}, kSeed));
  ASSERT_EQ(BlockIndexHashOf({cid_, a}, kSeed), BlockIndexHashOf({cid_, c}, kSeed));
  // ... and under another seed they do not: the collisions are the seed's, not the keys'.
  EXPECT_NE(BlockIndexHashOf({cid_, a}, kSeed + 1), BlockIndexHashOf({cid_, c}, kSeed + 1));
  auto store = [&](uint64_t cid, const Key128& k, uint64_t seed) {
    std::vector<SlotRef> s;
    ASSERT_TRUE(tm_->AllocSlots(cid, 1, Tier::kHost, &s).ok());
    testing::Fill(Slot(s[0]), Bytes(), seed);
    ASSERT_TRUE(tm_->Commit(cid, s[0], k, Key128{}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  };
  auto hits = [&](uint64_t cid, const Key128& k) { return tm_->Lookup(cid, std::vector<Key128>{k}).hit_blocks; };

  store(cid_, a, 10);
  EXPECT_EQ(hits(cid_, a), 1u);
  EXPECT_EQ(hits(cid2, b), 0u);
  EXPECT_EQ(hits(cid_, c), 0u);
  EXPECT_EQ(hits(cid2, a), 0u);

  store(cid2, b, 20);
  store(cid_, c, 30);
  EXPECT_EQ(hits(cid_, a), 1u);
  EXPECT_EQ(hits(cid2, b), 1u);
  EXPECT_EQ(hits(cid_, c), 1u);
  EXPECT_EQ(hits(cid2, a), 0u);
  EXPECT_EQ(hits(cid2, c), 0u);
  EXPECT_EQ(hits(cid_, b), 0u);

  // Evicting one leaves the others, and each one's bytes are its own.
  ASSERT_TRUE(tm_->Evict(cid_, a).ok());
  EXPECT_EQ(hits(cid_, a), 0u);
  const std::vector<Key128> prefix{c, a};
  Tier out[3] = {Tier::kNone, Tier::kNone, Tier::kNone};
  double est = -1;
  EXPECT_EQ(tm_->LookupInto(cid_, prefix, out, &est), 1u);
  EXPECT_EQ(out[0], Tier::kHost);
  EXPECT_EQ(out[1], Tier::kNone);  // past the hits: left as it was
  EXPECT_GT(est, 0.0);
  EXPECT_EQ(tm_->LookupInto(cid2, std::vector<Key128>{b, c}, out, &est), 1u);
  for (auto [cid, k, seed] : {std::tuple{cid2, b, 20}, std::tuple{cid_, c, 30}}) {
    std::promise<std::vector<SlotRef>> p;
    auto f = p.get_future();
    tm_->Acquire(cid, std::vector<Key128>{k}, Tier::kHost, [&p](Status, std::vector<SlotRef> v) { p.set_value(v); });
    auto slots = f.get();
    ASSERT_EQ(slots.size(), 1u);
    EXPECT_TRUE(testing::Matches(Slot(slots[0]), Bytes(), seed)) << "block of seed " << seed;
    ASSERT_TRUE(tm_->Unpin(slots[0]).ok());
  }
}

// View reads every fact a request needs about a contract in one call, equal to the calls
// it replaces; UnpinAll and FreeSlots release many slots in steps, trying every one.
TEST_P(TierManagerTest, ViewAndReleaseInSteps) {
  OpenTm();
  const ContractView none = tm_->View(cid_ + 1);
  EXPECT_FALSE(none.registered);
  EXPECT_EQ(none.block_bytes, 0u);
  const ContractView v = tm_->View(cid_);
  EXPECT_TRUE(v.registered);
  EXPECT_EQ(v.block_bytes, tm_->block_bytes(cid_));
  EXPECT_EQ(v.host_slot_bytes, tm_->ContractSlotBytes(cid_, Tier::kHost));
  EXPECT_EQ(v.hbm_slot_bytes, tm_->ContractSlotBytes(cid_, Tier::kHbm));
  EXPECT_EQ(v.fit.cls, tm_->FitOf(cid_).cls);
  EXPECT_EQ(v.fit.slot_bytes, tm_->FitOf(cid_).slot_bytes);
  // One block named 600 times: 600 pins, released in steps of kReleaseStep.
  Store(0);
  auto [st, slots] = AcquireSync(std::vector<Key128>(600, K(0)));
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(slots.size(), 600u);
  EXPECT_EQ(StatsOf(Tier::kHost).pinned, 1u);
  size_t failed = 9;
  EXPECT_TRUE(tm_->UnpinAll(slots, &failed).ok());
  EXPECT_EQ(failed, 0u);
  EXPECT_EQ(StatsOf(Tier::kHost).pinned, 0u);
  // Past the last pin every unpin fails; each is tried and counted.
  EXPECT_FALSE(tm_->UnpinAll(std::span<const SlotRef>(slots).first(3), &failed).ok());
  EXPECT_EQ(failed, 3u);
  std::vector<SlotRef> fresh;
  ASSERT_TRUE(Alloc(3, &fresh).ok());
  EXPECT_TRUE(tm_->FreeSlots(fresh, &failed).ok());
  EXPECT_EQ(failed, 0u);
  EXPECT_FALSE(tm_->FreeSlots(fresh, &failed).ok());
  EXPECT_EQ(failed, 3u);
}

INSTANTIATE_TEST_SUITE_P(Policies, TierManagerTest, ::testing::ValuesIn(AllPolicies()),
                         [](const auto& info) {
                           std::string n = PolicyName(info.param);
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

class TierManagerInputs : public TierManagerTest {};

TEST_P(TierManagerInputs, BadInputsAreRefusedAndChangeNothing) {
  OpenTm();
  Store(0);
  std::vector<SlotRef> s;
  EXPECT_TRUE(tm_->AllocSlots(cid_ + 1, 1, Tier::kHost, &s).IsNotFound());
  EXPECT_TRUE(tm_->AllocSlots(cid_, 1, Tier::kNvme, &s).IsInvalid());
  EXPECT_TRUE(tm_->AllocSlots(cid_, 99, Tier::kHost, &s).IsInvalid());
  EXPECT_TRUE(s.empty());
  EXPECT_TRUE(tm_->Commit(cid_, SlotRef{Tier::kHost, 7}, K(5), K(4)).IsInvalid());  // free slot
  EXPECT_TRUE(tm_->Commit(cid_, SlotRef{Tier::kHost, 70000}, K(5), K(4)).IsInvalid());
  EXPECT_TRUE(tm_->Unpin(SlotRef{Tier::kHost, 7}).IsInvalid());
  EXPECT_TRUE(tm_->FreeSlot(SlotRef{Tier::kHost, 7}).IsInvalid());
  ASSERT_TRUE(tm_->AllocSlots(cid_, 1, Tier::kHost, &s).ok());
  EXPECT_TRUE(tm_->Unpin(s[0]).IsInvalid());                                   // not committed
  EXPECT_TRUE(tm_->Commit(cid_ + 1, s[0], K(5), K(4)).IsInvalid());            // other contract
  ASSERT_TRUE(tm_->FreeSlot(s[0]).ok());
  EXPECT_EQ(StatsOf(Tier::kHost).slots_used, 1u);

  ScaleContract big = contract_;
  big.geometry.num_layers = 80;
  big.SetUnitScales();
  const Status refused = tm_->RegisterContract(big);
  EXPECT_EQ(refused.code(), StatusCode::kUnsupported);
  // The refusal names the slot_bytes that would hold the block (its slot rounded to 4 KiB).
  const uint64_t want = (uint64_t{big.slot_bytes()} + 4095) / 4096 * 4096;
  EXPECT_NE(refused.message().find("tiers.slot_bytes of at least " + std::to_string(want) + " (" +
                                   std::to_string(want / 1024) + "KiB)"),
            std::string::npos)
      << refused.ToString();
  EXPECT_FALSE(tm_->HasContract(big.Id()));

  TierManagerOptions o = opts_;
  o.host.capacity_bytes *= 2;
  EXPECT_TRUE(tm_->Reconfigure(o).IsInvalid());
  o = opts_;
  o.host.low_watermark = 0.9;
  o.host.high_watermark = 0.8;
  EXPECT_TRUE(tm_->Reconfigure(o).IsInvalid());

  if (!tm_->has_tier(Tier::kHbm)) {
    auto [st, slots] = AcquireSync(Keys(0, 1), Tier::kHbm);
    EXPECT_EQ(st.code(), StatusCode::kUnsupported);
    uint8_t h[64];
    EXPECT_EQ(tm_->hbm_ipc_handle(h).code(), StatusCode::kUnsupported);
  }
  EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 1)).hit_blocks, 1u);
}

TEST_P(TierManagerInputs, DuplicateCommitKeepsTheOldBlock) {
  OpenTm();
  Store(0);
  std::vector<SlotRef> s;
  ASSERT_TRUE(tm_->AllocSlots(cid_, 1, Tier::kHost, &s).ok());
  testing::Fill(Slot(s[0]), Bytes(), 0);
  ASSERT_TRUE(tm_->Commit(cid_, s[0], K(0), Key128{}).ok());
  EXPECT_EQ(StatsOf(Tier::kHost).blocks, 1u);
  ASSERT_TRUE(tm_->Unpin(s[0]).ok());  // frees the duplicate slot
  EXPECT_EQ(StatsOf(Tier::kHost).slots_used, 1u);
}

TEST_P(TierManagerInputs, ReconfigureSwitchesPolicyAndEvictWorks) {
  OpenTm();
  for (uint64_t i = 0; i < 5; ++i) Store(i);
  TierManagerOptions o = opts_;
  o.host.policy = PolicyKind::kPrefixLru;
  o.host.high_watermark = 0.5;
  o.host.low_watermark = 0.25;
  ASSERT_TRUE(tm_->Reconfigure(o).ok());
  Store(5);
  tm_->Drain();
  EXPECT_LE(StatsOf(Tier::kHost).slots_used, 4u);
  EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 6)).hit_blocks, 6u);
  ASSERT_TRUE(tm_->Evict(cid_, K(5)).ok());
  EXPECT_TRUE(tm_->Evict(cid_, K(5)).IsNotFound());
  EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 6)).hit_blocks, 5u);
}

INSTANTIATE_TEST_SUITE_P(Lru, TierManagerInputs, ::testing::Values(PolicyKind::kLru));

// Host parts (TierManagerOptions::host_parts): each group with a host share allocates from
// its own part of the host tier, then from the common pool, never from another group's
// part; an alloc for a group evicts only blocks whose slots it can use, so a group within
// its share keeps every block of its part while another floods the tier.
TEST(TierManagerHostParts, AGroupTakesItsPartThenTheCommonPoolAndNeverAnothersPart) {
  testing::TempDir dir;
  ScaleContract c = SmallContract();
  const uint64_t slot = c.slot_bytes();
  TierManagerOptions o;
  o.slot_bytes = slot;
  o.host.capacity_bytes = 16 * slot;  // group 1: slots 0..7, group 2: 8..11, the common pool 12..15
  o.host.high_watermark = 1.0;        // no watermark eviction: only the allocs' own
  o.host.low_watermark = 0.9;
  o.nvme.tier.capacity_bytes = 64 * (slot + 4096);
  o.nvme.dir = dir.path() + "/nvme";
  o.groups.resize(3);
  o.groups[1].share[1] = 0.5;
  o.groups[2].share[1] = 0.25;
  o.host_parts = true;
  auto tm = TierManager::Open(o);
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  const uint64_t a = 0xA1, b = 0xB2;
  ASSERT_TRUE((*tm)->RegisterContractAs(c, a, 1).ok());
  ASSERT_TRUE((*tm)->RegisterContractAs(c, b, 2).ok());
  EXPECT_EQ((*tm)->host_arena_fd(), -1);
  const HostPart pa = (*tm)->host_part(1), pb = (*tm)->host_part(2);
  EXPECT_EQ(pa.offset, 0u);
  EXPECT_EQ(pa.bytes, 8 * slot);
  EXPECT_EQ(pb.offset, 8 * slot);
  EXPECT_EQ(pb.bytes, 4 * slot);
  EXPECT_EQ((*tm)->host_part(0).bytes, 0u);  // no share, no part
  auto store = [&](uint64_t contract, uint64_t i, uint32_t* slot_out) {
    std::vector<SlotRef> s;
    Status st;
    for (int tries = 0; tries < 400; ++tries) {
      s.clear();
      st = (*tm)->AllocSlots(contract, 1, Tier::kHost, &s);
      if (st.code() != StatusCode::kRetry) break;
      (*tm)->Drain();
    }
    if (!st.ok()) return st;
    testing::Fill((*tm)->host_slot_ptr(s[0].slot), c.block_bytes(), contract * 1000 + i);
    *slot_out = s[0].slot;
    KVTIER_RETURN_IF_ERROR((*tm)->Commit(contract, s[0], K(i), i == 0 ? Key128{} : K(i - 1)));
    return (*tm)->Unpin(s[0]);
  };
  // Group 1: its part first (0..7), then the common pool (12..15).
  for (uint64_t i = 0; i < 12; ++i) {
    uint32_t s = 0;
    ASSERT_TRUE(store(a, i, &s).ok()) << i;
    EXPECT_TRUE(i < 8 ? s < 8 : s >= 12) << i << " in slot " << s;
  }
  // Group 2: its part (8..11), then the common pool, full of group 1's blocks over its
  // share: one goes (demoted to NVMe) for group 2's fifth block, within its share. Past
  // its share group 2 pays with its own blocks. Group 1's part is never in reach.
  for (uint64_t i = 0; i < 8; ++i) {
    uint32_t s = 0;
    ASSERT_TRUE(store(b, i, &s).ok()) << i;
    EXPECT_TRUE(i < 4 ? (s >= 8 && s < 12) : i == 4 ? s >= 12 : s >= 8) << i << " in slot " << s;
  }
  (*tm)->Drain();
  std::vector<Key128> first8;
  for (uint64_t i = 0; i < 8; ++i) first8.push_back(K(i));
  const LookupResult r = (*tm)->Lookup(a, first8);
  ASSERT_EQ(r.hit_blocks, 8u);
  for (Tier t : r.tiers) EXPECT_EQ(t, Tier::kHost);
  for (uint32_t s = 0; s < 8; ++s) EXPECT_TRUE((*tm)->InHostPart(s, 1)) << s;
  EXPECT_FALSE((*tm)->InHostPart(8, 1));
  EXPECT_TRUE((*tm)->InHostPart(8, 2));
  EXPECT_FALSE((*tm)->InHostPart(12, 2));  // the common pool is no one's part
}

}  // namespace
}  // namespace kvtier::tiers
