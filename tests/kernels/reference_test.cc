// CPU references of kernels/reference.h: they are the oracle of the GPU tests, so they
// are checked here against the codec and against hand-computed cases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "formats/nvfp4.h"
#include "kernels/e2m1_ladder.h"
#include "kernels/reference.h"

namespace kvtier::kernels {
namespace {

struct Pool {
  explicit Pool(KvFormat f, Geometry g, size_t slots) {
    hp.format = f;
    hp.geometry = g;
    hp.num_slots = slots;
    hp.slot_bytes = SlotBytes(f, g);
    bytes.resize(hp.slot_bytes * slots);
    std::mt19937 rng(std::random_device{}());
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    hp.base = bytes.data();
  }
  HostPool hp;
  std::vector<uint8_t> bytes;
};

Geometry G(uint32_t L, uint32_t H, uint32_t D, uint32_t T) {
  Geometry g;
  g.num_layers = L;
  g.num_kv_heads = H;
  g.head_dim = D;
  g.block_tokens = T;
  return g;
}

TEST(Bf16, RoundTripAndRne) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(Bf16ToFloat(0x3F80), 1.0f);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: goes to even (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + 1.0f / 256), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + 3.0f / 256), 0x3F82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(Fp16ToFloat(FloatToFp16(0.5f)), 0.5f);
}

TEST(QuantizeAppendRef, MatchesCodecAndLayout) {
  std::mt19937 rng(std::random_device{}());
  const Geometry g = G(3, 2, 128, 16);
  Pool p(KvFormat::kNvfp4, g, 5);
  const std::vector<uint8_t> before = p.bytes;
  const int n = 7;
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> k(n * 2 * 128), v(n * 2 * 128);
  for (auto& x : k) x = nd(rng);
  for (auto& x : v) x = nd(rng);
  std::vector<int32_t> slots(n), pos(n);
  for (int i = 0; i < n; ++i) {
    slots[i] = static_cast<int32_t>(rng() % 5);
    pos[i] = i * 2;  // distinct positions, so no token overwrites another
  }
  ASSERT_TRUE(QuantizeAppendRef(p.hp, k, v, slots, pos, 1, 0.01f, 0.02f, nvfp4::ScaleRule::kMax6).ok());
  // Every token's row equals the codec's array output at the layout's offsets.
  const PageLayout pl = MakePageLayout(KvFormat::kNvfp4, g);
  for (int i = 0; i < n; ++i) {
    for (uint32_t h = 0; h < 2; ++h) {
      std::vector<uint8_t> data(64), sc(8);
      ASSERT_TRUE(nvfp4::Quantize(std::span<const float>(k.data() + (i * 2 + h) * 128, 128), 0.01f,
                                  nvfp4::ScaleRule::kMax6, data, sc)
                      .ok());
      const uint8_t* page = p.hp.Page(slots[i], 1);
      EXPECT_EQ(0, std::memcmp(page + Nvfp4DataOffset(g, pl.k_data, h, pos[i], 0), data.data(), 64));
      EXPECT_EQ(0, std::memcmp(page + Nvfp4ScaleOffset(g, pl.k_data, h, pos[i], 0), sc.data(), 8));
      // And PageValue decodes what the codec decodes.
      std::vector<float> deq(128);
      ASSERT_TRUE(nvfp4::Dequantize(data, sc, 0.01f, deq).ok());
      for (uint32_t d = 0; d < 128; ++d) {
        EXPECT_FLOAT_EQ(static_cast<float>(PageValue(p.hp, slots[i], 1, 0, h, pos[i], d, 0.01f)), deq[d]);
      }
    }
  }
  // Layers 0 and 2 are untouched.
  for (size_t s = 0; s < 5; ++s) {
    for (uint32_t layer : {0u, 2u}) {
      const size_t off = s * p.hp.slot_bytes + PageOffset(KvFormat::kNvfp4, g, layer);
      EXPECT_EQ(0, std::memcmp(p.bytes.data() + off, before.data() + off, PageBytes(KvFormat::kNvfp4, g)));
    }
  }
}

TEST(QuantizeAppendRef, RefusesBadInputAndWritesNothing) {
  const Geometry g = G(1, 1, 64, 16);
  Pool p(KvFormat::kNvfp4, g, 2);
  const std::vector<uint8_t> before = p.bytes;
  std::vector<float> k(2 * 64, 1.0f), v(2 * 64, 1.0f);
  std::vector<int32_t> slots = {0, 2}, pos = {0, 1};  // slot 2 out of range
  EXPECT_TRUE(QuantizeAppendRef(p.hp, k, v, slots, pos, 0, 1.f, 1.f, nvfp4::ScaleRule::kMax6).IsInvalid());
  slots = {0, 1};
  pos = {0, 16};  // position out of range
  EXPECT_TRUE(QuantizeAppendRef(p.hp, k, v, slots, pos, 0, 1.f, 1.f, nvfp4::ScaleRule::kMax6).IsInvalid());
  pos = {0, 1};
  k[70] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(QuantizeAppendRef(p.hp, k, v, slots, pos, 0, 1.f, 1.f, nvfp4::ScaleRule::kMax6).IsInvalid());
  EXPECT_EQ(p.bytes, before);
}

// Hand-made cache: softmax of known scores.
TEST(DecodeRef, TwoTokensByHand) {
  const Geometry g = G(1, 1, 64, 16);
  Pool p(KvFormat::kBf16, g, 1);
  const PageLayout pl = MakePageLayout(KvFormat::kBf16, g);
  auto put = [&](size_t region, uint32_t t, uint32_t d, float x) {
    const uint16_t b = FloatToBf16(x);
    std::memcpy(p.hp.Page(0, 0) + region + 2 * (t * 64 + d), &b, 2);
  };
  for (uint32_t d = 0; d < 64; ++d) {
    put(pl.k_data, 0, d, d == 0 ? 1.0f : 0.0f);  // k0 = e0
    put(pl.k_data, 1, d, d == 1 ? 1.0f : 0.0f);  // k1 = e1
    put(pl.v_data, 0, d, 2.0f);
    put(pl.v_data, 1, d, -4.0f);
  }
  std::vector<float> q(64, 0.f);
  q[0] = 3.0f;  // scores (scale 0.5): 1.5 and 0
  std::vector<int32_t> bt = {0}, lens = {2};
  DecodeRefArgs a;
  a.q = q;
  a.block_table = bt;
  a.seq_lens = lens;
  a.batch = 1;
  a.num_q_heads = 1;
  a.max_blocks = 1;
  a.softmax_scale = 0.5f;
  std::vector<double> out, lse;
  ASSERT_TRUE(DecodeRef(p.hp, a, &out, &lse).ok());
  const double w0 = std::exp(1.5) / (std::exp(1.5) + 1.0);
  for (int d = 0; d < 64; ++d) EXPECT_NEAR(out[d], 2.0 * w0 - 4.0 * (1 - w0), 1e-12);
  EXPECT_NEAR(lse[0], std::log(std::exp(1.5) + 1.0), 1e-12);
  // Out-of-range block table entry is refused.
  bt = {1};
  a.block_table = bt;
  EXPECT_TRUE(DecodeRef(p.hp, a, &out, &lse).IsInvalid());
}

TEST(PageValue, Fp8UsesScale) {
  const Geometry g = G(1, 1, 64, 16);
  Pool p(KvFormat::kFp8, g, 1);
  const PageLayout pl = MakePageLayout(KvFormat::kFp8, g);
  p.hp.Page(0, 0)[pl.v_data + 5 * 64 + 3] = 0x38;  // 1.0
  EXPECT_DOUBLE_EQ(PageValue(p.hp, 0, 0, 1, 0, 5, 3, 0.25f), 0.25);
}

// The division-free E2M1 rounding of quantize_append (kernels/e2m1_ladder.h) against the
// codec's own x / s rounding: random values, and values within a few ulps of every
// threshold product t*s and of every rounding midpoint (t +- ulp(t)/2)*s, both signs,
// scales over the whole range the ladder is used for.
TEST(E2M1Ladder, EqualsCodecDivisionAtEveryBoundary) {
  std::mt19937_64 rng(std::random_device{}());
  const float ts[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  auto bits = [](float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; };
  auto from = [](uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; };
  int64_t checked = 0, boundary = 0;
  for (int it = 0; it < 400000; ++it) {
    const uint8_t sf = static_cast<uint8_t>(1 + rng() % 0x7E);
    float kv = std::ldexp(1.0f + static_cast<float>(rng() % 1000000) / 1e6f, static_cast<int>(rng() % 140) - 70);
    if (rng() % 4 == 0) kv = std::ldexp(1.0f, static_cast<int>(rng() % 140) - 70);
    const float s = nvfp4::E4M3ToFloat(sf) * kv;
    if (!LadderApplies(s)) continue;
    const E2M1Ladder l = MakeLadder(s);
    for (int k = 0; k < 16; ++k) {
      float x;
      const int mode = static_cast<int>(rng() % 3);
      if (mode == 0) {
        x = static_cast<float>(static_cast<int64_t>(rng() % 1400001) - 700000) / 1e5f * s;
      } else {
        const float t = ts[rng() % 7];
        double m = static_cast<double>(t) * s;
        if (mode == 2) {
          const double u = std::ldexp(1.0, std::ilogb(t) - 23);
          m = (rng() % 2 ? t + u / 2 : t - u / 2) * static_cast<double>(s);
        }
        x = from(bits(static_cast<float>(m)) + static_cast<uint32_t>(static_cast<int>(rng() % 9) - 4));
        if (rng() % 2) x = -x;
        ++boundary;
      }
      const uint8_t want = nvfp4::FloatToE2M1(x / s);
      ASSERT_EQ(LadderCode(l, x), want) << "x=" << x << " s=" << s;
      ++checked;
    }
  }
  EXPECT_GT(checked, 4000000);
  EXPECT_GT(boundary, 2000000);
  EXPECT_FALSE(LadderApplies(0.0f));
  EXPECT_FALSE(LadderApplies(-1.0f));
  EXPECT_FALSE(LadderApplies(0x1p-90f));
}

// quantize_append's pair decode (LadderPairCodes: binary search over 16-bit bounds, two
// values per word) against the per-value LadderCode, for bf16 inputs: random magnitudes
// and magnitudes at and next to every 16-bit bound, both signs, every lane position V.
TEST(E2M1Ladder, PairCodesEqualPerValueCodesForBf16) {
  std::mt19937_64 rng(std::random_device{}());
  auto from = [](uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; };
  int64_t checked = 0;
  for (int it = 0; it < 200000; ++it) {
    const uint8_t sf = static_cast<uint8_t>(1 + rng() % 0x7E);
    const float kv = std::ldexp(1.0f + static_cast<float>(rng() % 1000000) / 1e6f, static_cast<int>(rng() % 140) - 70);
    const float s = nvfp4::E4M3ToFloat(sf) * kv;
    if (!LadderApplies(s)) continue;
    const E2M1Ladder l = MakeLadder(s);
    uint32_t hb[7];
    for (int k = 0; k < 7; ++k) {
      const uint32_t b16 = (l.b[k] + 0xffffu) >> 16;
      hb[k] = b16 | (b16 << 16);
    }
    uint16_t v[8];
    for (auto& x : v) {
      uint32_t mag;
      if (rng() % 2) {
        mag = static_cast<uint32_t>(hb[rng() % 7] & 0xffffu) + static_cast<uint32_t>(static_cast<int>(rng() % 3) - 1);
      } else {
        mag = (static_cast<uint32_t>(l.b[rng() % 7]) >> 16) + static_cast<uint32_t>(static_cast<int>(rng() % 41) - 20);
      }
      mag &= 0x7fffu;
      if (mag >= 0x7f80u) mag = 0x7f7fu;  // finite only (the kernel refuses the rest first)
      x = static_cast<uint16_t>(mag | (rng() % 2 ? 0x8000u : 0u));
    }
    // word of values V (low lane) and V + 4 (high lane), as the kernel pairs them
    uint32_t got = LadderPairCodes<0>(v[0] | (uint32_t{v[4]} << 16), hb) |
                   LadderPairCodes<1>(v[1] | (uint32_t{v[5]} << 16), hb) |
                   LadderPairCodes<2>(v[2] | (uint32_t{v[6]} << 16), hb) |
                   LadderPairCodes<3>(v[3] | (uint32_t{v[7]} << 16), hb);
    for (int i = 0; i < 8; ++i) {
      const float x = from(uint32_t{v[i]} << 16);
      const uint8_t want = LadderCode(l, x);
      ASSERT_EQ((got >> (4 * i)) & 0xFu, want) << "value " << i << " x=" << x << " s=" << s;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1000000);
}

}  // namespace
}  // namespace kvtier::kernels
