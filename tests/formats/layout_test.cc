// Page and block layout against the formula of DESIGN.md section 3.
#include <gtest/gtest.h>

#include "formats/layout.h"

namespace kvtier {
namespace {

TEST(Layout, Llama70bShapedBlockSizes) {
  Geometry g{80, 8, 128, 16};
  ASSERT_TRUE(g.Validate(KvFormat::kNvfp4).ok());
  EXPECT_EQ(BlockBytes(KvFormat::kNvfp4, g), 1474560u);
  EXPECT_EQ(BlockBytes(KvFormat::kFp8, g), 2621440u);
  EXPECT_EQ(BlockBytes(KvFormat::kBf16, g), 5242880u);
  EXPECT_EQ(SlotBytes(KvFormat::kNvfp4, g), 1474560u);  // already 4 KiB aligned
  // NVFP4 holds 1.78x the tokens of FP8 in the same bytes.
  EXPECT_NEAR(static_cast<double>(BlockBytes(KvFormat::kFp8, g)) / BlockBytes(KvFormat::kNvfp4, g),
              1.7778, 1e-3);
  EXPECT_EQ(BlockScaleBytes(KvFormat::kNvfp4, g), 80u * 2 * 8 * 16 * 8);
}

TEST(Layout, PageRegionsFollowTheFormula) {
  for (uint32_t H : {1u, 2u, 8u}) {
    for (uint32_t D : {64u, 128u, 256u}) {
      for (uint32_t T : {16u, 32u, 64u}) {
        Geometry g{4, H, D, T};
        const PageLayout p = MakePageLayout(KvFormat::kNvfp4, g);
        const size_t data = size_t{H} * T * (D / 2), scale = size_t{H} * T * (D / 16);
        EXPECT_EQ(p.k_data, 0u);
        EXPECT_EQ(p.k_scale, data);
        EXPECT_EQ(p.v_data, data + scale);
        EXPECT_EQ(p.v_scale, 2 * data + scale);
        EXPECT_EQ(p.page_bytes, 2 * (data + scale));
        EXPECT_EQ(PageOffset(KvFormat::kNvfp4, g, 3), 3 * p.page_bytes);
        // Element addressing: (h, t, d) for a few points, both sides.
        for (size_t side : {p.k_data, p.v_data}) {
          for (uint32_t h : {0u, H - 1}) {
            for (uint32_t t : {0u, T / 2, T - 1}) {
              for (uint32_t d : {0u, 1u, 15u, 16u, D - 1}) {
                EXPECT_EQ(Nvfp4DataOffset(g, side, h, t, d), side + (h * T + t) * (D / 2) + d / 2);
                EXPECT_EQ(Nvfp4ScaleOffset(g, side, h, t, d),
                          side + H * T * (D / 2) + (h * T + t) * (D / 16) + d / 16);
              }
            }
          }
        }
        // Scale region of K ends where V data starts; V scales end at the page end.
        EXPECT_EQ(Nvfp4ScaleOffset(g, p.k_data, H - 1, T - 1, D - 1) + 1, p.v_data);
        EXPECT_EQ(Nvfp4ScaleOffset(g, p.v_data, H - 1, T - 1, D - 1) + 1, p.page_bytes);
      }
    }
  }
}

TEST(Layout, Fp8AndBf16Pages) {
  Geometry g{2, 4, 64, 32};
  const PageLayout f8 = MakePageLayout(KvFormat::kFp8, g);
  EXPECT_EQ(f8.v_data, 4u * 64 * 32);
  EXPECT_EQ(f8.page_bytes, 2u * 4 * 64 * 32);
  const PageLayout b16 = MakePageLayout(KvFormat::kBf16, g);
  EXPECT_EQ(b16.v_data, 2u * 4 * 64 * 32);
  EXPECT_EQ(b16.page_bytes, 4u * 4 * 64 * 32);
  EXPECT_EQ(BlockScaleBytes(KvFormat::kFp8, g), 0u);
}

TEST(Layout, GeometryValidation) {
  EXPECT_TRUE(Geometry({0, 8, 128, 16}).Validate(KvFormat::kNvfp4).IsInvalid());
  EXPECT_TRUE(Geometry({1, 0, 128, 16}).Validate(KvFormat::kNvfp4).IsInvalid());
  EXPECT_TRUE(Geometry({1, 8, 100, 16}).Validate(KvFormat::kNvfp4).IsInvalid());
  EXPECT_TRUE(Geometry({1, 8, 128, 0}).Validate(KvFormat::kNvfp4).IsInvalid());
  EXPECT_TRUE(Geometry({1024, 256, 1024, 1024}).Validate(KvFormat::kBf16).IsInvalid());
  EXPECT_TRUE(Geometry({1, 8, 128, 16}).Validate(static_cast<KvFormat>(9)).IsInvalid());
  EXPECT_TRUE(Geometry({32, 8, 128, 16}).Validate(KvFormat::kNvfp4).ok());
}

}  // namespace
}  // namespace kvtier
