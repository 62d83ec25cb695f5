// NVFP4 codec: element formats, rounding, scale rules, packing, validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "formats/nvfp4.h"

namespace kvtier::nvfp4 {
namespace {

// Slow, obviously-correct E4M3 (e4m3fn) RNE-SATFINITE reference over the value grid.
uint8_t SlowE4M3(float v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(v));
  if (a >= 448.0) return sign | 0x7E;
  // Find the two neighbouring codes among the non-negative finite codes 0..0x7E.
  uint8_t best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c <= 0x7E; ++c) {
    const double val = E4M3ToFloat(static_cast<uint8_t>(c));
    const double err = std::fabs(val - a);
    // Ties go to the even code (mantissa LSB 0).
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = static_cast<uint8_t>(c);
      best_err = err;
    }
  }
  return sign | best;
}

TEST(E4M3, AllCodesRoundTrip) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float f = E4M3ToFloat(code);
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << c;
      continue;
    }
    EXPECT_EQ(FloatToE4M3(f), code) << "code " << c << " value " << f;
  }
}

TEST(E4M3, KnownValues) {
  EXPECT_EQ(E4M3ToFloat(0x7E), 448.0f);
  EXPECT_EQ(E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4M3ToFloat(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(FloatToE4M3(1000.0f), 0x7E);
  EXPECT_EQ(FloatToE4M3(std::numeric_limits<float>::infinity()), 0x7E);
  EXPECT_EQ(FloatToE4M3(-1000.0f), 0xFE);
  EXPECT_EQ(FloatToE4M3(0.0f), 0x00);
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.0f, -11)), 0x00);  // below half the smallest subnormal
}

TEST(E4M3, MatchesSlowReferenceOnMidpointsAndNeighbours) {
  // Every midpoint between adjacent codes, and the floats just around it.
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = E4M3ToFloat(static_cast<uint8_t>(c));
    const float hi = E4M3ToFloat(static_cast<uint8_t>(c + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), lo, hi}) {
      EXPECT_EQ(FloatToE4M3(v), SlowE4M3(v)) << "v=" << v;
      EXPECT_EQ(FloatToE4M3(-v), SlowE4M3(-v)) << "v=" << -v;
    }
  }
}

TEST(E4M3, MatchesSlowReferenceOnRandomFloats) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> exp(-14.0f, 9.5f);
  for (int i = 0; i < 20000; ++i) {
    const float v = std::exp2(exp(rng)) * ((rng() & 1) ? -1.0f : 1.0f);
    ASSERT_EQ(FloatToE4M3(v), SlowE4M3(v)) << "v=" << v;
  }
}

TEST(E2M1, GridValues) {
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(E2M1ToFloat(static_cast<uint8_t>(c)), grid[c]);
    EXPECT_EQ(E2M1ToFloat(static_cast<uint8_t>(c | 8)), -grid[c]);
    EXPECT_EQ(FloatToE2M1(grid[c]), c);
    if (c > 0) {
      EXPECT_EQ(FloatToE2M1(-grid[c]), c | 8);
    }
  }
}

TEST(E2M1, RoundingAtAndAroundEveryTie) {
  struct Tie {
    float at;
    uint8_t at_code, below_code, above_code;
  };
  // Ties round to the even mantissa: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4.
  const Tie ties[] = {{0.25f, 0, 0, 1}, {0.75f, 2, 1, 2}, {1.25f, 2, 2, 3}, {1.75f, 4, 3, 4},
                      {2.5f, 4, 4, 5},  {3.5f, 6, 5, 6},  {5.0f, 6, 6, 7}};
  for (const auto& t : ties) {
    EXPECT_EQ(FloatToE2M1(t.at), t.at_code) << t.at;
    EXPECT_EQ(FloatToE2M1(std::nextafter(t.at, 0.0f)), t.below_code) << t.at;
    EXPECT_EQ(FloatToE2M1(std::nextafter(t.at, 100.0f)), t.above_code) << t.at;
    EXPECT_EQ(FloatToE2M1(-t.at), t.at_code | 8) << -t.at;
  }
  EXPECT_EQ(FloatToE2M1(6.0f), 7);
  EXPECT_EQ(FloatToE2M1(1e30f), 7);     // saturates
  EXPECT_EQ(FloatToE2M1(-1e30f), 15);
  EXPECT_EQ(FloatToE2M1(-0.1f), 8);     // negative rounding to zero keeps its sign: -0
  EXPECT_EQ(FloatToE2M1(0.1f), 0);
}

std::vector<float> RandomGaussian(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

float GroupSquaredError(const float* x, const uint8_t* packed, uint8_t sf, float kv_scale) {
  float err = 0.0f;
  for (int i = 0; i < 16; ++i) {
    const uint8_t code = (packed[i / 2] >> ((i & 1) * 4)) & 0xF;
    const float d = E2M1ToFloat(code) * (E4M3ToFloat(sf) * kv_scale) - x[i];
    err += d * d;
  }
  return err;
}

TEST(ScaleRule, FourOverSixNeverWorseThanMax6) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> spread(-8.0f, 8.0f);
  int picked4 = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    float x[16];
    const float scale = std::exp2(spread(rng));
    std::normal_distribution<float> d(0.0f, scale);
    for (float& v : x) v = d(rng);
    if (trial % 7 == 0) x[trial % 16] *= 20.0f;  // an outlier now and then
    uint8_t p6[8], p4[8];
    const uint8_t sf6 = QuantizeGroup(x, 1.0f, ScaleRule::kMax6, p6);
    const uint8_t sf4 = QuantizeGroup(x, 1.0f, ScaleRule::k4over6, p4);
    const float e6 = GroupSquaredError(x, p6, sf6, 1.0f);
    const float e4 = GroupSquaredError(x, p4, sf4, 1.0f);
    ASSERT_LE(e4, e6) << "seed " << seed << " trial " << trial;
    picked4 += (sf4 != sf6);
  }
  EXPECT_GT(picked4, 0) << "4over6 never chose amax/4: the rule is not exercised";
}

TEST(Codec, PackingLowNibbleIsEvenElement) {
  float x[16] = {};
  x[0] = 6.0f;   // code 7
  x[1] = -1.0f;  // code 0xA
  x[14] = 0.5f;  // code 1
  x[15] = 3.0f;  // code 5
  uint8_t packed[8];
  const uint8_t sf = QuantizeGroup(x, 1.0f, ScaleRule::kMax6, packed);
  EXPECT_EQ(sf, FloatToE4M3(1.0f));  // amax 6 -> scale 1
  EXPECT_EQ(packed[0], 0xA7);
  EXPECT_EQ(packed[7], 0x51);
  for (int j = 1; j < 7; ++j) EXPECT_EQ(packed[j], 0) << j;
}

TEST(Codec, AllZeroGroupHasZeroScaleAndCodes) {
  float x[16] = {};
  x[3] = -0.0f;
  uint8_t packed[8];
  for (auto rule : {ScaleRule::kMax6, ScaleRule::k4over6}) {
    std::memset(packed, 0xCC, sizeof packed);
    EXPECT_EQ(QuantizeGroup(x, 1.0f, rule, packed), 0);
    for (uint8_t b : packed) EXPECT_EQ(b, 0);
  }
}

TEST(Codec, HandComputedGroup) {
  // kv_scale 0.5, amax 3 -> sf = E4M3(3/6/0.5 = 1.0) = 0x38, s = 0.5.
  float x[16];
  for (int i = 0; i < 16; ++i) x[i] = (i - 8) * 0.375f;  // -3 .. 2.625
  uint8_t packed[8];
  const uint8_t sf = QuantizeGroup(x, 0.5f, ScaleRule::kMax6, packed);
  EXPECT_EQ(sf, 0x38);
  // x/s = (i-8)*0.75: -6,-5.25,-4.5,-3.75,-3,-2.25,-1.5,-0.75,0,0.75,1.5,2.25,3,3.75,4.5,5.25
  const uint8_t expect[16] = {0xF, 0xF, 0xE, 0xE, 0xD, 0xC, 0xB, 0xA,
                              0x0, 0x2, 0x3, 0x4, 0x5, 0x6, 0x6, 0x7};
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ((packed[i / 2] >> ((i & 1) * 4)) & 0xF, expect[i]) << i;
  }
}

TEST(Codec, RandomRoundTripWithinFormatBound) {
  const uint32_t seed = std::random_device{}();
  for (auto rule : {ScaleRule::kMax6, ScaleRule::k4over6}) {
    for (float kv_scale : {1.0f, 0.01f, 3.5e-4f}) {
      auto x = RandomGaussian(4096, 0.7f, seed);
      std::vector<uint8_t> data(x.size() / 2), scales(x.size() / 16);
      ASSERT_TRUE(Quantize(x, kv_scale, rule, data, scales).ok());
      std::vector<float> y(x.size(), std::numeric_limits<float>::quiet_NaN());
      ASSERT_TRUE(Dequantize(data, scales, kv_scale, y).ok());
      double se = 0, ss = 0;
      int saturated = 0;
      for (size_t g = 0; g < x.size() / 16; ++g) {
        const float s = E4M3ToFloat(scales[g]) * kv_scale;
        if (scales[g] == kE4M3MaxCode) {
          // The block scale saturated at 448 (kv_scale too small for this block): values
          // beyond 6 s clip to +-6 s, the rest keep the normal bound.
          ++saturated;
        }
        for (size_t i = g * 16; i < g * 16 + 16; ++i) {
          ASSERT_FALSE(std::isnan(y[i]));
          if (std::fabs(x[i]) > 6.0f * s) {
            // A scale rounded down (E4M3 keeps 3 mantissa bits, so by at most 1/16)
            // clips the group's largest values to +-6 s; anything further out means the
            // scale saturated at 448.
            ASSERT_EQ(std::fabs(y[i]), DecodeValue(7, scales[g], kv_scale)) << "clip to 6 s";
            if (std::fabs(x[i]) > 6.0f * s * (1.0f + 1.0f / 15.0f) * 1.0001f) {
              ASSERT_EQ(scales[g], kE4M3MaxCode) << "only a saturated scale clips this far";
            }
            continue;
          }
          // Worst case: half the widest E2M1 step (4 -> 6) times s, or the clip of a
          // value the rounded-down scale put just beyond 6 (< 0.5 s).
          ASSERT_LE(std::fabs(y[i] - x[i]), 1.0f * s + 1e-6f)
              << "seed " << seed << " i " << i << " rule " << int(rule);
          se += (y[i] - x[i]) * (y[i] - x[i]);
          ss += x[i] * x[i];
        }
      }
      if (saturated == 0) {
        EXPECT_LT(std::sqrt(se / ss), 0.15) << "relative RMSE too large, seed " << seed;
      }
    }
  }
}

TEST(Codec, DecodeValueMatchesArrayDequantize) {
  auto x = RandomGaussian(256, 2.0f, 7);
  std::vector<uint8_t> data(128), scales(16);
  ASSERT_TRUE(Quantize(x, 0.02f, ScaleRule::k4over6, data, scales).ok());
  std::vector<float> y(256);
  ASSERT_TRUE(Dequantize(data, scales, 0.02f, y).ok());
  for (size_t i = 0; i < 256; ++i) {
    const uint8_t code = (data[i / 2] >> ((i & 1) * 4)) & 0xF;
    EXPECT_EQ(DecodeValue(code, scales[i / 16], 0.02f), y[i]);
  }
}

TEST(Codec, BadInputIsRefusedAndWritesNothing) {
  std::vector<float> x(32, 1.0f);
  std::vector<uint8_t> data(16, 0xAB), scales(2, 0xAB);
  auto untouched = [&] {
    for (uint8_t b : data) if (b != 0xAB) return false;
    for (uint8_t b : scales) if (b != 0xAB) return false;
    return true;
  };
  std::vector<float> odd(20, 1.0f);
  EXPECT_TRUE(Quantize(odd, 1.0f, ScaleRule::kMax6, data, scales).IsInvalid());
  x[17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(Quantize(x, 1.0f, ScaleRule::kMax6, data, scales).IsInvalid());
  x[17] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(Quantize(x, 1.0f, ScaleRule::kMax6, data, scales).IsInvalid());
  x[17] = 1.0f;
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), 1e-45f,
                    std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_TRUE(Quantize(x, bad, ScaleRule::kMax6, data, scales).IsInvalid()) << bad;
  }
  std::vector<uint8_t> short_data(15);
  EXPECT_TRUE(Quantize(x, 1.0f, ScaleRule::kMax6, short_data, scales).IsInvalid());
  EXPECT_TRUE(untouched());
  // A NaN block scale in stored bytes is corrupt, not data.
  std::vector<uint8_t> nan_scales = {0x38, 0x7F};
  std::vector<float> out(32);
  EXPECT_TRUE(Dequantize(data, nan_scales, 1.0f, out).IsCorrupt());
}

// The published comparison (background article 002): 4096 N(0, 0.02) values with 8
// outliers of 6.0. Block NVFP4 keeps the small values; one global 4-bit scale flushes
// them to zero. The article's script keeps block scales in exact float (RMSE 0.0034);
// real NVFP4 rounds them to E4M3, which is as good only when the global scale puts the
// block scales in E4M3's normal range: kv_scale = amax / (448 * 6), the calibrated
// scale. Left at 1.0 (as the published NVFP4 KV results did), the block scales of the
// small groups fall into E4M3's subnormals and the error grows (printed, not asserted).
// The article's 0.0034 is one draw: over seeds, exact-float block scales give
// 0.0034..0.0042 (checked with the article's own script), so the test asserts that band.
TEST(Codec, PublishedOutlierComparison) {
  auto x = RandomGaussian(4096, 0.02f, 2024);
  for (int i = 0; i < 8; ++i) x[i * 512 + 37] = 6.0f;
  std::vector<uint8_t> data(2048), scales(256);
  const float kv_scale = GlobalScaleFromAmax(6.0f);
  ASSERT_TRUE(Quantize(x, kv_scale, ScaleRule::kMax6, data, scales).ok());
  std::vector<float> y(4096), g(4096), u(4096);
  ASSERT_TRUE(Dequantize(data, scales, kv_scale, y).ok());
  ASSERT_TRUE(Quantize(x, 1.0f, ScaleRule::kMax6, data, scales).ok());
  ASSERT_TRUE(Dequantize(data, scales, 1.0f, u).ok());
  double se_unit = 0;
  for (size_t i = 0; i < x.size(); ++i) se_unit += (u[i] - x[i]) * (u[i] - x[i]);
  QuantizeDequantizeGlobalOnly(x, g);
  double se_block = 0, se_global = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    se_block += (y[i] - x[i]) * (y[i] - x[i]);
    se_global += (g[i] - x[i]) * (g[i] - x[i]);
  }
  const double rmse_block = std::sqrt(se_block / x.size());
  const double rmse_global = std::sqrt(se_global / x.size());
  EXPECT_GT(rmse_block, 0.0028);
  EXPECT_LT(rmse_block, 0.0046);
  EXPECT_GT(rmse_global / rmse_block, 4.0);
  EXPECT_NEAR(rmse_global, 0.0196, 0.0015);
  std::printf("published check: block NVFP4 RMSE %.5f (kv_scale 1.0: %.5f), "
              "global-only 4-bit RMSE %.5f\n",
              rmse_block, std::sqrt(se_unit / x.size()), rmse_global);
}

}  // namespace
}  // namespace kvtier::nvfp4

namespace kvtier::nvfp4 {
namespace {

// The vectorized CPU path must produce exactly the bytes of the portable rule.
TEST(Codec, FastPathBitIdenticalToPortableRule) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> spread(-30.0f, 30.0f);
  const size_t n = 1 << 16;
  std::vector<float> x(n);
  for (size_t g = 0; g < n / 16; ++g) {
    const int kind = static_cast<int>(g % 8);
    const float scale = std::exp2(spread(rng) / 2);
    std::normal_distribution<float> d(0.0f, scale);
    for (size_t i = g * 16; i < g * 16 + 16; ++i) {
      float v = d(rng);
      if (kind == 1) v = 0.0f;                     // all-zero group
      if (kind == 2 && (i % 3 == 0)) v = -0.0f;    // negative zeros
      if (kind == 3) v = std::ldexp(v, -120);      // scale underflows to 0 / subnormal
      if (kind == 4 && i % 16 == 5) v *= 1000.0f;  // outlier
      if (kind == 5) v = std::round(v);            // values on the grid
      x[i] = v;
    }
  }
  for (auto rule : {ScaleRule::kMax6, ScaleRule::k4over6}) {
    for (float kv : {1.0f, 1e-3f, 7.5f, 1e-30f}) {
      std::vector<uint8_t> d1(n / 2), s1(n / 16), d2(n / 2), s2(n / 16);
      QuantizeUnchecked(x.data(), n, kv, rule, d1.data(), s1.data());
      QuantizeUncheckedScalar(x.data(), n, kv, rule, d2.data(), s2.data());
      ASSERT_EQ(s1, s2) << "seed " << seed << " kv " << kv;
      ASSERT_EQ(d1, d2) << "seed " << seed << " kv " << kv;
    }
  }
}

}  // namespace
}  // namespace kvtier::nvfp4
