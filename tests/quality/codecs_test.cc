// The comparison codecs against their definitions, written here independently of the
// code under test (grids enumerated from the format definitions, nearest value with
// ties to even), and the 4over6 >= max6 property per block.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "formats/nvfp4.h"
#include "tools/quality/codecs.h"

namespace kvtier::quality {
namespace {

// E4M3 (e4m3fn) non-negative finite values by code 0..126, from the format definition.
double E4M3Value(int code) {
  const int e = code >> 3, m = code & 7;
  return e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
}

// Nearest E4M3 value to v (ties to the even code), saturating at 448.
double E4M3Ref(double v) {
  const double a = std::fabs(v);
  int best = 0;
  for (int c = 1; c <= 126; ++c) {
    const double d = std::fabs(E4M3Value(c) - a), db = std::fabs(E4M3Value(best) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  if (a >= 448) best = 126;
  return std::copysign(E4M3Value(best), v);
}

// Nearest E2M1 magnitude (ties to the even index), saturating at 6.
double E2M1Ref(double v) {
  static const double grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  const double a = std::fabs(v);
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    const double d = std::fabs(grid[i] - a), db = std::fabs(grid[best] - a);
    if (d < db || (d == db && (i & 1) == 0)) best = i;
  }
  return std::copysign(grid[best], v);
}

// OCP MX v1.0 MXFP4 block: X = 2^(floor(log2(amax)) - 2), clamped to [2^-127, 2^127].
std::vector<double> Mxfp4Ref(const float* x, size_t n) {
  double amax = 0;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  int e = -127;
  if (amax > 0) {
    int fl = 0;  // floor(log2(amax)) by counting
    while (std::ldexp(1.0, fl) > amax) --fl;
    while (std::ldexp(1.0, fl + 1) <= amax) ++fl;
    e = std::clamp(fl - 2, -127, 127);
  }
  const double X = std::ldexp(1.0, e);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = E2M1Ref(x[i] / X) * X;
  return out;
}

std::vector<float> Random(size_t n, uint64_t seed, double lo_log2 = -12, double hi_log2 = 8) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::uniform_real_distribution<double> mag(lo_log2, hi_log2);
  std::vector<float> x(n);
  for (size_t base = 0; base < n; base += 32) {
    const float s = static_cast<float>(std::exp2(mag(rng)));  // each block its own magnitude
    for (size_t i = base; i < base + 32 && i < n; ++i) x[i] = normal(rng) * s;
  }
  return x;
}

TEST(Fp8, RoundTripMatchesTheE4M3Grid) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> lg(-12, 10);
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>((i & 1 ? -1 : 1) * std::exp2(lg(rng)));
    const float s = static_cast<float>(std::exp2(lg(rng) - 4));
    uint8_t code;
    const float got = Fp8RoundTrip(x, s, &code);
    const double want = E4M3Ref(static_cast<double>(x / s)) * s;
    ASSERT_EQ(got, static_cast<float>(want)) << "x=" << x << " s=" << s;
  }
  // Ties: 1 + 1/16 lies halfway between 1 and 1.125 -> the even code (1.0).
  uint8_t code;
  EXPECT_EQ(Fp8RoundTrip(1.0625f, 1.0f, &code), 1.0f);
  EXPECT_EQ(Fp8RoundTrip(1.1875f, 1.0f, &code), 1.25f);  // between 1.125 and 1.25 -> 1.25
  EXPECT_EQ(Fp8RoundTrip(1000.0f, 1.0f, &code), 448.0f); // saturates
}

TEST(Fp8, PerTensorAndPerTokenHeadFollowTheirScales) {
  const size_t D = 64, rows = 8;
  std::vector<float> x = Random(D * rows, 3, -10, 6);
  QuantResult t, r;
  ASSERT_TRUE(QuantizeDequantize(Codec::kFp8Tensor, x, D, 1.0f, &t).ok());
  ASSERT_TRUE(QuantizeDequantize(Codec::kFp8TokenHead, x, D, 1.0f, &r).ok());
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float s = amax / 448.0f;
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(t.dq[i], static_cast<float>(E4M3Ref(static_cast<double>(x[i] / s)) * s)) << i;
  }
  EXPECT_EQ(t.scales.blocks, 1u);
  for (size_t row = 0; row < rows; ++row) {
    float ra = 0;
    for (size_t d = 0; d < D; ++d) ra = std::max(ra, std::fabs(x[row * D + d]));
    const float rs = ra / 448.0f;
    for (size_t d = 0; d < D; ++d) {
      const size_t i = row * D + d;
      ASSERT_EQ(r.dq[i], static_cast<float>(E4M3Ref(static_cast<double>(x[i] / rs)) * rs)) << i;
    }
  }
  EXPECT_EQ(r.scales.blocks, rows);
}

TEST(Mxfp4, ScaleIsFloorLog2MinusTwo) {
  EXPECT_EQ(Mxfp4ScaleByte(6.0f), 127);     // floor(log2 6) = 2 -> 2^0
  EXPECT_EQ(Mxfp4ScaleByte(4.0f), 127);
  EXPECT_EQ(Mxfp4ScaleByte(7.99f), 127);
  EXPECT_EQ(Mxfp4ScaleByte(8.0f), 128);
  EXPECT_EQ(Mxfp4ScaleByte(1.0f), 125);     // 2^-2
  EXPECT_EQ(Mxfp4ScaleByte(0.3f), 123);     // floor(log2 0.3) = -2 -> 2^-4
  EXPECT_EQ(Mxfp4ScaleByte(std::ldexp(1.0f, -140)), 0);  // clamped to 2^-127
  EXPECT_EQ(Mxfp4ScaleByte(0.0f), 0);
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(E8M0ToFloat(125), 0.25f);
  // amax 7.9 -> X = 1: 7.9 clips to 6 and is flagged; 0.3 * 16 = 4.8 -> 4.
  float b[32] = {7.9f, -3.4f, 0.24f, 0.26f};
  QuantResult r;
  ASSERT_TRUE(QuantizeDequantize(Codec::kMxfp4, b, 32, 1.0f, &r).ok());
  EXPECT_EQ(r.dq[0], 6.0f);
  EXPECT_EQ(r.flags[0], kFlagClipped | kFlagSaturated);
  EXPECT_EQ(r.dq[1], -3.0f);
  EXPECT_EQ(r.dq[2], 0.0f);
  EXPECT_EQ(r.dq[3], 0.5f);
  EXPECT_EQ(r.flags[1], 0);
}

TEST(Mxfp4, MatchesTheOcpDefinitionOnRandomBlocks) {
  std::vector<float> x = Random(32 * 2000, 11, -30, 30);
  QuantResult r;
  ASSERT_TRUE(QuantizeDequantize(Codec::kMxfp4, x, 64, 1.0f, &r).ok());
  for (size_t base = 0; base < x.size(); base += 32) {
    const auto want = Mxfp4Ref(x.data() + base, 32);
    for (size_t i = 0; i < 32; ++i) {
      ASSERT_EQ(r.dq[base + i], static_cast<float>(want[i])) << base + i;
    }
  }
  EXPECT_EQ(r.scales.blocks, x.size() / 32);
}

TEST(Nvfp4, RoundTripIsTheFormatsCodec) {
  std::vector<float> x = Random(128 * 64, 5, -8, 6);
  for (auto [codec, rule] : {std::pair{Codec::kNvfp4Max6, nvfp4::ScaleRule::kMax6},
                             std::pair{Codec::kNvfp4FourOverSix, nvfp4::ScaleRule::k4over6}}) {
    for (float kv : {1.0f, 0.01f}) {
      QuantResult r;
      ASSERT_TRUE(QuantizeDequantize(codec, x, 128, kv, &r).ok());
      std::vector<uint8_t> data(x.size() / 2), sf(x.size() / 16);
      ASSERT_TRUE(nvfp4::Quantize(x, kv, rule, data, sf).ok());
      std::vector<float> want(x.size());
      ASSERT_TRUE(nvfp4::Dequantize(data, sf, kv, want).ok());
      ASSERT_EQ(r.dq, want);
      EXPECT_EQ(r.scales.blocks, x.size() / 16);
    }
  }
}

TEST(Nvfp4, FourOverSixNeverWorseThanMax6PerBlock) {
  int strictly_better = 0, blocks = 0;
  for (uint64_t seed = 0; seed < 4; ++seed) {
    std::vector<float> x = Random(16 * 4096, 100 + seed, -10, 8);
    if (seed == 3) {
      for (size_t i = 0; i < x.size(); i += 16) x[i] *= 20.0f;  // one outlier per block
    }
    for (float kv : {1.0f, 0.003f}) {
      QuantResult m6, m4;
      ASSERT_TRUE(QuantizeDequantize(Codec::kNvfp4Max6, x, 64, kv, &m6).ok());
      ASSERT_TRUE(QuantizeDequantize(Codec::kNvfp4FourOverSix, x, 64, kv, &m4).ok());
      for (size_t b = 0; b < x.size(); b += 16) {
        double e6 = 0, e4 = 0;
        for (size_t i = b; i < b + 16; ++i) {
          e6 += std::pow(static_cast<double>(m6.dq[i]) - x[i], 2);
          e4 += std::pow(static_cast<double>(m4.dq[i]) - x[i], 2);
        }
        // The rule compares float32 sums, so allow float32 rounding of the sum.
        ASSERT_LE(e4, e6 * (1 + 1e-6)) << "block " << b / 16 << " kv " << kv;
        strictly_better += e4 < e6 * (1 - 1e-6);
        ++blocks;
      }
    }
  }
  EXPECT_GT(strictly_better, blocks / 10) << "4over6 should win on a good share of blocks";
}

TEST(Nvfp4, ScaleHistogramCountsSubnormalAndClampedScales) {
  // kv 1.0: a block with amax 0.03 wants sf 0.005 (E4M3 subnormal); amax 6000 wants
  // 1000 > 448 (clamped); amax 2688 wants exactly 448 (not clamped).
  std::vector<float> x(64, 0.0f);
  x[0] = 0.03f;
  x[16] = 6000.0f;
  x[32] = 2688.0f;
  x[48] = 1.0f;
  QuantResult r;
  ASSERT_TRUE(QuantizeDequantize(Codec::kNvfp4Max6, x, 64, 1.0f, &r).ok());
  EXPECT_EQ(r.scales.blocks, 4u);
  EXPECT_EQ(r.scales.subnormal, 1u);
  EXPECT_EQ(r.scales.clamped, 1u);
  EXPECT_EQ(r.scales.zero, 0u);
  EXPECT_EQ(r.flags[16], kFlagClipped | kFlagSaturated);  // 6000 > 6 * 448
  EXPECT_EQ(r.dq[16], 2688.0f);
  EXPECT_EQ(r.flags[32], kFlagSaturated);
}

TEST(Codecs, RefuseBadInput) {
  std::vector<float> x(48, 1.0f);
  QuantResult r;
  EXPECT_TRUE(QuantizeDequantize(Codec::kMxfp4, x, 48, 1.0f, &r).IsInvalid());
  std::vector<float> y(64, 1.0f);
  y[5] = NAN;
  EXPECT_TRUE(QuantizeDequantize(Codec::kFp8Tensor, y, 64, 1.0f, &r).IsInvalid());
  y[5] = 1.0f;
  EXPECT_TRUE(QuantizeDequantize(Codec::kNvfp4Max6, y, 64, 0.0f, &r).IsInvalid());
  EXPECT_TRUE(QuantizeDequantize(Codec::kNvfp4Max6, y, 64, INFINITY, &r).IsInvalid());
  EXPECT_TRUE(QuantizeDequantize(Codec::kNvfp4Max6, y, 32, 1.0f, &r).ok());
  EXPECT_TRUE(QuantizeDequantize(Codec::kNvfp4Max6, std::span<const float>(y).first(40), 32, 1.0f, &r)
                  .IsInvalid());
}

}  // namespace
}  // namespace kvtier::quality
