// Vocabulary of the storage engine: the tiers, a block's identity, and the names of the
// per-tier settings. Everything in tiers/ (and its users) speaks these; the header
// depends on nothing but the key type, so a policy or a store can include it without
// including the TierManager.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/keys.h"

namespace kvtier::tiers {

// The tiers, fastest first. The first three values double as array indices of the local
// tiers (tier_state.h): kHbm 0, kHost 1, kNvme 2.
enum class Tier : uint8_t { kHbm = 0, kHost = 1, kNvme = 2, kRemote = 3, kNone = 255 };
// "hbm", "host", "nvme", "remote", "none".
const char* TierName(Tier t);

// Eviction policy of a tier (tiers/policy/policy.h); names and knobs in
// tiers/policy/policy_options.h (kPolicyNames[k]).
enum class PolicyKind : uint8_t {
  kLru = 0, kS3Fifo = 1, kPrefixLru = 2, kSieve = 3, kArc = 4, kReuse = 5, kTinyLfu = 6
};
// What eviction does with a tier's victim: demote it to the next tier, or drop it.
enum class OnEvict : uint8_t { kDemote = 0, kDrop = 1 };
// Which blocks the NVMe tier takes on demotion (tiers/nvme_admission.h): config names
// "always", "second-hit", "reuse".
enum class Admission : uint8_t { kAlways = 0, kSecondHit = 1, kReuse = 2 };

// A block's identity: the contract it was stored under and its chained key.
struct BlockId {
  uint64_t contract = 0;
  Key128 key;
  bool operator==(const BlockId&) const = default;
};
struct BlockIdHash {
  size_t operator()(const BlockId& b) const noexcept {
    return Key128Hash()(b.key) ^ static_cast<size_t>(b.contract * 0xC2B2AE3D27D4EB4Full);
  }
};

}  // namespace kvtier::tiers
