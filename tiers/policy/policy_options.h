// The eviction policies by name, and their knobs: the one table that the config
// validation, the daemon, the TierManager, kvtierctl and the tests read. Header-only and
// dependency-free, so that config/ (which links nothing of tiers/) checks a name against
// the same list the daemon builds policies from.
//
// Index i of kPolicyNames is the policy whose PolicyKind has the value i (policy.cc
// checks that at compile time). A name that is not here is an error everywhere.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

namespace kvtier::tiers {

inline constexpr std::array<std::string_view, 7> kPolicyNames = {
    "lru", "s3fifo", "prefix-lru", "sieve", "arc", "reuse", "tinylfu"};

// Index of `name` in kPolicyNames, or -1.
constexpr int PolicyIndex(std::string_view name) {
  for (size_t i = 0; i < kPolicyNames.size(); ++i) {
    if (kPolicyNames[i] == name) return static_cast<int>(i);
  }
  return -1;
}

// "lru, s3fifo, ..., reuse" (for error messages and usage lines).
inline std::string PolicyNameList(std::string_view sep = ", ") {
  std::string s;
  for (size_t i = 0; i < kPolicyNames.size(); ++i) {
    if (i) s += sep;
    s += kPolicyNames[i];
  }
  return s;
}

// Knobs of the policies that have any (config: [tiers.policy], docs/tiers.md). A policy
// reads only its own fields. Every policy keeps a bounded amount of memory per block it
// holds: its entry, plus at most ghost_factor x capacity remembered keys.
struct PolicyOptions {
  // s3fifo: the small FIFO's share of the tier's blocks, in (0, 1). Default: 0.1
  double s3fifo_small_fraction = 0.1;
  // reuse: the share of the tier that blocks used more than once may fill before the
  // protected segment gives up blocks, in (0, 1): where the protected target starts
  // (reuse_adapt moves it), the rule until the first hit-density table is built (after
  // max(1024, capacity / 2) hits and departures) with reuse_density. Default: 0.9
  double reuse_protected_fraction = 0.9;
  // reuse: keys of evicted blocks remembered (a returning key enters protected), as a
  // multiple of the tier's capacity, in [0, 16]. Default: 2
  double reuse_ghost_factor = 2.0;
  // reuse: choose between the two segments' least recent blocks by hit density learned
  // online per segment and age (instead of the protected target). Default: false
  bool reuse_density = false;
  // reuse: the protected target moves with ghost hits (ARC's rule: a returning key that
  // left probation shrinks it, one that left protected grows it), starting at
  // reuse_protected_fraction. Off: the target stays there. Default: true
  bool reuse_adapt = true;
  // reuse: shadow caches of keys run plain LRU and reuse without this guard on the same
  // requests; where LRU is ahead, the choice between the segments turns to recency
  // (docs/tiers.md). Default: true
  bool reuse_lru_guard = true;
  // tinylfu: the window LRU's share of the tier's blocks, in (0, 1). Default: 0.01
  double tinylfu_window_fraction = 0.01;

  bool operator==(const PolicyOptions&) const = default;

  // Empty when valid, else the first bad field and why.
  std::string Check() const {
    if (!(s3fifo_small_fraction > 0.0 && s3fifo_small_fraction < 1.0)) return "s3fifo_small_fraction must be in (0, 1)";
    if (!(reuse_protected_fraction > 0.0 && reuse_protected_fraction < 1.0)) {
      return "reuse_protected_fraction must be in (0, 1)";
    }
    if (!(reuse_ghost_factor >= 0.0 && reuse_ghost_factor <= 16.0)) return "reuse_ghost_factor must be in [0, 16]";
    if (!(tinylfu_window_fraction > 0.0 && tinylfu_window_fraction < 1.0)) {
      return "tinylfu_window_fraction must be in (0, 1)";
    }
    return "";
  }
};

}  // namespace kvtier::tiers
