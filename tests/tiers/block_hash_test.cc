// The HBM block hash on the CPU (tiers/hbm/block_hash.h): every single-byte change, a swap
// of two lanes, a change of length and a change of seed give another hash; the pointer's
// alignment and the zero-padded tail do not matter. The GPU kernel is checked against this
// function in tiers_gpu_test (HbmPool.GpuHashEqualsTheCpuHash).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <unordered_set>
#include <vector>

#include "tiers/hbm/block_hash.h"

namespace kvtier::tiers {
namespace {

std::vector<uint8_t> Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// The definition of block_hash.h, term by term, one lane at a time.
uint64_t Reference(const uint8_t* p, uint64_t n, uint64_t seed) {
  uint64_t sum = 0;
  for (uint64_t j = 0; j * 16 < n; ++j) {
    uint8_t lane[16] = {};
    std::memcpy(lane, p + j * 16, std::min<uint64_t>(16, n - j * 16));
    uint64_t lo = 0, hi = 0;
    for (int k = 7; k >= 0; --k) lo = (lo << 8) | lane[k];
    for (int k = 15; k >= 8; --k) hi = (hi << 8) | lane[k];
    const unsigned __int128 prod = static_cast<unsigned __int128>(lo ^ (seed + j * blockhash::kP1)) *
                                   (hi ^ (((seed << 29) | (seed >> 35)) + j * blockhash::kP2));
    sum += static_cast<uint64_t>(prod) ^ static_cast<uint64_t>(prod >> 64);
  }
  return blockhash::Finish(sum, n, seed);
}

TEST(BlockHash, MatchesItsDefinitionAtEveryLengthAndAlignment) {
  const auto data = Random(4096 + 64, 1);
  for (uint64_t n : {0, 1, 15, 16, 17, 63, 64, 65, 100, 1000, 4096}) {
    for (size_t off : {0, 1, 7, 8, 13}) {
      EXPECT_EQ(BlockHash(data.data() + off, n, 42), Reference(data.data() + off, n, 42)) << n << " at +" << off;
    }
  }
}

TEST(BlockHash, EverySingleByteChangeChangesIt) {
  auto block = Random(4608, 2);  // 4.5 KiB: full lanes in groups of 4, then leftovers
  const uint64_t seed = 0x1234567890abcdefull;
  const uint64_t h = BlockHash(block.data(), block.size(), seed);
  std::mt19937_64 rng(3);
  for (size_t i = 0; i < block.size(); ++i) {
    const uint8_t was = block[i];
    block[i] = static_cast<uint8_t>(was ^ (1u << (rng() % 8)));
    EXPECT_NE(BlockHash(block.data(), block.size(), seed), h) << "byte " << i;
    block[i] = was;
  }
  EXPECT_EQ(BlockHash(block.data(), block.size(), seed), h);
}

TEST(BlockHash, PositionLengthAndSeedCount) {
  auto block = Random(1024, 4);
  const uint64_t h = BlockHash(block.data(), block.size(), 7);
  auto swapped = block;
  std::swap_ranges(swapped.begin(), swapped.begin() + 16, swapped.begin() + 512);  // two lanes trade places
  EXPECT_NE(BlockHash(swapped.data(), swapped.size(), 7), h);
  std::vector<uint8_t> longer = block;
  longer.push_back(0);  // the zero padding is not the block
  EXPECT_NE(BlockHash(longer.data(), longer.size(), 7), h);
  EXPECT_NE(BlockHash(block.data(), block.size(), 8), h);
  std::vector<uint8_t> zeros(1024, 0);
  std::unordered_set<uint64_t> seen;
  for (uint64_t n = 0; n <= 1024; n += 16) seen.insert(BlockHash(zeros.data(), n, 7));
  EXPECT_EQ(seen.size(), 65u) << "zero blocks of different lengths collide";
}

}  // namespace
}  // namespace kvtier::tiers
