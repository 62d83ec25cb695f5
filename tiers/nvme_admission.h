// NvmeAdmission: which demoted blocks the NVMe tier takes (NVMe wears; a block that is
// read once is not worth a write).
//
//   always       every demoted block is written.
//   second-hit   a block used less than twice is refused the first time it is offered and
//                remembered in a ghost list (the last max(1024, NVMe records) refusals);
//                offered again while remembered, it is taken.
//
// On top of either mode, a daily write budget (bytes per rolling 24 h window; 0 =
// unlimited) refuses every write past it, forced or not. A write that fails is refunded.
// An operator flush forces admission (no second-hit test), never past the budget.
//
// Not thread-safe: the TierManager calls it under its lock.
#pragma once

#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_set>

#include "tiers/types.h"

namespace kvtier::tiers {

class NvmeAdmission {
 public:
  using Clock = std::chrono::steady_clock;

  // ghost_capacity: how many refused blocks second-hit remembers (at least 1024).
  NvmeAdmission(Admission mode, uint64_t daily_budget_bytes, size_t ghost_capacity,
                Clock::time_point now = Clock::now());

  // New settings (Reconfigure); the budget's window and the ghost list stay.
  void Configure(Admission mode, uint64_t daily_budget_bytes);

  // Whether to write `bytes` (on disk) for block `id`, used `uses` times so far. True
  // charges the budget. False counts a reject.
  bool Admit(const BlockId& id, uint64_t bytes, uint32_t uses, bool force, Clock::time_point now = Clock::now());
  // Gives back the budget of an admitted write that failed.
  void Refund(uint64_t bytes);

  uint64_t budget_used() const { return budget_used_; }
  uint64_t rejects() const { return rejects_; }

 private:
  Admission mode_;
  uint64_t budget_;
  size_t ghost_capacity_;
  uint64_t budget_used_ = 0;
  Clock::time_point window_start_;
  std::deque<BlockId> ghost_;
  std::unordered_set<BlockId, BlockIdHash> ghost_set_;
  uint64_t rejects_ = 0;
};

// ReuseAdmission: spends an NVMe write budget on the blocks most likely to come back,
// by the predictor of the `reuse` eviction policy: a block used twice while cached, or
// offered before (its key among the last `memory` offers, admitted or not) and back
// since, is likely to return; a block offered for the first time after one use is not.
//   - no budget: every block is written (as `always`: a refused block is a certain
//     miss when it returns, and on the Mooncake trace most do);
//   - a budget: likely blocks are written while the budget lasts; a first offer is
//     written only while the window's budget is spent more slowly than the window
//     passes (spent share <= elapsed share), so the budget goes to the likely blocks
//     first and to the others only where it would be left unspent.
// That is second-hit when the budget is tight and always when it is ample; the write
// budget is a hard cap either way.
//
// Not thread-safe. Time is given by the caller (seconds on any monotonic clock).
class ReuseAdmission {
 public:
  struct Options {
    // Bytes written per window; 0 = unlimited. Default: 0
    uint64_t budget_bytes = 0;
    // The budget's window in seconds, > 0. Default: 86400 (a day)
    double window_s = 86400.0;
    // Offers remembered (about the NVMe tier's blocks), >= 1024. Default: 65536
    size_t memory = 65536;
    // Empty when valid, else the first bad field and why.
    std::string Check() const;
  };

  // `o` must pass o.Check().
  explicit ReuseAdmission(const Options& o, double now_s = 0.0);

  // Whether to write `bytes` for block `id`, used `uses` times while cached. True
  // charges the budget.
  bool Admit(const BlockId& id, uint64_t bytes, uint32_t uses, double now_s);
  void Refund(uint64_t bytes) { budget_used_ -= std::min(budget_used_, bytes); }

  uint64_t budget_used() const { return budget_used_; }
  uint64_t rejects() const { return rejects_; }

 private:
  Options o_;
  double window_start_ = 0.0;
  uint64_t budget_used_ = 0, rejects_ = 0;
  std::deque<BlockId> memory_;  // oldest offer first
  absl::flat_hash_set<BlockId, BlockIdHash> offered_;
};

}  // namespace kvtier::tiers
