// The analysis driver on synthetic and exactly-representable KV, and its outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tools/quality/analyze.h"
#include "tools/quality/synth.h"

namespace kvtier::quality {
namespace {

SynthOptions Small() {
  SynthOptions o;
  o.layers = 2;
  o.kv_heads = 4;
  o.head_dim = 64;
  o.tokens = 128;
  o.queries = 4;
  o.q_per_kv = 2;
  return o;
}

TEST(Analyze, ExactlyRepresentableKvHasNoError) {
  // Every 16-value block holds a 6 and other E2M1 values: NVFP4 with global scale 1 gives
  // block scale 1 and is exact; MXFP4 (amax 6 -> X = 1) too.
  const KvShape sh{8, 2, 32};
  std::vector<float> k(8 * 2 * 32), v(k.size());
  const float grid[] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.5f, -1, -1.5f, -2, -3, -4, -6, 6};
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = grid[i % 16];
    v[i] = grid[(i * 7) % 16];
  }
  for (size_t b = 0; b < v.size(); b += 16) v[b] = 6;  // make sure each V block has a 6
  AnalyzeOptions o;
  auto r = AnalyzeLayer(0, k, v, sh, {}, 0, 1.0f, 1.0f, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (Codec c : {Codec::kNvfp4Max6, Codec::kNvfp4FourOverSix, Codec::kMxfp4}) {
    const int ci = static_cast<int>(c);
    EXPECT_EQ(r->k[ci].total.sse, 0.0) << CodecName(c);
    EXPECT_EQ(r->v[ci].total.sse, 0.0) << CodecName(c);
    EXPECT_DOUBLE_EQ(r->k[ci].total.cosine(), 1.0);
    EXPECT_EQ(r->attn[ci].kl_max, 0.0);
    EXPECT_EQ(r->attn[ci].rel_max, 0.0);
    EXPECT_EQ(r->attn[ci].n, 2u * 16u);  // 16 random queries per KV head
  }
  // FP8 per-tensor with s = 6/448 is not exact on this grid.
  EXPECT_GT(r->k[static_cast<int>(Codec::kFp8Tensor)].total.sse, 0.0);
}

TEST(Analyze, HeadsAndBucketsAddUpToTheTotal) {
  auto kv = GenerateSynthKv(Small());
  ASSERT_TRUE(kv.ok());
  AnalyzeOptions o;
  o.position_buckets = 5;
  auto r = AnalyzeLayer(0, kv->k[0], kv->v[0], kv->shape, kv->q[0], kv->q_heads, 0.01f, 0.001f, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (int ci = 0; ci < kNumCodecs; ++ci) {
    for (const SideResult* s : {&r->k[ci], &r->v[ci]}) {
      ErrorStats h, b;
      for (const auto& e : s->heads) h.Merge(e);
      for (const auto& e : s->buckets) b.Merge(e);
      EXPECT_EQ(s->heads.size(), 4u);
      EXPECT_EQ(s->buckets.size(), 5u);
      EXPECT_EQ(h.n, s->total.n);
      EXPECT_EQ(b.n, s->total.n);
      EXPECT_NEAR(h.sse, s->total.sse, 1e-9 * s->total.sse);
      EXPECT_NEAR(b.sse, s->total.sse, 1e-9 * s->total.sse);
    }
    // Supplied queries: 4 positions x 2 query heads per KV head.
    EXPECT_EQ(r->attn_heads[ci][0].n, 8u);
  }
}

TEST(Analyze, CodecsRankAsExpectedOnStructuredKv) {
  SynthOptions so = Small();
  so.head_dim = 128;
  so.tokens = 256;
  so.queries = 8;
  auto kv = GenerateSynthKv(so);
  ASSERT_TRUE(kv.ok());
  auto bytes = SynthToSafetensors(*kv, DType::kF32, so);
  ASSERT_TRUE(bytes.ok());
  auto view = SafetensorsView::Parse(*bytes);
  ASSERT_TRUE(view.ok());
  auto rep = Analyze(*view, "synth", AnalyzeOptions{});
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  ASSERT_EQ(rep->layers.size(), 2u);
  EXPECT_TRUE(rep->supplied_queries);
  auto ci = [](Codec c) { return static_cast<int>(c); };
  const auto& at = rep->attn_total;
  const auto& kt = rep->k_total;
  // 8-bit per-row FP8 beats every 4-bit codec; 4over6 is no worse than max6; NVFP4 (16-value
  // blocks, E4M3 scales) clearly beats MXFP4 (32-value blocks, power-of-two scales).
  EXPECT_LT(kt[ci(Codec::kFp8TokenHead)].nmse(), kt[ci(Codec::kNvfp4Max6)].nmse());
  EXPECT_LE(kt[ci(Codec::kNvfp4FourOverSix)].nmse(), kt[ci(Codec::kNvfp4Max6)].nmse());
  EXPECT_LT(at[ci(Codec::kNvfp4Max6)].pooled_rel() * 1.25, at[ci(Codec::kMxfp4)].pooled_rel());
  EXPECT_LT(at[ci(Codec::kNvfp4Max6)].kl_mean() * 2, at[ci(Codec::kMxfp4)].kl_mean());
  EXPECT_LT(at[ci(Codec::kFp8TokenHead)].pooled_rel(), at[ci(Codec::kNvfp4FourOverSix)].pooled_rel());
  EXPECT_GT(kt[ci(Codec::kMxfp4)].clip_ratio(), 0.0);  // values in (6, 8) * X clip
  // Worst lists are sorted and as long as asked.
  ASSERT_EQ(rep->worst_heads.size(), 5u);
  for (size_t i = 1; i < rep->worst_heads.size(); ++i) {
    EXPECT_GE(rep->worst_heads[i - 1].rel_err, rep->worst_heads[i].rel_err);
  }
  ASSERT_EQ(rep->worst_layers.size(), 2u);

  // Unit global scales are much worse for NVFP4 on small-magnitude V than calibrated ones.
  AnalyzeOptions unit;
  unit.scale_source = ScaleSource::kUnit;
  auto urep = Analyze(*view, "synth", unit);
  ASSERT_TRUE(urep.ok());
  EXPECT_GT(urep->v_total[ci(Codec::kNvfp4Max6)].nmse(), rep->v_total[ci(Codec::kNvfp4Max6)].nmse());
  // Codecs without a global scale do not care.
  EXPECT_EQ(urep->v_total[ci(Codec::kMxfp4)].sse, rep->v_total[ci(Codec::kMxfp4)].sse);

  // Outputs.
  const auto j = nlohmann::json::parse(ReportJson(*rep));
  EXPECT_EQ(j["layers"].size(), 2u);
  EXPECT_EQ(j["queries"]["source"], "supplied");
  EXPECT_EQ(j["layers"][0]["k"]["nvfp4-max6"]["heads"].size(), 4u);
  EXPECT_EQ(j["layers"][0]["attention"]["nvfp4-max6"]["heads"].size(), 4u);
  EXPECT_EQ(j["layers"][0]["v"]["mxfp4"]["buckets"].size(), 8u);
  EXPECT_TRUE(j["summary"]["fp8-tensor"]["attention"].contains("kl_mean"));
  EXPECT_EQ(j["worst"]["heads"].size(), 5u);
  const std::string table = ReportTable(*rep, true);
  EXPECT_NE(table.find("nvfp4-4over6"), std::string::npos);
  EXPECT_NE(table.find("worst heads"), std::string::npos);
  const std::string svg = ReportSvg(*rep, Codec::kMxfp4);
  size_t rects = 0;
  for (size_t p = svg.find("<rect"); p != std::string::npos; p = svg.find("<rect", p + 1)) ++rects;
  EXPECT_EQ(rects, 2u * 4u + 2u);  // cells + two legend swatches
}

TEST(Analyze, ScalesFromAFileMustCoverTheLayers) {
  SynthOptions so = Small();
  auto kv = GenerateSynthKv(so);
  auto bytes = SynthToSafetensors(*kv, DType::kBF16, so);
  auto view = SafetensorsView::Parse(*bytes);
  ASSERT_TRUE(view.ok());
  AnalyzeOptions o;
  o.scale_source = ScaleSource::kGiven;
  o.k_scales = o.v_scales = {0.01f};
  const Status s = Analyze(*view, "x", o).status();
  EXPECT_TRUE(s.IsInvalid());
  EXPECT_NE(s.message().find("scales file has 1 layers"), std::string::npos) << s.message();
  o.layers = {0};
  EXPECT_TRUE(Analyze(*view, "x", o).ok());
}

TEST(Synth, ValidatesAndIsDeterministic) {
  SynthOptions o = Small();
  auto a = GenerateSynthKv(o), b = GenerateSynthKv(o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->k[1], b->k[1]);
  EXPECT_EQ(a->q[0].size(), 4u * 8u * 64u);
  // The sink token has a much larger norm than the others.
  double n0 = 0, n1 = 0;
  for (size_t d = 0; d < 64; ++d) {
    n0 += std::pow(a->v[0][d], 2);
    n1 += std::pow(a->v[0][4 * 64 * 5 + d], 2);  // token 5, head 0
  }
  EXPECT_GT(n0, 16 * n1);
  SynthOptions bad = o;
  bad.head_dim = 48;
  EXPECT_TRUE(bad.Validate().IsInvalid());
  bad = o;
  bad.outlier_pairs = 17;
  EXPECT_TRUE(bad.Validate().IsInvalid());
  bad = o;
  bad.head_spread = 0.5f;
  EXPECT_TRUE(bad.Validate().IsInvalid());
  bad = o;
  bad.k_std = NAN;
  EXPECT_TRUE(bad.Validate().IsInvalid());
}

}  // namespace
}  // namespace kvtier::quality
