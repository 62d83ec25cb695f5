// Eviction policies: one small interface, three implementations, chosen per tier in the
// config (TierOptions::policy).
//
//   lru        least recently used first.
//   s3fifo     S3-FIFO (Yang et al., SOSP'23): a small FIFO (10% of the blocks) that
//              filters one-hit wonders, a main FIFO with 2-bit frequencies (reinsertion
//              instead of promotion), and a ghost FIFO of recently evicted keys that sends
//              a returning key straight to main.
//   prefix-lru LRU among blocks with no cached descendant in this tier. A prefix hit stops
//              at its first miss, so evicting an inner block would strand every cached
//              block after it; prefix-lru evicts a chain from its tail. A block becomes a
//              candidate again as soon as its last cached child leaves the tier.
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

#include "tiers/types.h"  // BlockId, PolicyKind

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

  // capacity: the tier's slots (S3-FIFO sizes its queues from it).
  static std::unique_ptr<EvictionPolicy> Create(PolicyKind kind, uint64_t capacity);
};

const char* PolicyName(PolicyKind k);
// "lru", "s3fifo", "prefix-lru" -> kind; false on anything else.
bool ParsePolicy(std::string_view s, PolicyKind* k);

}  // namespace kvtier::tiers
