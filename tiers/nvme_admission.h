// NvmeAdmission: which demoted blocks the NVMe tier takes (NVMe wears; a block that is
// read once is not worth a write).
//
//   always       every demoted block is written.
//   second-hit   a block used less than twice is refused the first time it is offered and
//                remembered in a ghost list (the last max(1024, NVMe records) refusals);
//                offered again while remembered, it is taken.
//   reuse        ReuseAdmission's rule (below) on the daemon's budget and window: with no
//                budget every block is written; with one, a block used twice or offered
//                before (among the last max(1024, NVMe records) offers) is written while
//                the budget lasts, a first offer only while the window's spent share of
//                the budget is at or below its elapsed share.
//
// On top of every mode, a daily write budget (bytes per rolling 24 h window; 0 =
// unlimited) refuses every write past it, forced or not. A write that fails is refunded.
// An operator flush forces admission (no second-hit or reuse test), never past the budget.
//
// Not thread-safe: the TierManager calls it under its lock.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_set>

#include "tiers/types.h"

namespace kvtier::tiers {

// The predictor of the reuse rule: the keys of the last `capacity` offers, admitted or
// not. A block is likely to return when it was used twice while cached, or when it was
// offered before while remembered.
class OfferMemory {
 public:
  explicit OfferMemory(size_t capacity) : capacity_(capacity) {}
  // Whether `id`, used `uses` times while cached, is likely to return; records the offer.
  bool Likely(const BlockId& id, uint32_t uses);

 private:
  size_t capacity_;
  std::deque<BlockId> order_;  // oldest offer first
  absl::flat_hash_set<BlockId, BlockIdHash> offered_;
};

// The reuse rule's pacing under a budget: a likely block goes in while the budget lasts,
// another only while the window's spent share of the budget (spent / budget) is at or
// below its elapsed share (time in the window / window).
inline bool ReusePaceAdmits(bool likely, double spent_share, double elapsed_share) {
  return likely || spent_share <= elapsed_share;
}

class NvmeAdmission {
 public:
  using Clock = std::chrono::steady_clock;

  // ghost_capacity: how many refused blocks second-hit remembers, and how many offers
  // reuse remembers (at least 1024 each).
  NvmeAdmission(Admission mode, uint64_t daily_budget_bytes, size_t ghost_capacity,
                Clock::time_point now = Clock::now());

  // New settings (Reconfigure); the budget's window, the ghost list and the remembered
  // offers stay.
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
  OfferMemory offers_;  // reuse
  uint64_t rejects_ = 0;
};

// ClientWriteBudget: the part of the daily write budget the blocks of one writer may
// spend (TierManagerOptions::nvme.daily_write_budget_per_client), so that one client's
// demotions cannot spend the whole budget and leave every other client's blocks on host
// (then dropped). A writer is an opaque id (0: none); the TierManager passes Block::writer,
// the user id + 1 of the process that first committed the block, so every client of one
// user shares one part. Blocks without a writer (restored from NVMe, fetched from the
// remote tier) count against the global budget only. Checked before NvmeAdmission (a
// block past its writer's part never reaches the admission rule), independent of it. The
// window is the same rolling 24 h.
//
// One entry per writer that demoted a block in the current window (cleared with it).
// Not thread-safe: the TierManager calls it under its lock.
class ClientWriteBudget {
 public:
  using Clock = std::chrono::steady_clock;

  // per_writer_bytes: bytes per window one writer may write; 0 = no limit per writer.
  explicit ClientWriteBudget(uint64_t per_writer_bytes, Clock::time_point now = Clock::now())
      : budget_(per_writer_bytes), window_start_(now) {}

  // New limit (Reconfigure); the window and what each writer spent in it stay.
  void Configure(uint64_t per_writer_bytes) { budget_ = per_writer_bytes; }

  // Whether `bytes` more for `writer` (0: none) stay within its part. False counts a reject.
  bool Fits(uint64_t writer, uint64_t bytes, Clock::time_point now = Clock::now());
  // Charges an admitted write to `writer`, or gives back one that failed.
  void Charge(uint64_t writer, uint64_t bytes);
  void Refund(uint64_t writer, uint64_t bytes);

  uint64_t limit() const { return budget_; }
  // Bytes `writer` wrote in the current window.
  uint64_t used(uint64_t writer) const {
    auto it = used_.find(writer);
    return it == used_.end() ? 0 : it->second;
  }
  uint64_t rejects() const { return rejects_; }

 private:
  uint64_t budget_;
  Clock::time_point window_start_;
  absl::flat_hash_map<uint64_t, uint64_t> used_;  // writer -> bytes written in the window
  uint64_t rejects_ = 0;
};

// ReuseAdmission: spends an NVMe write budget on the blocks most likely to come back
// (the rule of NvmeAdmission's reuse mode, with the window in seconds given by the
// caller, which is how the simulator runs it on trace time), by the predictor of the
// `reuse` eviction policy: a block used twice while cached, or
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
  OfferMemory offers_;
};

}  // namespace kvtier::tiers
