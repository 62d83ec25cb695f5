// TierManagerImpl: eviction. Which block goes (the tier's policy, among the blocks that
// MayGo), what happens to it (dropped when a copy exists below or the tier drops on
// eviction; else demoted: HBM -> host by DMA, host -> NVMe through admission), the
// watermarks that start it, the quotas of the quota groups, and the operator's evictions.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "tiers/tier_manager_impl.h"

#include <spdlog/spdlog.h>

namespace kvtier::tiers {

void TierManagerImpl::MaybeEraseLocked(Block* b) {
  if (b->Cached() || !MayGo(*b, kAllTiers)) return;
  EraseBlockLocked(b->id);
}

void TierManagerImpl::DropCopyLocked(int t, Block* b, bool demoted) {
  TierState& ts = T(t);
  ts.policy->Remove(b->id);
  if (t == kN) {
    (void)nvme_->Remove(b->id);  // NotFound when the store dropped it itself (corrupt)
    b->nvme = false;
  } else {
    ts.Free(static_cast<uint32_t>(b->slot[t]));
    b->slot[t] = -1;
  }
  ++(demoted ? ts.c.evictions_demoted : ts.c.evictions_dropped);
  if (quotas()) ++group_evictions_[GroupOfLocked(b->id.contract)][t];
}

void TierManagerImpl::DropBlockLocked(Block* b) {
  for (int t : {kH, kS}) {
    if (b->slot[t] >= 0) DropCopyLocked(t, b, false);
  }
  if (b->nvme) DropCopyLocked(kN, b, false);
  MaybeEraseLocked(b);
}

bool TierManagerImpl::QuotaLetsGoLocked(int t, uint64_t contract, int64_t for_group, bool first) const {
  const uint32_t g = GroupOfLocked(contract);
  if (for_group == kNoGroup) return OverShareLocked(t, g);  // the watermarks: only what is over
  const auto r = static_cast<uint32_t>(for_group);
  if (first) {
    // A requester over its share pays with its own blocks; one within it takes from the
    // groups over theirs.
    return OverShareLocked(t, r) ? g == r : g != r && OverShareLocked(t, g);
  }
  return g == r || OverShareLocked(t, g);  // never a block of a group within its share
}

Block* TierManagerImpl::VictimLocked(int t, const Block* except, int64_t for_group, int cls) {
  TierState& ts = T(t);
  ts.FollowCapacity();
  auto of_class = [&](const Block& b) { return cls < 0 || ts.num_classes() == 1 || ts.ClassOf(b.bytes) == cls; };
  if (!quotas()) {
    auto v = ts.policy->Victim([&](const BlockId& id) {
      Block* b = FindLocked(id);
      return b && b != except && MayGo(*b, t) && of_class(*b);
    });
    return v ? FindLocked(*v) : nullptr;
  }
  for (bool first : {true, false}) {
    auto v = ts.policy->Victim([&](const BlockId& id) {
      Block* b = FindLocked(id);
      return b && b != except && MayGo(*b, t) && of_class(*b) && QuotaLetsGoLocked(t, id.contract, for_group, first) &&
             FreesForLocked(t, *b, for_group);
    });
    if (v) return FindLocked(*v);
    if (for_group == kNoGroup) break;  // both passes are the same
  }
  return nullptr;
}

uint32_t TierManagerImpl::EvictCleanLocked(int t, uint32_t need, int64_t for_group, int cls) {
  TierState& ts = T(t);
  uint32_t freed = 0;
  const bool drop_all = ts.DropsOnEvict(/*tier_below=*/t == kH || (t == kS && nvme_));
  const bool any_class = ts.num_classes() == 1;
  ts.FollowCapacity();
  while (freed < need) {
    auto clean = [&](const BlockId& id, int pass) {
      Block* b = FindLocked(id);
      if (!b || !MayGo(*b, t)) return false;
      if (pass >= 0 && !QuotaLetsGoLocked(t, id.contract, for_group, pass == 0)) return false;
      if (!FreesForLocked(t, *b, for_group)) return false;  // its slot is another part's
      if (!any_class && ts.ClassOf(b->bytes) != cls) return false;  // its slot would not help
      return drop_all || ts.CopyBelow(*b);  // a copy below: no I/O needed
    };
    std::optional<BlockId> v;
    if (!quotas()) {
      v = ts.policy->Victim([&](const BlockId& id) { return clean(id, -1); });
    } else {
      for (int pass = 0; pass < (for_group == kNoGroup ? 1 : 2) && !v; ++pass) {
        v = ts.policy->Victim([&](const BlockId& id) { return clean(id, pass); });
      }
    }
    if (!v) break;
    Block* b = FindLocked(*v);
    if (t == kS) QueueRemoteWriteLocked(b);
    DropCopyLocked(t, b, ts.CopyBelow(*b));
    MaybeEraseLocked(b);
    ++freed;
  }
  return freed;
}

std::optional<uint32_t> TierManagerImpl::ReserveLocked(int t, Block* loading_for) {
  TierState& ts = T(t);
  const int cls = loading_for ? ts.ClassOf(loading_for->bytes) : 0;
  const int64_t group = GroupOfBlockLocked(loading_for);
  const int part = PartForLocked(t, group);
  auto s = ts.Alloc(cls, part);
  while (!s && TakeSlabLocked(t, cls, group, 1)) s = ts.Alloc(cls, part);
  if (!s && EvictCleanLocked(t, 1, group, cls) > 0) s = ts.Alloc(cls, part);
  if (!s) {
    KickLocked();  // let the mover demote dirty blocks; the caller retries or fails
    return std::nullopt;
  }
  ts.slots[*s] = SlotInfo{loading_for ? SlotState::kLoading : SlotState::kAlloc, loading_for, 0};
  return s;
}

bool TierManagerImpl::AdmitLocked(Block* b, bool force, std::string* why) {
  const uint64_t bytes = RoundUp4K(b->bytes) + kIoAlign;
  if (!client_budget_->Fits(b->writer, bytes)) {
    ++T(kN).c.admission_rejects;
    if (why) *why = "uid " + std::to_string(b->writer - 1) + " spent its part of the daily NVMe write budget";
    uint64_t held = 0;
    if (client_budget_log_.Allow(&held)) {
      spdlog::warn("tiers: uid {} spent its part of the daily NVMe write budget ({} of {} bytes, "
                   "tiers.nvme.daily_write_budget_per_client): its blocks stay off NVMe until the window "
                   "turns{}",
                   b->writer - 1, client_budget_->used(b->writer), client_budget_->limit(),
                   HeldBack(held, "such lines"));
    }
    return false;
  }
  if (admission_->Admit(b->id, bytes, b->uses, force)) {
    client_budget_->Charge(b->writer, bytes);
    return true;
  }
  ++T(kN).c.admission_rejects;
  if (why) *why = "daily NVMe write budget exhausted";
  return false;
}

void TierManagerImpl::EvictOneLocked(int t, Block* b, uint32_t* pending_out) {
  if (t == kS && !b->disputed) QueueRemoteWriteLocked(b);  // leaving host: its bytes are still there
  TierState& ts = T(t);
  const bool below = ts.CopyBelow(*b);
  if (t == kN || below || b->disputed || ts.opts().on_evict == OnEvict::kDrop) {
    DropCopyLocked(t, b, below);
    MaybeEraseLocked(b);
    return;
  }
  if (t == kH) {  // demote HBM -> host by DMA
    auto s = b->promo[kS] ? std::nullopt : ReserveLocked(kS, b);
    if (!s) {
      DropCopyLocked(kH, b, false);
      MaybeEraseLocked(b);
      return;
    }
    // Out of the policy at once: under prefix-lru its parent becomes a candidate in this
    // same pass, so a chain demotes in one batch instead of one block per round trip.
    ts.policy->Remove(b->id);
    ++ts.demoting;
    b->busy[kH] = true;
    b->io_pins[kH]++;
    copies_.push_back({b, static_cast<int>(*s), false, true});
    ++*pending_out;
    return;
  }
  // host -> NVMe
  if (!nvme_ || !AdmitLocked(b, false)) {
    DropCopyLocked(kS, b, false);
    MaybeEraseLocked(b);
    return;
  }
  ts.policy->Remove(b->id);  // see the HBM case above
  ++ts.demoting;
  b->busy[kS] = true;
  writes_.emplace_back(b, true);
  ++*pending_out;
}

Block* TierManagerImpl::BlockInSlotLocked(int t, uint32_t slot) const {
  if (t == kN) {  // a record: its index entry names the block (none while its write is in flight)
    auto id = nvme_->BlockAt(slot);
    auto it = id ? blocks_.find(*id) : blocks_.end();
    Block* b = it == blocks_.end() ? nullptr : it->get();
    return b && b->nvme ? b : nullptr;
  }
  const SlotInfo& si = T(t).slots[slot];
  return si.state == SlotState::kBlock ? si.block : nullptr;
}

int64_t TierManagerImpl::SlotOfLocked(int t, const Block& b) const {
  if (t != kN) return b.slot[t];
  if (!b.nvme) return -1;
  auto e = nvme_->Find(b.id);
  return e ? int64_t{e->record} : -1;
}

bool TierManagerImpl::SlabMovableLocked(int t, uint32_t slab, int64_t for_group) const {
  const TierState& ts = T(t);
  if (ts.SlabClass(slab) < 0 || ts.Draining(slab)) return false;
  // With quotas: the bytes the move would take from each group other than the requester's.
  std::vector<uint64_t> take(quotas() ? opts_.groups.size() : 0, 0);
  for (uint32_t s : ts.TakenSlots(slab)) {
    const Block* b = BlockInSlotLocked(t, s);
    if (b == nullptr || !MayGo(*b, t)) return false;
    if (!quotas()) continue;
    const uint32_t g = GroupOfLocked(b->id.contract);
    if (static_cast<int64_t>(g) != for_group && g < take.size()) take[g] += ts.BlockWeight(b->bytes);
  }
  // Never a block of a group within its share: every group keeps at least its share after
  // the move (the slab's blocks all go at once, so over it by one block is not enough).
  for (uint32_t g = 0; g < take.size(); ++g) {
    if (take[g] > 0 && ts.policy->GroupBytes(g) < take[g] + QuotaBytes(t, g)) return false;
  }
  return true;
}

uint32_t TierManagerImpl::EvictSlabLocked(int t, uint32_t slab) {
  TierState& ts = T(t);
  uint32_t pending = 0;
  for (uint32_t s : ts.TakenSlots(slab)) {
    Block* b = BlockInSlotLocked(t, s);
    if (b && MayGo(*b, t)) EvictOneLocked(t, b, &pending);
  }
  return pending;
}

bool TierManagerImpl::TakeSlabLocked(int t, int cls, int64_t for_group, uint32_t need) {
  TierState& ts = T(t);
  if (ts.num_classes() < 2) return false;
  // Moves already under way to this class: finish them (a block pinned when its slab began
  // to move is evicted once its pins are gone) rather than start another.
  bool waiting = false;
  for (auto it = ts.moving.begin(); it != ts.moving.end();) {
    if (!ts.Draining(it->first)) {
      it = ts.moving.erase(it);
      continue;
    }
    if (it->second == cls) {
      EvictSlabLocked(t, it->first);
      waiting = waiting || ts.Draining(it->first);
    }
    ++it;
  }
  if (waiting) return false;
  // The rule: a class is starved when it holds no slab, or when for slots_per_slab of its
  // slots in a row the policy's next victim over the whole tier was a block of another
  // class (that class holds colder bytes; the run keeps two classes of equal demand from
  // trading slabs back and forth). Then the victim's slab moves to it, or, for a class of
  // no slab, any slab of another class whose blocks may all go. A slab with a pinned
  // block, a block in flight or a slot a client is writing never moves.
  const bool none = ts.slabs(cls) == 0;
  Block* coldest = VictimLocked(t, nullptr, for_group, -1);
  std::optional<uint32_t> slab;
  const int64_t coldest_slot = coldest ? SlotOfLocked(t, *coldest) : -1;
  if (coldest_slot >= 0 && ts.ClassOf(coldest->bytes) != cls) {
    uint32_t& run = ts.starved_run[static_cast<size_t>(cls)];
    run += need;
    const uint32_t v = ts.SlabOf(static_cast<uint32_t>(coldest_slot));
    if ((none || run >= ts.slots_per_slab(cls)) && SlabMovableLocked(t, v, for_group) &&
        SlabFreesForLocked(t, v, for_group)) {
      slab = v;
    }
    if (!slab && !none) return false;  // it evicts within its class meanwhile
  } else {
    ts.starved_run[static_cast<size_t>(cls)] = 0;
    if (!none) return false;  // its own blocks are the coldest: it evicts within its class
  }
  for (uint32_t v = 0; !slab && none && v < ts.num_slabs(); ++v) {
    if (ts.SlabClass(v) >= 0 && ts.SlabClass(v) != cls && SlabMovableLocked(t, v, for_group) &&
        SlabFreesForLocked(t, v, for_group)) {
      slab = v;
    }
  }
  if (!slab) return false;
  const int from = ts.SlabClass(*slab);
  auto taken = ts.BeginMove(*slab, cls);
  if (!taken.ok()) return false;
  ts.starved_run[static_cast<size_t>(cls)] = 0;
  ++ts.slab_moves;
  spdlog::debug("{} tier: slab {} moves from slot class {} ({} B) to {} ({} B), {} blocks out", TierName(ts.tier()),
                *slab, from, ts.class_bytes(from), cls, ts.class_bytes(cls), taken->size());
  EvictSlabLocked(t, *slab);
  if (ts.Draining(*slab)) ts.moving.emplace_back(*slab, cls);  // demotions in flight
  return true;
}

void TierManagerImpl::DropDisputedLocked() {
  for (size_t i = 0; i < disputed_.size();) {
    Block* b = FindLocked(disputed_[i]);
    const bool gone = b == nullptr || !b->disputed;
    if (!gone && !MayGo(*b, kAllTiers)) {
      ++i;
      continue;
    }
    if (!gone) DropBlockLocked(b);
    disputed_[i] = disputed_.back();
    disputed_.pop_back();
  }
}

void TierManagerImpl::MaintainLocked() {
  if (!disputed_.empty()) DropDisputedLocked();
  for (TierState& ts : tiers_) {
    const int t = ts.index();
    if (ts.total() == 0) continue;
    // Each slot class on its own (NVMe: each record class): its blocks free only its slots.
    const int classes = ts.num_classes();
    for (int cls = 0; cls < classes; ++cls) {
      const int want_cls = classes == 1 ? -1 : cls;  // -1: any block
      const uint32_t total = ts.total(cls), want = ts.want_free[cls];
      // Demote above the high watermark, and also when an alloc is waiting for more free
      // slots than the watermarks would ever leave (a tier of unpinned blocks that are not
      // on the next tier yet: only demotion can free them).
      const bool over = ts.OverHigh(cls);
      // With host parts a waiting alloc needs room in its group's part or the common pool:
      // its victims are blocks whose slots serve it (an eviction for that group).
      const int64_t want_group = t == kS ? ts.want_group[cls] : -1;
      if (want > 0 && want_group >= 0) {
        const int part = PartForLocked(t, want_group);
        if (classes > 1 && ts.free(cls, part) < want) (void)TakeSlabLocked(t, cls, want_group, want - ts.free(cls, part));
        uint32_t pending = 0;
        for (const auto& w : writes_) {
          pending += (w.second && (want_cls < 0 || ts.ClassOf(w.first->bytes) == cls) &&
                      FreesForLocked(t, *w.first, want_group)) ? 1 : 0;
        }
        while (ts.free(cls, part) + pending < want) {
          Block* v = VictimLocked(t, nullptr, want_group, want_cls);
          if (!v) break;
          EvictOneLocked(t, v, &pending);
        }
      }
      const bool demand = want > 0 && want_group < 0 && ts.free(cls) < want;
      if (!over && !demand) continue;
      // A waiting alloc of a starved class: a slab of another class moves to it.
      if (demand && classes > 1 && TakeSlabLocked(t, cls, kNoGroup, want - ts.free(cls)) &&
          ts.free(cls) >= want) {
        continue;
      }
      double target = over ? ts.opts().low_watermark * total : static_cast<double>(total);
      if (demand) target = std::min(target, static_cast<double>(total - std::min(want, total)));
      uint32_t pending = 0;
      // Demotions already in flight out of this tier (of this class) count as freed.
      for (const auto& w : writes_) {
        pending += (t == kS && w.second && (want_cls < 0 || ts.ClassOf(w.first->bytes) == cls)) ? 1 : 0;
      }
      for (const auto& c : copies_) pending += (t == kH && c.demote) ? 1 : 0;
      while (ts.used(cls) - std::min(pending, ts.used(cls)) > target) {
        Block* v = VictimLocked(t, nullptr, kNoGroup, want_cls);
        if (!v) break;  // everything left is pinned or in flight
        EvictOneLocked(t, v, &pending);
      }
    }
  }
}

// ---- operator evictions --------------------------------------------------------------------

Status TierManagerImpl::Evict(uint64_t contract_id, const Key128& key) {
  std::lock_guard<IndexMutex> l(mu_);
  Block* b = FindLocked({contract_id, key});
  if (!b || !b->Cached()) return Status::NotFound("Evict: block not cached");
  if (!MayGo(*b, kAllTiers)) return Status::Rejected("Evict: block is pinned or being moved");
  DropBlockLocked(b);
  return Status::Ok();
}

Status TierManagerImpl::EvictContract(uint64_t contract_id, uint64_t* evicted, uint64_t* skipped) {
  uint64_t ev = 0, sk = 0;
  {
    std::lock_guard<IndexMutex> l(mu_);
    if (contracts_.count(contract_id) == 0) {
      return Status::NotFound("contract " + ContractIdHex(contract_id) + " is not registered");
    }
    std::vector<Block*> victims;
    for (const auto& b : blocks_) {
      if (b->id.contract == contract_id && b->Cached()) victims.push_back(b.get());
    }
    for (Block* b : victims) {
      if (!MayGo(*b, kAllTiers)) {
        ++sk;
        continue;
      }
      DropBlockLocked(b);
      ++ev;
    }
  }
  if (evicted) *evicted = ev;
  if (skipped) *skipped = sk;
  return Status::Ok();
}

}  // namespace kvtier::tiers
