// kvtier_nvfp4_encode / kvtier_nvfp4_decode (kvtier.h): the C ABI gives the bytes and values
// of the formats codec (formats/nvfp4.h) for both scale rules, and refuses bad arguments
// without writing.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "formats/nvfp4.h"
#include "kvtier/kvtier.h"

namespace {

namespace nv = kvtier::nvfp4;

std::vector<float> RandomValues(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng) * (rng() % 7 == 0 ? 40.0f : 1.0f);
  return x;
}

TEST(Nvfp4Abi, EncodeAndDecodeMatchTheCodec) {
  const size_t n = 4096;
  for (uint32_t rule : {0u, 1u}) {
    for (float kv : {1.0f, 0.0123f, 7.5e-4f}) {
      const std::vector<float> x = RandomValues(n, 17 + rule);
      std::vector<uint8_t> d1(n / 2, 0xEE), s1(n / 16, 0xEE), d2(n / 2), s2(n / 16);
      ASSERT_EQ(kvtier_nvfp4_encode(x.data(), n, kv, rule, d1.data(), s1.data()), KVTIER_OK) << kvtier_last_error();
      ASSERT_TRUE(nv::Quantize(x, kv, static_cast<nv::ScaleRule>(rule), d2, s2).ok());
      EXPECT_EQ(d1, d2);
      EXPECT_EQ(s1, s2);
      std::vector<float> y1(n, -1.0f), y2(n);
      ASSERT_EQ(kvtier_nvfp4_decode(d1.data(), s1.data(), n, kv, y1.data()), KVTIER_OK) << kvtier_last_error();
      ASSERT_TRUE(nv::Dequantize(d2, s2, kv, y2).ok());
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(std::bit_cast<uint32_t>(y1[i]), std::bit_cast<uint32_t>(y2[i])) << i;
    }
  }
}

TEST(Nvfp4Abi, RefusalsWriteNothing) {
  std::vector<float> x = RandomValues(32, 3);
  std::vector<uint8_t> d(16, 0x55), s(2, 0x55);
  EXPECT_EQ(kvtier_nvfp4_encode(x.data(), 24, 1.0f, 0, d.data(), s.data()), KVTIER_INVALID);
  EXPECT_NE(std::string(kvtier_last_error()).find("multiple of 16"), std::string::npos) << kvtier_last_error();
  EXPECT_EQ(kvtier_nvfp4_encode(x.data(), 32, 0.0f, 0, d.data(), s.data()), KVTIER_INVALID);
  EXPECT_EQ(kvtier_nvfp4_encode(x.data(), 32, std::numeric_limits<float>::infinity(), 0, d.data(), s.data()),
            KVTIER_INVALID);
  EXPECT_EQ(kvtier_nvfp4_encode(x.data(), 32, 1.0f, 2, d.data(), s.data()), KVTIER_INVALID);
  EXPECT_EQ(kvtier_nvfp4_encode(nullptr, 32, 1.0f, 0, d.data(), s.data()), KVTIER_INVALID);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(kvtier_nvfp4_encode(x.data(), 32, 1.0f, 0, d.data(), s.data()), KVTIER_INVALID);
  for (uint8_t b : d) EXPECT_EQ(b, 0x55);
  for (uint8_t b : s) EXPECT_EQ(b, 0x55);
  std::vector<float> y(32, 2.0f);
  s[1] = 0xFF;  // an E4M3 NaN scale
  EXPECT_EQ(kvtier_nvfp4_decode(d.data(), s.data(), 32, 1.0f, y.data()), KVTIER_CORRUPT);
  for (float v : y) EXPECT_EQ(v, 2.0f);
  EXPECT_EQ(kvtier_nvfp4_decode(d.data(), s.data(), 32, -1.0f, y.data()), KVTIER_INVALID);
  EXPECT_EQ(kvtier_nvfp4_decode(d.data(), s.data(), 20, 1.0f, y.data()), KVTIER_INVALID);
}

}  // namespace
