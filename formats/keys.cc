#include "formats/keys.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <bit>
#include <cstring>

namespace kvtier {

static_assert(std::endian::native == std::endian::little,
              "kvtier's byte formats assume a little-endian host");

void Key128::ToCanonical(uint8_t out[16]) const {
  XXH128_hash_t h{lo, hi};  // XXH128_hash_t is {low64, high64}
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  std::memcpy(out, c.digest, 16);
}

Key128 Key128::FromCanonical(const uint8_t in[16]) {
  XXH128_canonical_t c;
  std::memcpy(c.digest, in, 16);
  const XXH128_hash_t h = XXH128_hashFromCanonical(&c);
  return Key128{h.high64, h.low64};
}

std::string Key128::ToHex() const {
  static const char* kDigits = "0123456789abcdef";
  uint8_t c[16];
  ToCanonical(c);
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[2 * i] = kDigits[c[i] >> 4];
    s[2 * i + 1] = kDigits[c[i] & 0xF];
  }
  return s;
}

std::optional<Key128> Key128::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  uint8_t c[16];
  for (int i = 0; i < 32; ++i) {
    const char ch = hex[i];
    int v;
    if (ch >= '0' && ch <= '9') v = ch - '0';
    else if (ch >= 'a' && ch <= 'f') v = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F') v = ch - 'A' + 10;
    else return std::nullopt;
    if (i % 2 == 0) c[i / 2] = static_cast<uint8_t>(v << 4);
    else c[i / 2] = static_cast<uint8_t>(c[i / 2] | v);
  }
  return FromCanonical(c);
}

namespace {

Key128 HashPrefixAndTokens(const uint8_t* prefix, size_t prefix_len,
                           std::span<const uint32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, prefix, prefix_len);
  // The host is little-endian (asserted above), so the u32 array is already in wire order.
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return Key128{h.high64, h.low64};
}

}  // namespace

Key128 FirstBlockKey(uint64_t contract_id, std::span<const uint32_t> block_tokens) {
  uint8_t le[8];
  std::memcpy(le, &contract_id, 8);
  return HashPrefixAndTokens(le, 8, block_tokens);
}

Key128 NextBlockKey(const Key128& parent, std::span<const uint32_t> block_tokens) {
  uint8_t c[16];
  parent.ToCanonical(c);
  return HashPrefixAndTokens(c, 16, block_tokens);
}

std::vector<Key128> KeyChain(uint64_t contract_id, std::span<const uint32_t> tokens,
                             uint32_t block_tokens) {
  std::vector<Key128> keys;
  if (block_tokens == 0) return keys;
  const size_t n = tokens.size() / block_tokens;
  keys.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    auto blk = tokens.subspan(i * block_tokens, block_tokens);
    keys.push_back(i == 0 ? FirstBlockKey(contract_id, blk) : NextBlockKey(keys.back(), blk));
  }
  return keys;
}

}  // namespace kvtier
