// Eviction policies: one small interface, seven implementations, chosen per tier by name in
// the config (TierOptions::policy; the names and knobs are in policy_options.h).
//
//   lru        least recently used first.
//   s3fifo     S3-FIFO (Yang et al., SOSP'23): a small FIFO (10% of the blocks) that
//              filters one-hit wonders, a main FIFO with 2-bit frequencies (reinsertion
//              instead of promotion), and a ghost FIFO of recently evicted keys that sends
//              a returning key straight to main.
//   prefix-lru LRU among blocks with no cached descendant in this tier. A prefix hit stops
//              at its first miss, so evicting an inner block would strand every cached
//              block after it; prefix-lru evicts a chain from its tail. A block becomes a
//              candidate again as soon as its last cached child leaves the tier. When
//              every leaf is pinned (or the parent graph has cycles, so that no block is
//              a leaf) the inner blocks are offered in LRU order.
//   sieve      SIEVE (Zhang et al., NSDI'24): one FIFO with a visited bit per block and a
//              hand that walks from the oldest block toward the newest, clearing visited
//              bits and stopping at the first unvisited block. A hit only sets a bit.
//   arc        ARC (Megiddo and Modha, FAST'03): T1 (seen once) and T2 (seen again) in
//              LRU order, ghost lists B1/B2 of their evicted keys (capacity keys in all),
//              and a target size p for T1 that a ghost hit in B1 raises and in B2 lowers.
//   reuse      kvtier's own (opt-in; the default is lru, docs/replay.md): a block's reuse is predicted from
//              whether it was used again since it entered the tier (or returned while
//              its key was remembered), and from its place in its chain. Probation
//              (used once) and protected (used again, or returning within
//              reuse_ghost_factor x capacity evictions), each in LRU order and each
//              offering blocks with no cached child first, so a chain is eaten from its
//              tail. Protected gives up blocks above a target size that adapts online
//              (ARC's rule): a returning key that was evicted from probation says
//              probation is too small (the target drops), one evicted from protected
//              says the opposite. On the Mooncake trace the used-again blocks are reused
//              about twice as often as new ones (docs/replay.md). reuse_density chooses
//              the segment by learned hit density instead.
//   tinylfu    W-TinyLFU (Einziger et al., ACM ToS 2017; Caffeine's layout): a window LRU
//              (1%) in front of a segmented LRU main; a block pushed out of the window
//              enters main only if a count-min sketch (with a doorkeeper and periodic
//              halving) estimates it more frequent than main's least recent block.
//
// The policy only orders blocks; the TierManager decides when to evict (watermarks) and
// what happens to a victim (demote or drop). Victim() takes a predicate so that pinned
// (leased) blocks and blocks in flight are skipped, never evicted. Victim() does not
// remove the block: the caller calls Remove() once it really leaves the tier.
// Not thread-safe: the TierManager calls it under its lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "tiers/policy/policy_options.h"  // names, knobs
#include "tiers/types.h"                  // BlockId, PolicyKind

namespace kvtier::tiers {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual const char* name() const = 0;
  // A block entered the tier. `parent` has a zero key for a first block.
  virtual void Insert(const BlockId& b, const BlockId& parent) = 0;
  // The block was used (hit). Unknown blocks are ignored.
  virtual void Touch(const BlockId& b) = 0;
  // The block left the tier. Unknown blocks are ignored.
  virtual void Remove(const BlockId& b) = 0;
  // The next block to evict among those for which evictable(b) is true; nullopt if none.
  virtual std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& evictable) = 0;
  virtual size_t size() const = 0;
  virtual bool Contains(const BlockId& b) const = 0;
  // The tier now holds about `blocks` blocks: a tier of several slot classes holds more or
  // fewer as the sizes of its blocks change (TierState::FollowCapacity). The targets and
  // ghost bounds that are shares of the capacity follow it; what is over a smaller bound
  // goes at the next insert or eviction. Default: nothing (lru and prefix-lru keep none).
  virtual void SetCapacity(uint64_t blocks) { (void)blocks; }

  // capacity: the blocks the tier holds (S3-FIFO, ARC, reuse and W-TinyLFU size their
  // queues and ghosts from it; SetCapacity moves it). `o` must pass o.Check().
  static std::unique_ptr<EvictionPolicy> Create(PolicyKind kind, uint64_t capacity,
                                                const PolicyOptions& o = PolicyOptions{});
};

// kPolicyNames[k], or "?" for a value outside the table.
const char* PolicyName(PolicyKind k);
// A name of kPolicyNames -> kind; false on anything else (*k unchanged).
bool ParsePolicy(std::string_view s, PolicyKind* k);
// Every policy, in table order.
std::vector<PolicyKind> AllPolicies();

}  // namespace kvtier::tiers
