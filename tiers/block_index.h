// Hash of the TierManager's block index (block.h: BlockIndex), here so that tests can
// build (contract, key) pairs that collide in it.
//
// A key is an XXH3-128 output, already uniform, but it comes from a client, which may send
// any 128 bits. The hash is one 64x64 -> 128-bit multiply of the key's two halves, each
// mixed with a secret per-daemon seed (and the high half with the contract id), folded
// (the core of wyhash): cheap, and with the seed unknown a client cannot aim keys at one
// bucket of the index (a flood of colliding keys would make every probe linear). The
// index compares whole ids, so a collision costs a probe, never a wrong answer (test
// BlockIndexCollisionsNeverMixBlocks, which knows its seed: a low half equal to the seed
// zeroes the product, for any high half and contract).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tiers/types.h"  // BlockId

namespace kvtier::tiers {

inline size_t BlockIndexHashOf(const BlockId& id, uint64_t seed) {
  const uint64_t a = id.key.lo ^ seed;
  const uint64_t b = id.key.hi ^ id.contract ^ (seed * 0x9E3779B97F4A7C15ull) ^ 0xA0761D6478BD642Full;
  const unsigned __int128 m = static_cast<unsigned __int128>(a) * b;
  return static_cast<size_t>(static_cast<uint64_t>(m) ^ static_cast<uint64_t>(m >> 64));
}

}  // namespace kvtier::tiers
