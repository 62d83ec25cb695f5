// Every metric of tools/quality/metrics.h against a hand-computed case.
#include <gtest/gtest.h>

#include <cmath>

#include "tools/quality/codecs.h"
#include "tools/quality/metrics.h"

namespace kvtier::quality {
namespace {

TEST(Metrics, ErrorStatsHandCase) {
  const float x[] = {1, -2, 0, 4, 0.5f};
  const float q[] = {1, -1.5f, 0, 3, 0};
  const uint8_t f[] = {0, 0, 0, kFlagClipped | kFlagSaturated, 0};
  ErrorStats e;
  for (int i = 0; i < 5; ++i) e.Add(x[i], q[i], f[i]);
  // sse = 0 + 0.25 + 0 + 1 + 0.25 = 1.5; sum x^2 = 21.25; x.q = 16; sum q^2 = 12.25.
  EXPECT_DOUBLE_EQ(e.mse(), 1.5 / 5);
  EXPECT_DOUBLE_EQ(e.rmse(), std::sqrt(0.3));
  EXPECT_DOUBLE_EQ(e.nmse(), 1.5 / 21.25);
  EXPECT_DOUBLE_EQ(e.max_abs, 1.0);
  EXPECT_DOUBLE_EQ(e.cosine(), 16.0 / (std::sqrt(21.25) * 3.5));
  EXPECT_DOUBLE_EQ(e.zero_ratio(), 2.0 / 5);     // the 0 and the flushed 0.5
  EXPECT_DOUBLE_EQ(e.flushed_ratio(), 1.0 / 5);  // only 0.5 -> 0
  EXPECT_DOUBLE_EQ(e.clip_ratio(), 1.0 / 5);
  EXPECT_DOUBLE_EQ(e.saturation_ratio(), 1.0 / 5);
}

TEST(Metrics, MergeEqualsAddingEverything) {
  ErrorStats a, b, all;
  for (int i = 0; i < 10; ++i) {
    const float x = static_cast<float>(i) - 4.5f, q = x * 0.9f;
    (i < 4 ? a : b).Add(x, q, static_cast<uint8_t>(i % 3));
    all.Add(x, q, static_cast<uint8_t>(i % 3));
  }
  a.Merge(b);
  EXPECT_EQ(a.n, all.n);
  EXPECT_DOUBLE_EQ(a.sse, all.sse);
  EXPECT_DOUBLE_EQ(a.max_abs, all.max_abs);
  EXPECT_EQ(a.clipped, all.clipped);
  EXPECT_EQ(a.saturated, all.saturated);
  EXPECT_DOUBLE_EQ(a.cosine(), all.cosine());
}

TEST(Metrics, CosineAndNmseEdgeCases) {
  ErrorStats zero;
  zero.Add(0, 0, 0);
  EXPECT_DOUBLE_EQ(zero.cosine(), 1.0);
  EXPECT_DOUBLE_EQ(zero.nmse(), 0.0);
  ErrorStats lost;
  lost.Add(2, 0, 0);
  EXPECT_DOUBLE_EQ(lost.cosine(), 0.0);
  EXPECT_DOUBLE_EQ(lost.nmse(), 1.0);
  ErrorStats invented;
  invented.Add(0, 1, 0);
  EXPECT_TRUE(std::isinf(invented.nmse()));
  ErrorStats neg;
  neg.Add(1, -1, 0);
  EXPECT_DOUBLE_EQ(neg.cosine(), -1.0);
}

TEST(Metrics, AttentionHandCase) {
  // D = 4, scale 1/2. q = (2,0,0,0); k0 = 0, k1 = (ln 3, 0, 0, 0): logits 0 and ln 3,
  // p = (1/4, 3/4). v0 = (4,0,0,0), v1 = (0,4,0,0): o = (1, 3, 0, 0).
  const float q[4] = {2, 0, 0, 0};
  const float k[8] = {0, 0, 0, 0, static_cast<float>(std::log(3.0)), 0, 0, 0};
  const float v[8] = {4, 0, 0, 0, 0, 4, 0, 0};
  std::vector<double> lp, o;
  AttentionLogProbs(q, k, 2, 4, 4, &lp);
  ASSERT_EQ(lp.size(), 2u);
  EXPECT_NEAR(std::exp(lp[0]), 0.25, 1e-7);
  EXPECT_NEAR(std::exp(lp[1]), 0.75, 1e-7);
  AttentionOutput(lp, v, 4, 4, &o);
  EXPECT_NEAR(o[0], 1.0, 1e-6);
  EXPECT_NEAR(o[1], 3.0, 1e-6);
  EXPECT_EQ(o[2], 0.0);
  // Stride: keys interleaved with another head (stride 8) give the same answer.
  const float k2[16] = {0, 0, 0, 0, 9, 9, 9, 9, static_cast<float>(std::log(3.0)), 0, 0, 0, 9, 9, 9, 9};
  std::vector<double> lp2;
  AttentionLogProbs(q, k2, 2, 8, 4, &lp2);
  EXPECT_NEAR(lp2[1], lp[1], 1e-12);
}

TEST(Metrics, BatchedAttentionIsBitIdenticalToSingleQueries) {
  const size_t T = 37, D = 64, stride = 3 * D, nq = 5;
  std::vector<float> k(T * stride), v(T * stride), q(nq * D);
  uint32_t s = 12345;
  auto rnd = [&] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / (1 << 21);
  };
  for (auto& x : k) x = rnd();
  for (auto& x : v) x = rnd();
  for (auto& x : q) x = rnd();
  std::vector<const float*> qs;
  for (size_t i = 0; i < nq; ++i) qs.push_back(&q[i * D]);
  std::vector<double> blp, bp, bout;
  BatchAttentionLogProbs(qs, k.data() + D, T, stride, D, &blp, &bp);
  BatchAttentionOutput(bp, nq, v.data() + D, T, stride, D, &bout);
  for (size_t i = 0; i < nq; ++i) {
    std::vector<double> lp, o;
    AttentionLogProbs(qs[i], k.data() + D, T, stride, D, &lp);
    AttentionOutput(lp, v.data() + D, stride, D, &o);
    for (size_t t = 0; t < T; ++t) {
      ASSERT_EQ(lp[t], blp[i * T + t]);
      ASSERT_EQ(std::exp(lp[t]), bp[i * T + t]);
    }
    for (size_t d = 0; d < D; ++d) ASSERT_EQ(o[d], bout[i * D + d]);
  }
}

TEST(Metrics, KlAndRelativeError) {
  const double p[2] = {std::log(0.25), std::log(0.75)};
  const double u[2] = {std::log(0.5), std::log(0.5)};
  EXPECT_NEAR(KlDivergence(p, u), 0.25 * std::log(0.5) + 0.75 * std::log(1.5), 1e-15);
  EXPECT_EQ(KlDivergence(p, p), 0.0);
  const double a[2] = {3, 4}, b[2] = {3, 0};
  EXPECT_DOUBLE_EQ(RelativeError(a, b), 0.8);
  EXPECT_DOUBLE_EQ(SquaredDistance(a, b), 16.0);
  EXPECT_DOUBLE_EQ(SquaredNorm(a), 25.0);
  const double z[2] = {0, 0};
  EXPECT_EQ(RelativeError(z, z), 0.0);
  EXPECT_TRUE(std::isinf(RelativeError(z, a)));
}

TEST(Metrics, AttnStats) {
  AttnStats s;
  s.Add(0.1, 0.04, 1.0);   // rel 0.2
  s.Add(0.3, 0.01, 4.0);   // rel 0.05
  EXPECT_DOUBLE_EQ(s.kl_mean(), 0.2);
  EXPECT_DOUBLE_EQ(s.kl_max, 0.3);
  EXPECT_DOUBLE_EQ(s.rel_mean(), 0.125);
  EXPECT_DOUBLE_EQ(s.rel_max, 0.2);
  EXPECT_DOUBLE_EQ(s.pooled_rel(), std::sqrt(0.05 / 5.0));
  AttnStats t;
  t.Add(0.0, 1.0, 0.0);  // a zero reference output with an error: infinite ratio
  EXPECT_TRUE(std::isinf(t.rel_max));
  EXPECT_DOUBLE_EQ(SafeRatio(0, 0), 0.0);
}

TEST(Metrics, ScaleHistogram) {
  ScaleHistogram h;
  h.Add(1.0, false, false);    // bin 0
  h.Add(0.75, true, false);    // bin -1
  h.Add(3.0, false, true);     // bin 1
  h.Add(0.0, false, false);    // zero
  EXPECT_EQ(h.blocks, 4u);
  EXPECT_EQ(h.zero, 1u);
  EXPECT_EQ(h.subnormal, 1u);
  EXPECT_EQ(h.clamped, 1u);
  EXPECT_EQ(h.log2_bins.at(-1), 1u);
  EXPECT_EQ(h.log2_bins.at(0), 1u);
  EXPECT_EQ(h.log2_bins.at(1), 1u);
  EXPECT_EQ(h.QuantileLog2(0.0), -1);
  EXPECT_EQ(h.QuantileLog2(0.5), 0);  // 1.5 of 3 non-zero scales
  EXPECT_EQ(h.QuantileLog2(1.0), 1);
}

}  // namespace
}  // namespace kvtier::quality
