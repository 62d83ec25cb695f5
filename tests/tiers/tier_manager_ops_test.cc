// The TierManager's operator views and actions (kvtierctl's backend): Contracts,
// ListBlocks (filters, paging), InspectBlock (NVMe checksums), VerifyNvme (a record
// corrupted on disk is found, dropped and counted; the rest stays served), EvictContract
// (pinned blocks stay). Real host memfd + real io_uring/RocksDB NVMe, no mocks.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <fstream>
#include <future>
#include <set>

#include "formats/contract.h"
#include "tests/tiers/test_util.h"
#include "tiers/tier_manager.h"

namespace kvtier::tiers {
namespace {

using testing::K;

class TierManagerOps : public ::testing::Test {
 protected:
  void SetUp() override {
    contract_.model_id = "test/ops";
    contract_.geometry = Geometry{2, 2, 64, 16};  // 4608-byte NVFP4 blocks, 8 KiB slots
    contract_.SetUnitScales();
    ASSERT_TRUE(contract_.Validate().ok());
    cid_ = contract_.Id();
    slot_ = contract_.slot_bytes();
    opts_.slot_bytes = slot_;
    opts_.host.capacity_bytes = 32 * slot_;
    opts_.nvme.tier.capacity_bytes = 64 * (slot_ + 4096);
    opts_.nvme.dir = dir_.path() + "/nvme";
    opts_.nvme.queue_depth = 16;
    auto tm = TierManager::Open(opts_);
    ASSERT_TRUE(tm.ok()) << tm.status().ToString();
    tm_ = std::move(tm.value());
    ASSERT_TRUE(tm_->RegisterContract(contract_).ok());
    arena_ = tm_->host_slot_ptr(0);  // the daemon side of the arena: writable in this process only
    ASSERT_NE(arena_, nullptr);
  }
  void TearDown() override {
    tm_.reset();
  }
  void Store(uint64_t contract, int first, int n) {
    for (int i = first; i < first + n; ++i) {
      std::vector<SlotRef> s;
      ASSERT_TRUE(tm_->AllocSlots(contract, 1, Tier::kHost, &s).ok());
      testing::Fill(arena_ + uint64_t{s[0].slot} * slot_, contract_.block_bytes(), i);
      ASSERT_TRUE(tm_->Commit(contract, s[0], K(i), i == 0 ? Key128{} : K(i - 1)).ok());
      ASSERT_TRUE(tm_->Unpin(s[0]).ok());
    }
  }

  testing::TempDir dir_;
  ScaleContract contract_;
  uint64_t cid_ = 0;
  uint64_t slot_ = 0;
  TierManagerOptions opts_;
  std::unique_ptr<TierManager> tm_;
  uint8_t* arena_ = nullptr;
};

TEST_F(TierManagerOps, ContractsListAndInspect) {
  Store(cid_, 0, 10);
  auto cs = tm_->Contracts();
  ASSERT_EQ(cs.size(), 1u);
  EXPECT_EQ(cs[0].id, cid_);
  EXPECT_EQ(cs[0].block_bytes, contract_.block_bytes());
  EXPECT_EQ(cs[0].blocks[1], 10u);
  EXPECT_EQ(cs[0].blocks[2], 0u);
  EXPECT_EQ(cs[0].contract.Id(), cid_);

  std::vector<BlockInfo> out;
  uint64_t total = 0;
  ASSERT_TRUE(tm_->ListBlocks(0, Tier::kNone, 0, 4, &out, &total).ok());
  EXPECT_EQ(total, 10u);
  EXPECT_EQ(out.size(), 4u);
  // Paging covers every block exactly once.
  std::set<uint64_t> seen;
  for (uint64_t off = 0; off < total; off += 3) {
    ASSERT_TRUE(tm_->ListBlocks(cid_, Tier::kHost, off, 3, &out, &total).ok());
    for (const auto& b : out) seen.insert(b.key.lo);
  }
  EXPECT_EQ(seen.size(), 10u);
  ASSERT_TRUE(tm_->ListBlocks(cid_, Tier::kNvme, 0, 100, &out, &total).ok());
  EXPECT_EQ(total, 0u);
  EXPECT_TRUE(tm_->ListBlocks(12345, Tier::kNone, 0, 1, &out, &total).IsNotFound());
  EXPECT_FALSE(tm_->ListBlocks(0, Tier::kRemote, 0, 1, &out, &total).ok());

  auto info = tm_->InspectBlock(0, K(4));
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->contract_id, cid_);
  EXPECT_EQ(info->parent, K(3));
  EXPECT_GE(info->host_slot, 0);
  EXPECT_FALSE(info->in_nvme);
  EXPECT_TRUE(tm_->InspectBlock(cid_, K(99)).status().IsNotFound());

  // Flush down to host only: nothing here is in HBM, so nothing moves.
  ASSERT_TRUE(tm_->Flush(Tier::kHost).ok());
  EXPECT_TRUE(tm_->Flush(Tier::kHbm).IsInvalid());
  info = tm_->InspectBlock(cid_, K(4));
  ASSERT_TRUE(info.ok());
  EXPECT_GE(info->host_slot, 0);
  EXPECT_FALSE(info->in_nvme);

  ASSERT_TRUE(tm_->Flush().ok());
  info = tm_->InspectBlock(cid_, K(4));
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->in_nvme);
  EXPECT_NE(info->payload_xxh3, 0u);
  EXPECT_NE(info->header_xxh3, 0u);
  ASSERT_TRUE(tm_->ListBlocks(cid_, Tier::kNvme, 0, 100, &out, &total).ok());
  EXPECT_EQ(total, 10u);
}

TEST_F(TierManagerOps, VerifyNvmeFindsAndDropsCorruptRecords) {
  Store(cid_, 0, 8);
  ASSERT_TRUE(tm_->Flush().ok());
  VerifyReport r;
  ASSERT_TRUE(tm_->VerifyNvme(0, 100, &r).ok());
  EXPECT_EQ(r.total, 8u);
  EXPECT_EQ(r.checked, 8u);
  EXPECT_EQ(r.ok, 8u);
  EXPECT_EQ(r.corrupt, 0u);
  // Pages: [0,3) [3,6) [6,9).
  uint64_t ok = 0;
  for (uint64_t off = 0; off < 8; off += 3) {
    ASSERT_TRUE(tm_->VerifyNvme(off, 3, &r).ok());
    ok += r.ok;
  }
  EXPECT_EQ(ok, 8u);

  // Flip one payload byte of record 0 on disk.
  const std::string data = opts_.nvme.dir + "/data/kvtier-0000.dat";
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    f.seekg(4096 + 17);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x20);
    f.seekp(4096 + 17);
    f.write(&c, 1);
  }
  ASSERT_TRUE(tm_->VerifyNvme(0, 100, &r).ok());
  EXPECT_EQ(r.corrupt, 1u);
  EXPECT_EQ(r.ok, 7u);
  uint64_t nvme_blocks = 0, failures = 0;
  for (const auto& t : tm_->Stats()) {
    if (t.tier == Tier::kNvme) {
      nvme_blocks = t.blocks;
      failures = t.checksum_failures;
    }
  }
  EXPECT_EQ(nvme_blocks, 7u);
  EXPECT_EQ(failures, 1u);
  ASSERT_TRUE(tm_->VerifyNvme(0, 100, &r).ok());
  EXPECT_EQ(r.total, 7u);
  EXPECT_EQ(r.ok, 7u);
  EXPECT_EQ(r.corrupt, 0u);
  EXPECT_FALSE(tm_->VerifyNvme(0, 0, &r).ok());
}

TEST_F(TierManagerOps, EvictContractLeavesPinnedBlocks) {
  ScaleContract other = contract_;
  other.model_id = "test/other";
  ASSERT_TRUE(tm_->RegisterContract(other).ok());
  Store(cid_, 0, 6);
  Store(other.Id(), 100, 3);
  std::vector<SlotRef> pinned;
  std::vector<Key128> keys{K(0)};
  std::promise<void> done;
  tm_->Acquire(cid_, keys, Tier::kHost, [&](Status s, std::vector<SlotRef> slots) {
    EXPECT_TRUE(s.ok());
    pinned = slots;
    done.set_value();
  });
  done.get_future().wait();
  ASSERT_EQ(pinned.size(), 1u);
  auto host_pinned = [&] {
    for (const auto& t : tm_->Stats()) {
      if (t.tier == Tier::kHost) return t.pinned;
    }
    return uint64_t{999};
  };
  EXPECT_EQ(host_pinned(), 1u);
  auto cs = tm_->Contracts();
  ASSERT_EQ(cs.size(), 2u);
  for (const auto& c : cs) EXPECT_EQ(c.blocks[1], c.id == cid_ ? 6u : 3u);
  uint64_t ev = 0, sk = 0;
  ASSERT_TRUE(tm_->EvictContract(cid_, &ev, &sk).ok());
  EXPECT_EQ(ev, 5u);
  EXPECT_EQ(sk, 1u);
  std::vector<BlockInfo> out;
  uint64_t total = 0;
  ASSERT_TRUE(tm_->ListBlocks(cid_, Tier::kNone, 0, 100, &out, &total).ok());
  EXPECT_EQ(total, 1u);
  ASSERT_TRUE(tm_->ListBlocks(other.Id(), Tier::kNone, 0, 100, &out, &total).ok());
  EXPECT_EQ(total, 3u);  // the other contract is untouched
  ASSERT_TRUE(tm_->Unpin(pinned[0]).ok());
  EXPECT_EQ(host_pinned(), 0u);
  ASSERT_TRUE(tm_->EvictContract(cid_, &ev, &sk).ok());
  for (const auto& c : tm_->Contracts()) EXPECT_EQ(c.blocks[1], c.id == cid_ ? 0u : 3u);
  EXPECT_EQ(ev, 1u);
  EXPECT_TRUE(tm_->EvictContract(777, &ev, &sk).IsNotFound());
}

}  // namespace
}  // namespace kvtier::tiers
