// Hash of the TierManager's block index (tier_manager.cc: blocks_), here so that tests can
// build (contract, key) pairs that collide in it.
//
// A key is an XXH3-128 output, already uniform: one 64x64 -> 128-bit multiply of its
// halves and the contract id, folded (the mix absl::Hash uses), is hash enough. It spreads
// the structured keys tests and tools make up ({i, i * c}) too. Different ids may share a
// hash (a contract id xor-ed into the low half gives the same value as another contract's
// key with that half changed); the index compares the whole id, so a collision costs a
// probe, never a wrong answer (test BlockIndexCollisionsNeverMixBlocks).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tiers/nvme/nvme_store.h"  // BlockId

namespace kvtier::tiers {

inline size_t BlockIndexHashOf(const BlockId& id) {
  const uint64_t hi = id.key.hi;
  const uint64_t x = id.key.lo ^ id.contract ^ ((hi << 32) | (hi >> 32));
  const unsigned __int128 m = static_cast<unsigned __int128>(x) * 0x9E3779B97F4A7C15ull;
  return static_cast<size_t>(static_cast<uint64_t>(m) ^ static_cast<uint64_t>(m >> 64));
}

}  // namespace kvtier::tiers
