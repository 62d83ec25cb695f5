// TierManagerImpl: the pins and slots the daemon's leases hold go back (Unpin, FreeSlot),
// one at a time or many in steps of kReleaseStep a hold of the index lock (UnpinAll,
// FreeSlots: the release of a lease of 16,384 blocks).
#include <algorithm>
#include <span>
#include <string>

#include "tiers/tier_manager_impl.h"

namespace kvtier::tiers {

Status TierManagerImpl::UnpinLocked(SlotRef ref, bool* kick) {
  if (ref.tier != Tier::kHbm && ref.tier != Tier::kHost) return Status::Invalid("Unpin: bad tier");
  TierState& ts = T(IndexOf(ref.tier));
  if (ref.slot >= ts.slots.size()) return Status::Invalid("Unpin: slot out of range");
  SlotInfo& si = ts.slots[ref.slot];
  if (si.state == SlotState::kDup) {
    ts.Free(ref.slot);
    return Status::Ok();
  }
  if (si.state != SlotState::kBlock || si.block->pins[ts.index()] == 0) {
    return Status::Invalid("Unpin: slot " + std::to_string(ref.slot) + " holds no pinned block");
  }
  Block* b = si.block;
  if (--b->pins[ts.index()] == 0) --ts.pinned;
  // A disputed block goes with its last pin (its disputed_ entry is swept as gone later).
  if (b->disputed && MayGo(*b, kAllTiers)) DropBlockLocked(b);
  if (ts.OverHigh()) *kick = true;
  return Status::Ok();
}

Status TierManagerImpl::FreeSlotLocked(SlotRef ref) {
  if (ref.tier != Tier::kHbm && ref.tier != Tier::kHost) return Status::Invalid("FreeSlot: bad tier");
  TierState& ts = T(IndexOf(ref.tier));
  if (ref.slot >= ts.slots.size() || ts.slots[ref.slot].state != SlotState::kAlloc) {
    return Status::Invalid("FreeSlot: slot " + std::to_string(ref.slot) + " is not allocated-uncommitted");
  }
  ts.Free(ref.slot);
  return Status::Ok();
}

Status TierManagerImpl::Unpin(SlotRef ref) {
  std::lock_guard<IndexMutex> l(mu_);
  bool kick = false;
  Status s = UnpinLocked(ref, &kick);
  if (kick) KickLocked();
  return s;
}

Status TierManagerImpl::FreeSlot(SlotRef ref) {
  std::lock_guard<IndexMutex> l(mu_);
  return FreeSlotLocked(ref);
}

Status TierManagerImpl::UnpinAll(std::span<const SlotRef> slots, size_t* failed) {
  Status first;
  size_t bad = 0;
  for (size_t at = 0; at < slots.size(); at += kReleaseStep) {
    std::lock_guard<IndexMutex> l(mu_);
    bool kick = false;
    for (const SlotRef& ref : slots.subspan(at, std::min(kReleaseStep, slots.size() - at))) {
      Status s = UnpinLocked(ref, &kick);
      if (!s.ok() && bad++ == 0) first = s;
    }
    if (kick) KickLocked();
  }
  if (failed != nullptr) *failed = bad;
  return first;
}

Status TierManagerImpl::FreeSlots(std::span<const SlotRef> slots, size_t* failed) {
  Status first;
  size_t bad = 0;
  for (size_t at = 0; at < slots.size(); at += kReleaseStep) {
    std::lock_guard<IndexMutex> l(mu_);
    for (const SlotRef& ref : slots.subspan(at, std::min(kReleaseStep, slots.size() - at))) {
      Status s = FreeSlotLocked(ref);
      if (!s.ok() && bad++ == 0) first = s;
    }
  }
  if (failed != nullptr) *failed = bad;
  return first;
}

}  // namespace kvtier::tiers
