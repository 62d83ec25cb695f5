// TierState: everything the engine keeps per local tier (HBM, host, NVMe) in one object:
// the tier's settings, its slot arena, what each slot holds, its eviction policy, its
// counters and the demotion and space bookkeeping of the mover. The engine keeps one per
// tier in TierManagerImpl::tiers_, indexed by the Tier's value (block.h: kH, kS, kN).
//
// Internal to the TierManager; guarded by its mutex.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "tiers/block.h"
#include "tiers/policy/policy.h"
#include "tiers/slab_allocator.h"
#include "tiers/tier_manager.h"

namespace kvtier::tiers {

class HbmPool;
class HostPool;
class NvmeStore;

// Quota group of each contract (TierManager::RegisterContractAs); a contract not in it
// is in group 0.
using GroupMap = std::unordered_map<uint64_t, uint32_t>;

// The tier's eviction policy, counting its blocks per contract on the way (for the
// operator views: per-contract counts without a scan of the block index) and, with quota
// groups, per group (for the quotas: TierManagerOptions::groups), in blocks and in bytes.
//
// Bytes, not blocks, are what a quota weighs: a tier of several slot classes holds a few
// large blocks or many small ones in the same bytes, so a count of blocks against a share
// of the smallest class's slots lets a group of large blocks fill the tier without ever
// being over its share. Each block weighs the bytes of the slot (NVMe: record) it takes in
// this tier (TierState::BlockWeight), given at its first Insert; every block of one
// contract takes slots of one class, so the weight is kept per contract, with the group
// its blocks were counted in, and a Remove or a Regroup gives back what the Insert counted
// whatever the group map says by then.
class CountingPolicy {
 public:
  CountingPolicy(std::unique_ptr<EvictionPolicy> p, const GroupMap* groups) : p_(std::move(p)), groups_(groups) {}
  // groups: null without quota groups (nothing counted per group).
  static std::unique_ptr<CountingPolicy> Make(const TierOptions& t, uint64_t capacity,
                                              const GroupMap* groups = nullptr) {
    auto p = std::make_unique<CountingPolicy>(EvictionPolicy::Create(t.policy, capacity, t.policy_options), groups);
    p->capacity_ = capacity;
    return p;
  }
  // The policy's capacity in blocks: what it was made with, or the last SetCapacity.
  uint64_t capacity() const { return capacity_; }
  void SetCapacity(uint64_t blocks) {
    capacity_ = blocks;
    p_->SetCapacity(blocks);
  }
  // `weight`: the bytes b takes in the tier (TierState::BlockWeight). The first block of a
  // contract sets the contract's weight; the others of it weigh the same.
  void Insert(const BlockId& b, const BlockId& parent, uint64_t weight) {
    if (!p_->Contains(b)) {
      PerContract& pc = per_contract_[b.contract];
      if (pc.n++ == 0) {
        pc.weight = weight;
        pc.group = GroupOfContract(b.contract);
      }
      if (groups_) {
        ++GroupSlot(pc.group).n;
        GroupSlot(pc.group).bytes += pc.weight;
      }
    }
    p_->Insert(b, parent);
  }
  void Touch(const BlockId& b) { p_->Touch(b); }
  void Remove(const BlockId& b) {
    if (p_->Contains(b)) {
      auto it = per_contract_.find(b.contract);
      if (it != per_contract_.end()) {
        if (groups_) {
          Counts& gc = GroupSlot(it->second.group);
          gc.n -= std::min<uint64_t>(gc.n, 1);
          gc.bytes -= std::min(gc.bytes, it->second.weight);
        }
        if (--it->second.n == 0) per_contract_.erase(it);
      }
    }
    p_->Remove(b);
  }
  // Blocks of quota group g in the tier, and their bytes (each block its slot's).
  uint64_t GroupCount(uint32_t g) const { return g < per_group_.size() ? per_group_[g].n : 0; }
  uint64_t GroupBytes(uint32_t g) const { return g < per_group_.size() ? per_group_[g].bytes : 0; }
  // A contract's blocks move from group `from` to `to` (its group became known after its
  // blocks were indexed: a warm restart).
  void Regroup(uint64_t contract, uint32_t from, uint32_t to) {
    auto it = per_contract_.find(contract);
    if (it == per_contract_.end() || it->second.group != from) return;
    it->second.group = to;
    const uint64_t n = it->second.n, bytes = n * it->second.weight;
    Counts& f = GroupSlot(from);
    f.n -= std::min(n, f.n);
    f.bytes -= std::min(bytes, f.bytes);
    GroupSlot(to).n += n;
    GroupSlot(to).bytes += bytes;
  }
  uint32_t GroupOf(uint64_t contract) const { return GroupOfContract(contract); }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& evictable) {
    return p_->Victim(evictable);
  }
  size_t size() const { return p_->size(); }
  bool Contains(const BlockId& b) const { return p_->Contains(b); }
  uint64_t Count(uint64_t contract) const {
    auto it = per_contract_.find(contract);
    return it == per_contract_.end() ? 0 : it->second.n;
  }

 private:
  struct PerContract {
    uint64_t n = 0;       // blocks in the tier
    uint64_t weight = 0;  // bytes of one (its slot's)
    uint32_t group = 0;   // the quota group they are counted in
  };
  struct Counts {
    uint64_t n = 0, bytes = 0;
  };
  uint32_t GroupOfContract(uint64_t contract) const {
    if (!groups_) return 0;
    auto it = groups_->find(contract);
    return it == groups_->end() ? 0 : it->second;
  }
  Counts& GroupSlot(uint32_t g) {
    if (g >= per_group_.size()) per_group_.resize(g + 1);
    return per_group_[g];
  }
  std::unique_ptr<EvictionPolicy> p_;
  uint64_t capacity_ = 0;
  std::unordered_map<uint64_t, PerContract> per_contract_;
  const GroupMap* groups_ = nullptr;
  std::vector<Counts> per_group_;
};

// What a slot of the HBM or host arena holds.
enum class SlotState : uint8_t { kFree, kAlloc, kBlock, kDup, kLoading };
struct SlotInfo {
  SlotState state = SlotState::kFree;
  Block* block = nullptr;  // kBlock, kLoading
  uint64_t contract = 0;   // kAlloc, kDup
};

class TierState {
 public:
  // `opts` points into the engine's options (it follows a Reconfigure). At most one of
  // the pools backs the tier; none: the tier is absent (0 slots).
  void Init(Tier tier, const TierOptions* opts, HbmPool* hbm, HostPool* host, NvmeStore* nvme);

  Tier tier() const { return tier_; }
  int index() const { return IndexOf(tier_); }
  const TierOptions& opts() const { return *opts_; }
  bool present() const { return total() > 0; }

  // Slots of the arena (NVMe: records), taken and free.
  uint32_t total() const;
  uint32_t used() const;
  uint32_t free() const { return total() - used(); }
  // The slot size classes (tiers/slab_allocator.h): HBM, host and NVMe have one or more
  // (the same list; NVMe's records are 4 KiB larger). A block takes a slot of
  // ClassOf(block bytes) in this tier. A class's slots come and go with its slabs:
  // total(cls) is what it holds and could take without a slab move (its slabs' slots and
  // the free slabs'), most(cls) what it would hold with every slab. NVMe's slots are its
  // records, their ids the store's record ids.
  int num_classes() const;
  int ClassOf(uint64_t block_bytes) const;
  uint32_t total(int cls) const;
  uint32_t most(int cls) const;
  uint32_t used(int cls) const;
  uint32_t free(int cls) const;
  // Free slots of class `cls` an alloc for host part `part` may take (HostPool::free_count:
  // its part and the common pool; part < 0: the common pool only). HBM: free(cls).
  uint32_t free(int cls, int part) const;
  // Bytes of the slots taken and of the arena's slabs; a class's slot size.
  uint64_t used_bytes() const;
  uint64_t arena_bytes() const;
  uint64_t class_bytes(int cls) const;
  // The bytes a block of `block_bytes` takes in this tier: its class's slot (NVMe: its
  // record, header included). What quotas and the per-client shares weigh a block by.
  uint64_t BlockWeight(uint64_t block_bytes) const { return class_bytes(ClassOf(block_bytes)); }
  // The arena's slabs (SlabAllocator): how many, how many class `cls` holds,
  // its slots in one, the slab of a slot, a slab's class (-1 free), whether it drains for
  // another class, its taken slots, and the start of a move (SlabAllocator::BeginMove).
  uint32_t num_slabs() const;
  uint32_t slabs(int cls) const;
  uint32_t slots_per_slab(int cls) const;
  uint32_t SlabOf(uint32_t slot) const;
  int SlabClass(uint32_t slab) const;
  bool Draining(uint32_t slab) const;
  std::vector<uint32_t> TakenSlots(uint32_t slab) const;
  StatusOr<std::vector<uint32_t>> BeginMove(uint32_t slab, int to);
  // HBM and host: a slot of class `cls` from the arena (host: from part `part` first, then
  // the common pool; HostPool::Alloc), and its return (the slot's SlotInfo is cleared).
  std::optional<uint32_t> Alloc(int cls, int part = -1);
  void Free(uint32_t slot);
  // Above the high watermark: the tier, or one of its classes.
  bool OverHigh() const {
    for (int c = 0; c < num_classes(); ++c) {
      if (OverHigh(c)) return true;
    }
    return false;
  }
  bool OverHigh(int cls) const { return total(cls) > 0 && used(cls) > opts_->high_watermark * total(cls); }
  // A victim of this tier is dropped instead of demoted (the settings say so, or there is
  // no tier below to take it).
  bool DropsOnEvict(bool tier_below) const {
    return tier_ == Tier::kNvme || opts_->on_evict == OnEvict::kDrop || !tier_below;
  }
  // Whether b has a copy in the tier below this one (HBM: host; host: NVMe).
  bool CopyBelow(const Block& b) const {
    return tier_ == Tier::kHbm ? b.slot[kS] >= 0 : tier_ == Tier::kHost ? b.nvme : false;
  }
  // Whether b has a copy in this tier.
  bool Holds(const Block& b) const { return tier_ == Tier::kNvme ? b.nvme : b.slot[index()] >= 0; }
  // A fresh policy of the configured kind over the blocks of `all` this tier holds.
  template <typename Blocks>
  void ResetPolicy(const Blocks& all) {
    policy = CountingPolicy::Make(*opts_, BlockCapacity(), groups);
    for (const auto& b : all) {
      if (Holds(*b)) policy->Insert(b->id, BlockId{b->id.contract, b->parent}, BlockWeight(b->bytes));
    }
  }
  // How many blocks the tier holds at the present mix of slot classes: each class's slots
  // if every slab were of it (most), weighted by the class's share of the slots in use;
  // with one class, or nothing in use, total(). total() alone counts the smallest class's
  // slots, which is several times what a tier of larger blocks holds, and would make the
  // policies' shares (reuse's protected target, S3-FIFO's small queue, ARC's ghosts) that
  // many times too large.
  uint64_t BlockCapacity() const;
  // Gives the policy BlockCapacity() when it moved by more than 1/64 since the last time.
  // The engine calls it before it asks the policy for a victim.
  void FollowCapacity();

  std::vector<SlotInfo> slots;  // HBM and host: what each slot of the arena holds
  // The engine's quota groups (null without them); set before Init.
  const GroupMap* groups = nullptr;
  std::unique_ptr<CountingPolicy> policy;
  uint64_t pinned = 0;  // blocks with pins > 0 here (NVMe: io_pins, a read in flight)
  // The counters: hits, misses, promotions_in, demotions_out, bytes_read / written,
  // evictions_demoted / dropped, admission_rejects, read / write_gbps. Stats() fills in
  // the rest of the record.
  TierStats c;
  // Free slots a Retry'd AllocSlots is waiting for (0: none); MaintainLocked demotes until
  // they exist, watermarks or not.
  uint32_t want_free[kMaxArenaClasses] = {};  // per slot class (HBM: AddClass's too)
  // With host parts: the quota group of that alloc (its part, if it has one, and the
  // common pool must have the room); -1: without host parts.
  std::array<int64_t, kMaxArenaClasses> want_group = [] {
    std::array<int64_t, kMaxArenaClasses> a{};
    a.fill(-1);
    return a;
  }();
  uint32_t demoting = 0;             // demotions in flight out of this tier (HBM, host)
  uint64_t slab_moves = 0;           // slabs moved from one slot class to another
  // Slabs draining for another class (slab, class), and per class the run of the
  // starvation rule (TierManagerImpl::TakeSlabLocked).
  std::vector<std::pair<uint32_t, int>> moving;
  uint32_t starved_run[kMaxArenaClasses] = {};
  std::vector<Block*> space_wait;    // promotions waiting for a demotion to free a slot

 private:
  Tier tier_ = Tier::kNone;
  const TierOptions* opts_ = nullptr;
  HbmPool* hbm_ = nullptr;
  HostPool* host_ = nullptr;
  NvmeStore* nvme_ = nullptr;
};

}  // namespace kvtier::tiers
