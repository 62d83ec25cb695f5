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

#include <chrono>
#include <cstdint>
#include <deque>
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

}  // namespace kvtier::tiers
