// Calibration: the statistic, the scales file, and that calibrating changes the contract id.
#include <gtest/gtest.h>

#include <cmath>

#include "formats/contract.h"
#include "formats/nvfp4.h"
#include "tools/quality/calibrate.h"
#include "tools/quality/synth.h"

namespace kvtier::quality {
namespace {

TEST(Calibrate, AbsPercentileIsNearestRank) {
  const float x[] = {1, -5, 3, 2};
  EXPECT_EQ(AbsPercentile(x, 100), 5.0f);
  EXPECT_EQ(AbsPercentile(x, 50), 2.0f);   // rank ceil(2) = 2 of {1,2,3,5}
  EXPECT_EQ(AbsPercentile(x, 75), 3.0f);   // rank 3
  EXPECT_EQ(AbsPercentile(x, 76), 5.0f);   // rank ceil(3.04) = 4
  EXPECT_EQ(AbsPercentile(x, 1), 1.0f);
  EXPECT_EQ(AbsPercentile({}, 50), 0.0f);
}

TEST(Calibrate, ScaleMapsAmaxToTheTopOfTheRange) {
  EXPECT_EQ(GlobalScaleForStatistic(2688.0f), 1.0f);
  EXPECT_FLOAT_EQ(GlobalScaleForStatistic(26.88f), 0.01f);
  EXPECT_EQ(GlobalScaleForStatistic(0.0f), 1.0f);
  // A block holding the amax gets the largest E4M3 scale and loses nothing to clipping.
  float x[16] = {26.88f, 1.0f};
  uint8_t packed[8];
  const uint8_t sf = nvfp4::QuantizeGroup(x, GlobalScaleForStatistic(26.88f), nvfp4::ScaleRule::kMax6, packed);
  EXPECT_EQ(sf, nvfp4::kE4M3MaxCode);
}

StatusOr<SafetensorsView> SynthView(std::vector<uint8_t>* bytes, const SynthOptions& o) {
  auto kv = GenerateSynthKv(o);
  if (!kv.ok()) return kv.status();
  auto b = SynthToSafetensors(*kv, DType::kF32, o);
  if (!b.ok()) return b.status();
  *bytes = std::move(*b);
  return SafetensorsView::Parse(*bytes);
}

TEST(Calibrate, PerLayerAmaxScales) {
  SynthOptions o;
  o.layers = 3;
  o.tokens = 64;
  o.kv_heads = 2;
  o.head_dim = 64;
  std::vector<uint8_t> bytes;
  auto v = SynthView(&bytes, o);
  ASSERT_TRUE(v.ok());
  auto c = Calibrate(*v, {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->k_scales.size(), 3u);
  EXPECT_EQ(c->statistic, "amax");
  auto kv = GenerateSynthKv(o);
  for (int l = 0; l < 3; ++l) {
    float ka = 0, va = 0;
    for (float x : kv->k[l]) ka = std::max(ka, std::fabs(x));
    for (float x : kv->v[l]) va = std::max(va, std::fabs(x));
    EXPECT_EQ(c->k_stat[l], ka);
    EXPECT_EQ(c->k_scales[l], ka / 2688.0f);
    EXPECT_EQ(c->v_scales[l], va / 2688.0f);
  }
  CalibrateOptions p;
  p.percentile = 99.0;
  auto c99 = Calibrate(*v, p);
  ASSERT_TRUE(c99.ok());
  EXPECT_EQ(c99->statistic, "p99");
  for (int l = 0; l < 3; ++l) EXPECT_LT(c99->k_scales[l], c->k_scales[l]);
  p.percentile = 0;
  EXPECT_TRUE(Calibrate(*v, p).status().IsInvalid());
  p.percentile = 100.5;
  EXPECT_TRUE(Calibrate(*v, p).status().IsInvalid());
}

TEST(Calibrate, TomlRoundTripIsExact) {
  Calibration c;
  c.k_scales = {0.001234567f, 1.0f, 3.3e-5f};
  c.v_scales = {7.7e-3f, 2.5e-4f, 1.17549435e-38f};
  c.k_stat = c.v_stat = {1, 2, 3};
  c.statistic = "amax";
  auto f = ParseScalesToml(CalibrationToToml(c, "a \"quoted\" path.safetensors"));
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->k_scales, c.k_scales);
  EXPECT_EQ(f->v_scales, c.v_scales);
}

TEST(Calibrate, MalformedScalesFilesAreRefused) {
  const char* bad[][2] = {
      {"k_scales = [1.0]", "no [contract]"},
      {"[contract]\nk_scales = [1.0]\n", "v_scales is not an array"},
      {"[contract]\nk_scales = [1.0, 2.0]\nv_scales = [1.0]\n", "same length"},
      {"[contract]\nk_scales = [-1.0]\nv_scales = [1.0]\n", "k_scales[0]"},
      {"[contract]\nk_scales = [0.0]\nv_scales = [1.0]\n", "k_scales[0]"},
      {"[contract]\nk_scales = [1.0]\nv_scales = [\"x\"]\n", "v_scales[0] is not a number"},
      {"[contract]\nk_scales = [1e300]\nv_scales = [1.0]\n", "k_scales[0]"},
      {"[contract]\nnum_layers = 2\nk_scales = [1.0]\nv_scales = [1.0]\n", "num_layers 2"},
      {"[contract\nk_scales = [1.0]", "line"},
      {"[contract]\nk_scales = []\nv_scales = []\n", "same length"},
  };
  for (const auto& b : bad) {
    auto f = ParseScalesToml(b[0]);
    ASSERT_FALSE(f.ok()) << b[0];
    EXPECT_TRUE(f.status().IsInvalid());
    EXPECT_NE(f.status().message().find(b[1]), std::string::npos) << f.status().message();
  }
}

TEST(Calibrate, CalibratingChangesTheContractId) {
  SynthOptions o;
  o.layers = 4;
  o.tokens = 64;
  o.kv_heads = 2;
  o.head_dim = 64;
  std::vector<uint8_t> bytes;
  auto v = SynthView(&bytes, o);
  ASSERT_TRUE(v.ok());
  auto cal = Calibrate(*v, {});
  ASSERT_TRUE(cal.ok());
  auto file = ParseScalesToml(CalibrationToToml(*cal, "synth"));
  ASSERT_TRUE(file.ok());

  ScaleContract unit;
  unit.model_id = "synthetic/model";
  unit.geometry = {4, 2, 64, 16};
  unit.SetUnitScales();
  ASSERT_TRUE(unit.Validate().ok());
  ScaleContract calibrated = unit;
  calibrated.k_scales = file->k_scales;
  calibrated.v_scales = file->v_scales;
  ASSERT_TRUE(calibrated.Validate().ok());
  EXPECT_NE(unit.Id(), calibrated.Id());

  // The same calibration gives the same id; a different one (p99.9) another.
  ScaleContract again = unit;
  again.k_scales = cal->k_scales;
  again.v_scales = cal->v_scales;
  EXPECT_EQ(again.Id(), calibrated.Id());
  CalibrateOptions p;
  p.percentile = 99.9;
  auto cal2 = Calibrate(*v, p);
  ASSERT_TRUE(cal2.ok());
  ScaleContract other = unit;
  other.k_scales = cal2->k_scales;
  other.v_scales = cal2->v_scales;
  EXPECT_NE(other.Id(), calibrated.Id());
  EXPECT_NE(other.Id(), unit.Id());
}

TEST(Calibrate, NeedsEveryLayerFromZero) {
  std::vector<float> kv(4 * 2 * 32, 0.5f);
  const std::vector<uint64_t> sh = {4, 2, 32};
  auto b = SerializeSafetensors({{"layers.0.k", DType::kF32, sh, kv}, {"layers.0.v", DType::kF32, sh, kv},
                                 {"layers.2.k", DType::kF32, sh, kv}, {"layers.2.v", DType::kF32, sh, kv}});
  ASSERT_TRUE(b.ok());
  auto v = SafetensorsView::Parse(*b);
  ASSERT_TRUE(v.ok());
  const Status s = Calibrate(*v, {}).status();
  EXPECT_TRUE(s.IsInvalid());
  EXPECT_NE(s.message().find("layer 1 is missing"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kvtier::quality
