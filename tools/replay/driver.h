// The daemon-driving replayer: the same requests, through libkvtier, against a running
// kvtierd (or one kvtierd per KV format that it starts itself, at the same budgets).
//
// Per request, as an engine would: key chain -> lookup (hits by tier) -> acquire the
// cached prefix into the host tier (the replayer has no GPU) -> check the bytes of every
// acquired block against the content derived from its key (so a wrong block is caught,
// not just counted) -> alloc slots for the missing blocks, write their content, commit
// under key and parent -> release both leases. Counters come from the daemon's stats
// before and after.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/layout.h"
#include "formats/status.h"
#include "tools/replay/trace.h"

namespace kvtier::replay {

struct DriveOptions {
  std::string socket;                  // kvtierd's control socket
  KvFormat format = KvFormat::kNvfp4;  // contract format (block size follows)
  Geometry geometry{32, 8, 128, 16};
  bool verify_full = false;  // check every byte (default: 4 KiB at each end + stamps)
  uint32_t max_blocks_per_request = 4096;  // longer prompts are truncated
};

struct DriveResult {
  uint64_t requests = 0, blocks = 0, prefix_hits = 0;
  uint64_t hits_by_tier[4] = {0, 0, 0, 0};  // hbm, host, nvme, remote
  uint64_t recomputed_tokens = 0, prompt_tokens = 0;
  uint64_t committed = 0, errors = 0, wrong_blocks = 0, lost_on_acquire = 0;
  uint64_t stores_declined = 0;  // blocks not stored: tier full after backing off, or the
                                 // request was longer than half the host tier
  uint64_t promoted_bytes = 0, demoted_bytes = 0;
  uint64_t slot_bytes = 0, block_bytes = 0, host_capacity_blocks = 0, total_capacity_blocks = 0;
  double seconds = 0;
  std::string first_error;
  double hit_rate() const { return blocks ? static_cast<double>(prefix_hits) / blocks : 0.0; }
};

StatusOr<DriveResult> Drive(const std::vector<Request>& reqs, const DriveOptions& opts);

// Fills / checks a block's bytes from its key (deterministic, position-dependent).
void FillBlock(uint64_t key_hi, uint64_t key_lo, uint8_t* p, size_t n, bool full);
bool CheckBlock(uint64_t key_hi, uint64_t key_lo, const uint8_t* p, size_t n, bool full);

}  // namespace kvtier::replay
