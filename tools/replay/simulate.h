// In-process cache simulation of a replayed workload: kvtier's own eviction policies
// (tiers/policy) over a stack of tiers with byte budgets, the block size taken from the
// contract's format. No daemon, no I/O: this is what answers "which policy, which
// format, how much memory" in seconds, and what `kvtierctl bench replay --simulate`
// prints. The daemon-driving replay (replay/driver.h) measures the real thing.
//
// Model of one request (what an engine connected to kvtier does):
//   1. key chain of the prompt's full blocks;
//   2. longest cached prefix: walk the keys while some tier holds the block; each such
//      block is a hit *of the tier that held it*; the rest is recomputed;
//   3. every block of the request ends in the top tier (hits promoted, recomputed blocks
//      committed), pinned while the request runs; inserting into a full tier evicts the
//      policy's victim, demoted to the next tier or, from the last tier, dropped.
// "Block-weighted prefix hit rate" = prefix-hit blocks / referenced blocks.
// The infinite-cache bound counts every reference to a block seen before as a hit.
// The oracle (SimOptions::oracle) is Belady's rule in every tier: the victim is the
// evictable block whose next reference is farthest in the future (never again first),
// ties going to the block deepest in its chain. It reads the whole trace ahead, so it
// exists only here; it is the line an online policy is measured against, not the true
// optimum of prefix caching (which must also weigh a chain's blocks together).
// Oracles of partial knowledge (SimOptions::partial_oracle) show which knowledge the gap
// to Belady needs. Both keep LRU order and evict first, in LRU order, the blocks they know
// to be dead:
//   reuse-bit  knows *whether* a block is referenced again, not when: a block that never
//              is goes first;
//   horizon    knows whether it is referenced again within horizon_lifetimes x C block
//              references from now (C: the tier's blocks; an LRU of C blocks keeps a
//              block for at least C references): a block that is not goes first.
// Like Belady they read the trace ahead: they are measures, never policies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/layout.h"
#include "tiers/policy/policy_options.h"
#include "tiers/tier_manager.h"
#include "tools/replay/trace.h"

namespace kvtier::replay {

struct SimTier {
  std::string name;                 // "hbm", "host", "nvme"
  uint64_t capacity_bytes = 0;      // budget; capacity in blocks = bytes / slot bytes
  tiers::PolicyKind policy = tiers::PolicyKind::kLru;
};

// What the NVMe tier takes on demotion (the tier named "nvme"; a refused block is
// dropped). always and second-hit are the daemon's NvmeAdmission; reuse is
// ReuseAdmission (tiers/nvme_admission.h), fed each block's uses while cached. The
// budget's window runs on the trace's arrival times.
struct SimAdmission {
  enum class Mode { kAlways, kSecondHit, kReuse };
  Mode mode = Mode::kAlways;        // Default: always
  uint64_t budget_bytes = 0;        // NVMe bytes written per window; 0 = unlimited. Default: 0
  double window_s = 86400.0;        // the budget's window in trace seconds, > 0. Default: 86400
};
const char* AdmissionModeName(SimAdmission::Mode m);

struct SimOptions {
  std::vector<SimTier> tiers;       // top (HBM) first. At least one.
  KvFormat format = KvFormat::kNvfp4;
  Geometry geometry{32, 8, 128, 16};  // Llama-3-8B shaped. Default: 32 x 8 x 128, T=16
  uint64_t contract_id = 0;         // salt for the key chain (format-independent keys)
  tiers::PolicyOptions policy_options;  // knobs of the tiers' policies. Default: defaults
  bool oracle = false;              // every tier evicts by Belady (tier policies ignored). Default: false
  // A partial-knowledge oracle in every tier instead of the policies (ignored when
  // `oracle` is set). Default: none
  enum class PartialOracle { kNone, kReuseBit, kHorizon };
  PartialOracle partial_oracle = PartialOracle::kNone;
  double horizon_lifetimes = 1.0;   // kHorizon: the horizon in multiples of C, > 0. Default: 1
  SimAdmission admission;           // into the tier named "nvme". Default: always, no budget
  Status Validate() const;
};

struct SimResult {
  uint64_t requests = 0;
  uint64_t blocks = 0;              // referenced full blocks
  uint64_t prefix_hits = 0;         // blocks served from some tier
  std::vector<uint64_t> hits_by_tier;
  std::vector<uint64_t> capacity_blocks;
  uint64_t recomputed_tokens = 0;   // prompt tokens not covered by the cached prefix
  uint64_t prompt_tokens = 0;
  uint64_t promoted_blocks = 0;     // lower tier -> top tier
  uint64_t demoted_blocks = 0;      // evicted into the next tier
  uint64_t dropped_blocks = 0;      // evicted out of the last tier (or refused by NVMe)
  uint64_t nvme_writes = 0;         // blocks written to the tier named "nvme"
  uint64_t nvme_written_bytes = 0;  // nvme_writes x slot bytes
  uint64_t admission_rejects = 0;   // demotions the NVMe tier refused
  uint64_t slot_bytes = 0;
  double hit_rate() const { return blocks ? static_cast<double>(prefix_hits) / blocks : 0.0; }
  // Tokens the tiers can hold at once (sum of capacities x T).
  uint64_t token_capacity(uint32_t block_tokens) const;
};

// Key chains of every request (computed once, reused by every simulation of a sweep).
struct KeyedTrace {
  uint32_t block_tokens = 0;
  std::vector<std::vector<Key128>> keys;      // per request
  std::vector<uint32_t> prompt_tokens;        // per request
  std::vector<double> arrival_s;              // per request, seconds from the trace start
};
KeyedTrace KeyTrace(const std::vector<Request>& reqs, uint32_t block_tokens, uint64_t contract_id = 0);

// opts.geometry.block_tokens must equal trace.block_tokens.
SimResult Simulate(const KeyedTrace& trace, const SimOptions& opts);
SimResult Simulate(const std::vector<Request>& reqs, const SimOptions& opts);

// Block-weighted hit rate of an infinite cache (every repeated block a hit).
double InfiniteBoundHitRate(const KeyedTrace& trace);
double InfiniteBoundHitRate(const std::vector<Request>& reqs, uint32_t block_tokens);

}  // namespace kvtier::replay
