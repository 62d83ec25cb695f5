// Block keys and the key chain.
//
//   key_0 = XXH3-128(contract_id as 8 bytes little-endian || tokens[0..T))
//   key_i = XXH3-128(key_{i-1} as its 16-byte canonical (big-endian) form
//                    || tokens[iT..(i+1)T))
// token ids as u32 little-endian, one key per *full* block. No seeds, no per-process
// state: the same tokens under the same contract give the same keys in every process,
// on every machine, in every language (the Python client calls this same code).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvtier {

struct Key128 {
  uint64_t hi = 0;  // high 64 bits (first 8 bytes of the canonical form)
  uint64_t lo = 0;

  bool operator==(const Key128&) const = default;
  auto operator<=>(const Key128&) const = default;
  bool IsZero() const { return hi == 0 && lo == 0; }

  // 16-byte canonical (big-endian) form, as XXH128_canonicalFromHash writes it.
  void ToCanonical(uint8_t out[16]) const;
  static Key128 FromCanonical(const uint8_t in[16]);
  // 32 lowercase hex digits of the canonical form.
  std::string ToHex() const;
  static std::optional<Key128> FromHex(std::string_view hex);
};

// Hash for in-memory maps. Real keys are XXH3 output, but tests and tools make up
// structured keys ({i, i * c}); a full 64-bit finalizer (splitmix64) over both halves
// keeps those from colliding into a few buckets.
struct Key128Hash {
  size_t operator()(const Key128& k) const noexcept {
    uint64_t x = k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull) ^ (k.hi >> 29);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return static_cast<size_t>(x ^ (x >> 31));
  }
};

// Key of the first block: XXH3-128(contract_id LE || tokens LE).
Key128 FirstBlockKey(uint64_t contract_id, std::span<const uint32_t> block_tokens);
// Key of a later block from its parent's key.
Key128 NextBlockKey(const Key128& parent, std::span<const uint32_t> block_tokens);

// Keys of every full block of `tokens` (tokens.size() / T keys). T must be > 0.
std::vector<Key128> KeyChain(uint64_t contract_id, std::span<const uint32_t> tokens,
                             uint32_t block_tokens);

}  // namespace kvtier
