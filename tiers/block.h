// The engine's record of one cached block (Block), the block index that finds it, and the
// one rule that says whether a block, or its copy in one tier, may go.
//
// Internal to the TierManager (tier_manager_impl.h); every field is guarded by its mutex.
#pragma once

#include <absl/container/flat_hash_set.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tiers/block_index.h"
#include "tiers/types.h"

namespace kvtier::tiers {

// Array indices of the local tiers: the values of enum Tier (types.h). Block's per-tier
// arrays and TierManagerImpl::tiers_ are indexed by them.
constexpr int kH = static_cast<int>(Tier::kHbm);
constexpr int kS = static_cast<int>(Tier::kHost);
constexpr int kN = static_cast<int>(Tier::kNvme);
inline constexpr int IndexOf(Tier t) { return static_cast<int>(t); }
inline constexpr Tier TierAt(int i) { return static_cast<Tier>(i); }
// Client pins one block may hold in one tier: an acquire past it misses that block
// rather than wrap the counter.
inline constexpr uint32_t kMaxPins = UINT32_MAX - 1;

using Waiter = std::function<void(bool ok)>;

// A promotion of one block into one tier, shared by every acquire that waits for it.
struct Promotion {
  int slot = -1;                // reserved slot in the target tier
  std::vector<Waiter> waiters;  // run under the engine's lock when the promotion ends
};

// Aligned to a cache line: the fields a lookup reads (id, bytes, slot, nvme) share the
// first one, so a probe of the index touches one line of the Block.
struct alignas(64) Block {
  BlockId id;
  Key128 parent;
  uint64_t bytes = 0;          // payload bytes (the contract's block size)
  int32_t slot[2] = {-1, -1};  // valid copy in HBM / host
  bool nvme = false;           // valid record on NVMe
  uint32_t pins[2] = {0, 0};   // client pins (leases) in HBM / host, at most kMaxPins
  uint32_t io_pins[3] = {0, 0, 0};  // source of an in-flight copy
  bool busy[2] = {false, false};    // a demotion out of HBM / host is in flight
  std::shared_ptr<Promotion> promo[2];
  uint32_t uses = 0;
  // Held by a method that works on several blocks, or by a remote fetch between staging
  // a block and the acquire that pins it: neither evicted nor erased meanwhile.
  uint32_t holds = 0;
  bool remote = false;  // fetched from, or queued for writing to, the remote tier
  // The writer: user id + 1 of the process that first committed the block (0: none:
  // restored from NVMe, fetched from the remote tier, or committed in process); the NVMe
  // write budget charges its demotion to this user (Committer::uid).
  uint64_t writer = 0;
  // tiers.on_conflict = "drop-disputed" found a commit of other bytes under this key while
  // the block could not go (pinned, moving, held): it is never served again (a lookup or
  // acquire misses it), never demoted or written out, and is dropped as soon as it may go
  // (TierManagerImpl::DropDisputedLocked).
  bool disputed = false;

  bool Cached() const { return slot[kH] >= 0 || slot[kS] >= 0 || nvme; }
  // Cached, and a lookup or acquire may answer it.
  bool Servable() const { return Cached() && !disputed; }
  // The fastest tier with a copy (kNvme when only NVMe has one; check Cached() first).
  Tier Fastest() const { return slot[kH] >= 0 ? Tier::kHbm : slot[kS] >= 0 ? Tier::kHost : Tier::kNvme; }
};

// Every tier at once (MayGo): the block as a whole, as an operator's eviction drops it.
constexpr int kAllTiers = -1;

// May this block go? The one rule every path asks, from eviction, demotion and flush
// (t = kH, kS, kN: may the copy in tier t be dropped or demoted now) to an operator's
// eviction and the erasure of an uncached record (t = kAllTiers: may every copy go).
//
// Never while a method holds the block (holds): it walks a set of Block pointers that
// must stay valid and cached. Per tier, never while a client pins the copy, a copy out
// of it is in flight, or a demotion out of it is running; NVMe's copy also stays while
// host is being written from it or loaded from it. For the whole block: none of these in
// any tier, and no promotion in flight.
inline bool MayGo(const Block& b, int t) {
  if (b.holds > 0) return false;
  if (t == kN) return b.io_pins[kN] == 0 && !b.busy[kS] && !b.promo[kS];
  if (t == kH || t == kS) return b.pins[t] == 0 && b.io_pins[t] == 0 && !b.busy[t] && b.slot[t] >= 0;
  return b.pins[kH] == 0 && b.pins[kS] == 0 && b.io_pins[kH] == 0 && b.io_pins[kS] == 0 && b.io_pins[kN] == 0 &&
         !b.busy[kH] && !b.busy[kS] && !b.promo[kH] && !b.promo[kS];
}

// Hash and equality of the block index, a set of the Blocks keyed by their own id;
// transparent, so a BlockId finds its Block.
struct BlockIndexHash {
  using is_transparent = void;
  uint64_t seed = 0;  // TierManagerOptions::index_seed, or a random one
  size_t operator()(const BlockId& id) const noexcept { return BlockIndexHashOf(id, seed); }
  size_t operator()(const std::unique_ptr<Block>& b) const noexcept { return (*this)(b->id); }
};
struct BlockIndexEq {
  using is_transparent = void;
  static const BlockId& Id(const BlockId& id) { return id; }
  static const BlockId& Id(const std::unique_ptr<Block>& b) { return b->id; }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const noexcept { return Id(a) == Id(b); }
};

// The block index. An open-addressing table (abseil's SwissTable): a find is a probe of
// one 16-byte control group and one slot, against the three dependent pointer loads and
// a 64-bit division of std::unordered_map (a 1,000-block lookup: 15.6 -> 7.5 us). Its
// slots hold only the Block pointer (8 bytes, found by the Block's own id): a probe
// reads the control bytes, the pointer and the Block's first line, where the map of
// (id -> pointer) it replaced read a 32-byte slot and then the Block as well (1,000
// blocks: the slots fit L1; with the cheaper hash, block_index.h, 7.5 -> 4.9 us).
// Blocks stay put (unique_ptr): Block* survive rehashing.
using BlockIndex = absl::flat_hash_set<std::unique_ptr<Block>, BlockIndexHash, BlockIndexEq>;

}  // namespace kvtier::tiers
