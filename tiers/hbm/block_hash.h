// The HBM tier's block hash: a keyed 64-bit hash over a block's bytes, the same function on
// the GPU (hash.cu: taken when a block enters HBM, at commit or after a promotion's copy)
// and on the CPU (BlockHash: the host copy checked when the block leaves HBM).
//
// Why: every client that attaches with a GPU maps the HBM arena by CUDA IPC, and CUDA IPC
// maps read-write, so any such client can change a committed block in place. HBM cannot
// prevent that; it detects it. A block whose host copy does not hash to the value taken
// when it entered HBM is dropped on its way down, never demoted or persisted
// (docs/tiers.md, "What HBM can promise").
//
// Definition (bytes x[0, n), seed s):
//   lane j = 16 bytes x[16j, 16j + 16), zero-padded past n, as two little-endian words
//            (lo, hi);
//   term_j = fold(( lo ^ (s + j * kP1) ) * ( hi ^ (rotl(s, 29) + j * kP2) )), where the
//            product is 64 x 64 -> 128 bits and fold(p) = low64(p) ^ high64(p)
//            (XXH3's 16-byte mix);
//   sum    = sum of every term_j, mod 2^64;
//   hash   = avalanche(sum ^ (n * kP3) ^ s)   (xxHash64's avalanche).
// The terms are independent of each other and summed, so the GPU hashes a block with
// every SM at once (one partial sum per CTA, added atomically); the lane keys make every
// term depend on its position. The seed is drawn at random per HbmPool and never leaves
// the daemon: a client cannot compute the terms, so it cannot aim a change that keeps
// the sum. This is a check against careless and hostile writers without the seed, not a
// cryptographic MAC.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define KVTIER_HASH_HD __host__ __device__ __forceinline__
#else
#define KVTIER_HASH_HD inline
#endif

namespace kvtier::tiers::blockhash {

inline constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull;
inline constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr uint64_t kP3 = 0x165667B19E3779F9ull;
inline constexpr uint32_t kLaneBytes = 16;

KVTIER_HASH_HD uint64_t Rotl29(uint64_t x) { return (x << 29) | (x >> 35); }

// fold(a * b) of the definition above.
KVTIER_HASH_HD uint64_t Fold(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
#endif
}

// term_j of the definition: lane j's words lo, hi.
KVTIER_HASH_HD uint64_t Term(uint64_t lo, uint64_t hi, uint64_t j, uint64_t seed) {
  return Fold(lo ^ (seed + j * kP1), hi ^ (Rotl29(seed) + j * kP2));
}

// The hash from the sum of the terms of n bytes.
KVTIER_HASH_HD uint64_t Finish(uint64_t sum, uint64_t n, uint64_t seed) {
  uint64_t h = sum ^ (n * kP3) ^ seed;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

}  // namespace kvtier::tiers::blockhash

namespace kvtier::tiers {

// The block hash of `n` bytes at `p` (any alignment) under `seed`, on the CPU.
uint64_t BlockHash(const void* p, uint64_t n, uint64_t seed);

}  // namespace kvtier::tiers
