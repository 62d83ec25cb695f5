// Chain bookkeeping shared by the prefix-aware policies (prefix-lru in policy.cc, reuse
// in reuse_policy.cc): counts of cached children, and lists of blocks by tick of last use
// whose moves between lists keep that order. Internal to tiers/policy/.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <cstdint>
#include <iterator>
#include <list>
#include <memory>

#include "tiers/policy/policy.h"

namespace kvtier::tiers {

// The reuse policy (reuse_policy.cc), for EvictionPolicy::Create.
std::unique_ptr<EvictionPolicy> MakeReusePolicy(uint64_t capacity, const PolicyOptions& o);

namespace policy_chains {

// ---- chain bookkeeping (prefix-lru, reuse) -------------------------------------------
// children_[p] counts present blocks whose parent is p, whether or not p itself is
// present, so the order of insertion does not matter. A block named as its own parent
// has no parent (a self-loop must not make it an inner block forever); a cycle of
// parents leaves every block of it inner, which the inner fallback still offers.
class ChildCounts {
 public:
  uint32_t Get(const BlockId& b) const {
    auto it = c_.find(b);
    return it == c_.end() ? 0 : it->second;
  }
  uint32_t Add(const BlockId& p) { return ++c_[p]; }
  uint32_t Drop(const BlockId& p) {
    auto it = c_.find(p);
    if (it == c_.end()) return 0;
    if (--it->second == 0) {
      c_.erase(it);
      return 0;
    }
    return it->second;
  }

 private:
  absl::flat_hash_map<BlockId, uint32_t, BlockIdHash> c_;
};

inline bool HasParent(const BlockId& b, const BlockId& parent) { return !parent.key.IsZero() && !(parent == b); }

// Blocks in order of last use, each with the tick of its last use (unique per policy):
// front = least recent. A touch moves a block to the back, an O(1) splice that allocates
// nothing, so the request path (an acquire touches every block it pins) costs what LRU
// costs. A block that changes lists keeps its tick: a parent that gains its first cached
// child leaves the leaves for the inner blocks, and goes back when the last one leaves.
// PlaceByTick finds its place by walking at most kPlaceSteps entries in from each end,
// which is exact in the usual cases (a parent touched just before its new child sits
// near the back of the inner list; a parent whose last child was the least recent leaf
// sits at the front of the leaves) and in any list of up to 2 x kPlaceSteps blocks.
// When both walks stop short, the block goes beside the stopping point nearer in tick:
// its order is then approximate, never lost (it is in exactly one list).
struct TickNode {
  BlockId id;
  uint64_t tick = 0;
};
using TickList = std::list<TickNode>;
using TickPos = TickList::iterator;
constexpr int kPlaceSteps = 32;

// Moves the node at `pos` (in `from`) into `to` at its tick's place (see above).
inline void PlaceByTick(TickList& to, TickList& from, TickPos pos) {
  const uint64_t t = pos->tick;
  TickPos lo = to.begin(), hi = to.end();  // [begin, lo) older than t; [hi, end) newer
  for (int i = 0; i < kPlaceSteps; ++i) {
    if (hi == lo) return to.splice(hi, from, pos);  // the walks met: exact
    if (std::prev(hi)->tick < t) return to.splice(hi, from, pos);
    --hi;
    if (hi == lo) return to.splice(hi, from, pos);
    if (lo->tick > t) return to.splice(lo, from, pos);
    ++lo;
  }
  // lo and hi stand inside the list, lo before hi, prev(lo) older and hi newer than t.
  const uint64_t below = t - std::prev(lo)->tick, above = hi->tick - t;
  to.splice(below <= above ? lo : hi, from, pos);
}

}  // namespace policy_chains
}  // namespace kvtier::tiers
