// TierManagerImpl: the operator's views (kvtierctl): contracts with their blocks per
// tier, pages of the block index, one block with its NVMe record, and the re-verification
// of NVMe records.
#include <algorithm>
#include <cstdlib>

#include "tiers/tier_manager_impl.h"

namespace kvtier::tiers {

namespace {
BlockInfo InfoOf(const Block& b) {
  BlockInfo i;
  i.contract_id = b.id.contract;
  i.key = b.id.key;
  i.parent = b.parent;
  i.bytes = b.bytes;
  i.hbm_slot = b.slot[kH];
  i.host_slot = b.slot[kS];
  i.in_nvme = b.nvme;
  i.pins_hbm = b.pins[kH];
  i.pins_host = b.pins[kS];
  i.uses = b.uses;
  return i;
}
bool InTier(const Block& b, Tier t) {
  switch (t) {
    case Tier::kHbm: return b.slot[kH] >= 0;
    case Tier::kHost: return b.slot[kS] >= 0;
    case Tier::kNvme: return b.nvme;
    default: return b.Cached();
  }
}
}  // namespace

std::vector<ContractInfo> TierManagerImpl::Contracts() const {
  std::lock_guard<IndexMutex> l(mu_);
  std::vector<ContractInfo> out;
  for (const auto& [id, c] : contracts_) {
    ContractInfo ci;
    ci.id = id;
    ci.contract = *c;
    ci.block_bytes = c->block_bytes();
    // Counted by the tiers' policies as blocks enter and leave: no scan of the index.
    for (const TierState& ts : tiers_) ci.blocks[ts.index()] = ts.policy ? ts.policy->Count(id) : 0;
    out.push_back(std::move(ci));
  }
  std::sort(out.begin(), out.end(), [](const ContractInfo& a, const ContractInfo& b) { return a.id < b.id; });
  return out;
}

std::shared_ptr<const std::vector<uint64_t>> TierManagerImpl::ContractIds() const {
  const uint64_t want = contracts_gen_.load(std::memory_order_acquire);
  {
    std::lock_guard<std::mutex> l(ids_mu_);
    if (ids_snap_ && ids_gen_ == want) return ids_snap_;
  }
  auto ids = std::make_shared<std::vector<uint64_t>>();
  uint64_t gen = 0;
  {
    std::lock_guard<IndexMutex> l(mu_);
    ids->reserve(contracts_.size());
    for (const auto& [id, c] : contracts_) ids->push_back(id);
    gen = contracts_gen_.load(std::memory_order_relaxed);
  }
  std::sort(ids->begin(), ids->end());  // outside the index lock
  std::lock_guard<std::mutex> l(ids_mu_);
  if (!ids_snap_ || ids_gen_ < gen) {
    ids_snap_ = ids;
    ids_gen_ = gen;
  }
  return ids;
}

std::vector<ContractInfo> TierManagerImpl::ContractInfos(std::span<const uint64_t> ids) const {
  std::vector<ContractInfo> out;
  out.reserve(ids.size());
  // A few per hold of the index lock, and under it only the contract's pointer and its
  // block counts: the copy of its names and scales (about a microsecond each) is made
  // outside. Copying 64 contracts a hold gave a bystander's 1-key lookup a p99 of 60 us
  // against 2 us idle (bench/README.md, "bystander").
  constexpr size_t kPerLock = 2;
  std::shared_ptr<const ScaleContract> held[kPerLock];
  for (size_t i = 0; i < ids.size(); i += kPerLock) {
    const size_t from = out.size();
    {
      std::lock_guard<IndexMutex> l(mu_);
      for (size_t j = i; j < std::min(ids.size(), i + kPerLock); ++j) {
        auto it = contracts_.find(ids[j]);
        if (it == contracts_.end()) continue;
        ContractInfo& ci = out.emplace_back();
        ci.id = it->first;
        ci.block_bytes = it->second->block_bytes();
        for (const TierState& ts : tiers_) ci.blocks[ts.index()] = ts.policy ? ts.policy->Count(ci.id) : 0;
        held[out.size() - 1 - from] = it->second;
      }
    }
    for (size_t k = from; k < out.size(); ++k) out[k].contract = *std::exchange(held[k - from], nullptr);
  }
  return out;
}

std::shared_ptr<const std::vector<BlockId>> TierManagerImpl::BlockIdsSnapshot() const {
  std::lock_guard<std::mutex> sl(order_mu_);  // one copy at a time; the others take its result
  uint64_t gen = 0;
  {
    std::lock_guard<IndexMutex> l(mu_);
    gen = blocks_gen_;
  }
  if (order_snap_ && order_gen_ == gen) return order_snap_;
  auto ids = std::make_shared<std::vector<BlockId>>();
  constexpr size_t kPerLock = 256;
  for (bool first = true;; first = false) {
    std::lock_guard<IndexMutex> l(mu_);
    if (first) {
      gen = blocks_gen_;  // blocks that come or go during the copy make the next call copy again
      ids->reserve(order_.size());
    }
    auto it = first ? order_.begin() : order_.upper_bound(ids->back());
    for (size_t n = 0; it != order_.end() && n < kPerLock; ++it, ++n) ids->push_back(*it);
    if (it == order_.end()) break;
  }
  order_snap_ = ids;
  order_gen_ = gen;
  return order_snap_;
}

Status TierManagerImpl::ListBlocks(uint64_t contract_id, Tier tier, uint64_t offset, uint32_t limit,
                                   std::vector<BlockInfo>* out, uint64_t* total) const {
  if (tier != Tier::kHbm && tier != Tier::kHost && tier != Tier::kNvme && tier != Tier::kNone) {
    return Status::Invalid("ListBlocks: tier filter must be hbm, host, nvme or none");
  }
  out->clear();
  if (contract_id != 0) {
    std::lock_guard<IndexMutex> l(mu_);
    if (contracts_.count(contract_id) == 0) {
      return Status::NotFound("contract " + ContractIdHex(contract_id) + " is not registered");
    }
  }
  // The snapshot's ids (the contract's range of them), looked up a few hundred per hold
  // of the lock: a block gone since the snapshot is left out, the fields are live.
  const auto ids = BlockIdsSnapshot();
  auto lo = ids->begin(), hi = ids->end();
  if (contract_id != 0) {
    lo = std::lower_bound(ids->begin(), ids->end(), BlockId{contract_id, Key128{}}, BlockIdLess());
    hi = std::upper_bound(lo, ids->end(), BlockId{contract_id, Key128{UINT64_MAX, UINT64_MAX}}, BlockIdLess());
  }
  uint64_t n = 0;
  constexpr long kPerLock = 64;
  if (tier == Tier::kNone) {
    // Every id of the snapshot is a block of the index as of the last block that came or
    // went (the snapshot is copied again after one): the matches are the range, and a
    // page starts at its offset and reads only its own entries.
    *total = static_cast<uint64_t>(hi - lo);
    for (auto it = lo + static_cast<long>(std::min<uint64_t>(offset, *total)); it < hi && out->size() < limit;) {
      const auto stop = it + std::min(kPerLock, static_cast<long>(hi - it));
      std::lock_guard<IndexMutex> l(mu_);
      for (; it != stop && out->size() < limit; ++it) {
        auto f = blocks_.find(*it);
        if (f != blocks_.end() && InTier(**f, tier)) out->push_back(InfoOf(**f));
      }
    }
    return Status::Ok();
  }
  // A tier's copies come and go without a block coming or going: checked live, every
  // entry of the range, a few hundred per hold of the lock.
  for (auto it = lo; it < hi;) {
    const auto stop = it + std::min(kPerLock, static_cast<long>(hi - it));
    std::lock_guard<IndexMutex> l(mu_);
    for (; it != stop; ++it) {
      auto f = blocks_.find(*it);
      if (f == blocks_.end() || !InTier(**f, tier)) continue;
      if (n >= offset && out->size() < limit) out->push_back(InfoOf(**f));
      ++n;
    }
  }
  *total = n;
  return Status::Ok();
}

StatusOr<BlockInfo> TierManagerImpl::InspectBlock(uint64_t contract_id, const Key128& key) const {
  BlockInfo info;
  bool found = false;
  if (contract_id != 0) {
    std::lock_guard<IndexMutex> l(mu_);
    auto it = blocks_.find(BlockId{contract_id, key});
    if (it != blocks_.end() && InTier(**it, Tier::kNone)) {
      info = InfoOf(**it);
      found = true;
    }
  } else {
    // The first contract (by id) holding the key: one find per registered contract, a few
    // dozen per hold of the lock.
    const auto ids = ContractIds();
    constexpr size_t kPerLock = 64;
    for (size_t i = 0; !found && i < ids->size(); i += kPerLock) {
      std::lock_guard<IndexMutex> l(mu_);
      for (size_t j = i; j < std::min(ids->size(), i + kPerLock); ++j) {
        auto it = blocks_.find(BlockId{(*ids)[j], key});
        if (it != blocks_.end() && InTier(**it, Tier::kNone)) {
          info = InfoOf(**it);
          found = true;
          break;
        }
      }
    }
  }
  if (!found) return Status::NotFound("block " + key.ToHex() + " is not cached");
  if (info.in_nvme && nvme_) {
    if (auto e = nvme_->Find({info.contract_id, info.key})) {
      info.nvme_record = e->record;
      info.nvme_hits = e->hits;
      info.payload_xxh3 = e->payload_xxh3;
      info.header_xxh3 = e->header_xxh3;
      info.nvme_verified = e->verified;
    }
  }
  return info;
}

Status TierManagerImpl::VerifyNvme(uint64_t offset, uint32_t limit, VerifyReport* report) {
  *report = VerifyReport{};
  if (limit == 0) return Status::Invalid("VerifyNvme: limit 0");
  if (!nvme_) return Status::Ok();  // nothing to verify
  std::vector<NvmeEntry> ents = nvme_->Entries();
  std::sort(ents.begin(), ents.end(), [](const NvmeEntry& a, const NvmeEntry& b) { return a.record < b.record; });
  report->total = ents.size();
  if (offset >= ents.size()) return Status::Ok();
  const size_t end = static_cast<size_t>(std::min<uint64_t>(ents.size(), offset + limit));
  const uint64_t cap = (slot_bytes_ + 4095) / 4096 * 4096;
  constexpr size_t kBatch = 16;
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> buf(static_cast<uint8_t*>(std::aligned_alloc(4096, cap * kBatch)));
  if (!buf) return Status::Rejected("VerifyNvme: out of memory");
  for (size_t i = offset; i < end; i += kBatch) {
    const size_t n = std::min(kBatch, end - i);
    std::vector<NvmeRead> rd;
    std::vector<Block*> held;
    {
      // Pin each block's NVMe copy (as a read for promotion does) so that it is not
      // evicted and its record reused while it is being read.
      std::lock_guard<IndexMutex> l(mu_);
      for (size_t j = 0; j < n; ++j) {
        Block* b = FindLocked(ents[i + j].id);
        if (b == nullptr || !b->nvme) {
          ++report->missing;
          continue;
        }
        if (b->io_pins[kN]++ == 0) ++T(kN).pinned;
        NvmeRead r;
        r.id = b->id;
        r.dst = buf.get() + rd.size() * cap;
        r.dst_capacity = cap;
        rd.push_back(r);
        held.push_back(b);
      }
    }
    if (!rd.empty()) (void)nvme_->ReadBatch(rd);
    std::lock_guard<IndexMutex> l(mu_);
    for (size_t j = 0; j < rd.size(); ++j) {
      Block* b = held[j];
      if (--b->io_pins[kN] == 0) --T(kN).pinned;
      ++report->checked;
      const Status& r = rd[j].result;
      if (r.ok()) {
        ++report->ok;
      } else if (r.IsCorrupt() || r.IsNotFound()) {
        // The store dropped the record (and counted a corrupt one): gone from NVMe.
        ++(r.IsCorrupt() ? report->corrupt : report->missing);
        if (b->nvme) {
          T(kN).policy->Remove(b->id);
          b->nvme = false;
        }
        MaybeEraseLocked(b);
      } else {
        ++report->io_errors;
      }
    }
  }
  return Status::Ok();
}

}  // namespace kvtier::tiers
