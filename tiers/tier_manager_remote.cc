// TierManagerImpl: the engine's side of the remote tier (docs/remote.md). Write-back
// copies a block's host bytes into the remote stage's queue; a fetch stages blocks into
// host through the internal alloc / commit (StagingHost), held until the acquire that
// follows has pinned them.
#include "tiers/tier_manager_impl.h"

namespace kvtier::tiers {

// Copies the host copy of b into the write queue (the slot may be reused once b leaves
// host, so the bytes are taken now, under mu_). Once per block; dropped and counted when
// the queue is full.
void TierManagerImpl::QueueRemoteWriteLocked(Block* b) {
  if (!remote_ || !remote_->writes_enabled() || b->remote || b->slot[kS] < 0) return;
  b->remote = true;
  remote_->QueueWrite(b->id.contract, b->id.key, b->parent, host_->slot_ptr(static_cast<uint32_t>(b->slot[kS])),
                      b->bytes, RemoteNsLocked(b->id.contract));
}

bool TierManagerImpl::LocalPrefix(uint64_t contract, std::span<const Key128> keys, uint64_t* block_bytes,
                                  size_t* prefix, std::string* remote_ns) {
  std::lock_guard<IndexMutex> l(mu_);
  auto it = contracts_.find(contract);
  if (it == contracts_.end()) return false;
  *block_bytes = it->second->block_bytes();
  *remote_ns = RemoteNsLocked(contract);
  *prefix = LocalPrefixLocked(contract, keys);
  return true;
}

std::vector<StagingHost::Slot> TierManagerImpl::ReserveStaging(uint64_t contract, uint32_t n) {
  std::vector<uint32_t> slots;
  {
    std::lock_guard<IndexMutex> l(mu_);
    if (!AllocLocked(contract, n, kS, &slots).ok()) {
      slots.clear();
      if (!AllocLocked(contract, 1, kS, &slots).ok()) slots.clear();
    }
  }
  std::vector<Slot> out;
  for (uint32_t s : slots) out.push_back({s, host_->slot_ptr(s)});
  return out;
}

size_t TierManagerImpl::CommitStaging(uint64_t contract, std::span<const Slot> slots,
                                      std::span<const remote::GetItem> items, size_t good, std::vector<Block*>* held) {
  std::lock_guard<IndexMutex> l(mu_);
  size_t committed = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    const uint32_t s = slots[i].slot;
    Status err;
    Block* b = i < good ? CommitLocked(contract, kS, s, items[i].key, items[i].parent, /*pin=*/false,
                                       /*from_remote=*/true, &err)
                        : nullptr;
    if (b == nullptr || T(kS).slots[s].state == SlotState::kDup) T(kS).Free(s);  // not kept
    if (b == nullptr) continue;
    ++b->holds;  // until AcquireStaged's acquire has answered
    held->push_back(b);
    ++committed;
  }
  return committed;
}

void TierManagerImpl::AcquireStaged(RemoteFetch job, std::vector<Block*> held, size_t fetched_from) {
  // Blocks the fetch staged into host came from the remote tier: say so (unless they
  // have moved on since, e.g. into HBM for another acquire).
  AcquireLocal(job.contract, job.keys, job.target,
               [this, held = std::move(held), done = std::move(job.done), fetched_from](
                   Status s, std::vector<SlotRef> slots) mutable {
                 if (!held.empty()) {
                   std::lock_guard<IndexMutex> l(mu_);
                   ReleaseHoldsLocked(held);
                 }
                 for (size_t i = fetched_from; i < slots.size(); ++i) {
                   if (slots[i].from == Tier::kHost) slots[i].from = Tier::kRemote;
                 }
                 done(std::move(s), std::move(slots));
               });
}

}  // namespace kvtier::tiers
