#include "tiers/hbm/block_hash.h"

#include <cstring>

namespace kvtier::tiers {

uint64_t BlockHash(const void* p, uint64_t n, uint64_t seed) {
  using namespace blockhash;
  const auto* x = static_cast<const uint8_t*>(p);
  const uint64_t full = n / kLaneBytes;
  // Four lanes per step in four sums: the 128-bit multiplies of neighbouring lanes
  // overlap instead of waiting on one accumulator.
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  uint64_t j = 0;
  uint64_t w[8];
  for (; j + 4 <= full; j += 4) {
    std::memcpy(w, x + j * kLaneBytes, sizeof w);
    s0 += Term(w[0], w[1], j, seed);
    s1 += Term(w[2], w[3], j + 1, seed);
    s2 += Term(w[4], w[5], j + 2, seed);
    s3 += Term(w[6], w[7], j + 3, seed);
  }
  for (; j < full; ++j) {
    std::memcpy(w, x + j * kLaneBytes, kLaneBytes);
    s0 += Term(w[0], w[1], j, seed);
  }
  if (const uint64_t tail = n - full * kLaneBytes; tail > 0) {
    uint8_t last[kLaneBytes] = {};
    std::memcpy(last, x + full * kLaneBytes, tail);
    std::memcpy(w, last, kLaneBytes);
    s0 += Term(w[0], w[1], full, seed);
  }
  return Finish(s0 + s1 + s2 + s3, n, seed);
}

}  // namespace kvtier::tiers
