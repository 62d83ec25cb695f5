// CPU references of kernels/reference.h: they are the oracle of the GPU tests, so they
// are checked here against the codec and against hand-computed cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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

// quantize_append's 4over6 path, first its parts: the 16-bit bounds made straight from
// directed-rounding FMAs equal those made from MakeLadder (rounded up to bf16), for
// scales over the whole ladder range, E4M3 steps times random global scales.
TEST(E2M1Ladder, DirectBf16BoundsEqualLadderBounds) {
  std::mt19937_64 rng(std::random_device{}());
  int64_t checked = 0;
  for (int it = 0; it < 300000; ++it) {
    const uint8_t sf = static_cast<uint8_t>(1 + rng() % 0x7E);
    float kv = std::ldexp(1.0f + static_cast<float>(rng() % 1000000) / 1e6f, static_cast<int>(rng() % 160) - 80);
    if (rng() % 4 == 0) kv = std::ldexp(1.0f, static_cast<int>(rng() % 160) - 80);
    const float s = nvfp4::E4M3ToFloat(sf) * kv;
    if (!LadderApplies(s)) continue;
    const E2M1Ladder l = MakeLadder(s);
    uint32_t hb[7];
    LadderPairBoundsBf16(s, hb);
    for (int k = 0; k < 7; ++k) {
      const uint32_t b16 = (l.b[k] + 0xffffu) >> 16;
      ASSERT_EQ(hb[k], b16 | (b16 << 16)) << "bound " << k << " s=" << s;
    }
    ++checked;
  }
  EXPECT_GT(checked, 200000);
}

// The 4over6 path's pair ladder on packed compares (LadderPairIdxGe, the host copy of
// set.ge.u32.bf16x2: per-lane compares of the magnitude bits) against LadderPairIdx on the
// signed words, for the bounds of scales over the whole ladder range: magnitudes at and
// next to every bound, +0 and -0, bf16 subnormals and the largest finite value, every lane
// position V.
TEST(E2M1Ladder, PackedComparePairIdxEqualsPairIdx) {
  std::mt19937_64 rng(std::random_device{}());
  int64_t checked = 0;
  for (int it = 0; it < 200000; ++it) {
    const uint8_t sf = static_cast<uint8_t>(1 + rng() % 0x7E);
    const float kv = std::ldexp(1.0f + static_cast<float>(rng() % 1000000) / 1e6f, static_cast<int>(rng() % 140) - 70);
    const float s = nvfp4::E4M3ToFloat(sf) * kv;
    if (!LadderApplies(s)) continue;
    uint32_t hb[7];
    LadderPairBoundsBf16(s, hb);
    uint16_t v[8];
    for (auto& x : v) {
      uint32_t mag;
      switch (rng() % 6) {
        case 0: mag = rng() % 0x80u; break;  // +0 and subnormals
        case 1: mag = 0x7f7fu - rng() % 2; break;
        case 2: mag = rng() % 0x7f80u; break;
        default: mag = (hb[rng() % 7] & 0xffffu) + static_cast<uint32_t>(static_cast<int>(rng() % 5) - 2);
      }
      mag = std::min<uint32_t>(mag & 0x7fffu, 0x7f7fu);
      x = static_cast<uint16_t>(mag | (rng() % 2 ? 0x8000u : 0u));
    }
    uint32_t p[4], got = 0, want = 0;
    for (int V = 0; V < 4; ++V) p[V] = v[V] | (uint32_t{v[V + 4]} << 16);
    got = LadderPairIdxGe<0, false>(p[0] & 0x7fff7fffu, hb) | LadderPairIdxGe<1, false>(p[1] & 0x7fff7fffu, hb) |
          LadderPairIdxGe<2, false>(p[2] & 0x7fff7fffu, hb) | LadderPairIdxGe<3, false>(p[3] & 0x7fff7fffu, hb);
    want = LadderPairIdx<0>(p[0], hb) | LadderPairIdx<1>(p[1], hb) | LadderPairIdx<2>(p[2], hb) |
           LadderPairIdx<3>(p[3], hb);
    ASSERT_EQ(got, want) << "s=" << s;
    checked += 8;
  }
  EXPECT_GT(checked, 1000000);
}

// The 4over6 path's scale quotients without a division. amax / 6 for every bf16 and fp16
// value from 2^-126 up; y / gs from RN(1 / gs) for random y and gs over the fast range, two
// thirds of them with y / gs within a few ulps of a float or of a midpoint between two
// floats; and the scale bytes of LadderScaleQuotients against the codec's divisions for
// amax over every binade of bf16 (the clamp included) and global scales on both sides of
// LadderScaleHasRcp's range.
TEST(FourOverSixPair, DivisionsWithoutDivideAreExact) {
  int64_t checked = 0;
  for (uint32_t h = 0x0080u; h < 0x7f80u; ++h) {  // bf16 normals
    const float a = Bf16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(LadderDiv6(a), a / 6.0f) << "bf16 " << a;
    ++checked;
  }
  for (uint32_t h = 0x0001u; h < 0x7c00u; ++h) {  // fp16, subnormals included (floats >= 2^-24)
    const float a = Fp16ToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(LadderDiv6(a), a / 6.0f) << "fp16 " << a;
    ++checked;
  }
  std::mt19937_64 rng(std::random_device{}());
  auto bits = [](float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; };
  auto from = [](uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; };
  auto mant = [&rng]() { return 1.0f + static_cast<float>(rng() % (1u << 23)) / 0x1p23f; };
  for (int it = 0; it < 3000000; ++it) {
    const float gs = std::ldexp(mant(), static_cast<int>(rng() % 61) - 30);
    ASSERT_TRUE(LadderScaleHasRcp(gs) || gs >= 0x1p30f);
    if (!LadderScaleHasRcp(gs)) continue;
    float y;
    const int mode = static_cast<int>(rng() % 3);
    if (mode == 0) {
      y = std::ldexp(mant(), static_cast<int>(rng() % 121) - 60);
    } else {  // y / gs next to a float q (mode 1) or to the midpoint above q (mode 2)
      const float q = std::ldexp(mant(), static_cast<int>(rng() % 20) - 10);
      double t = static_cast<double>(q);
      if (mode == 2) t += std::ldexp(1.0, std::ilogb(q) - 24);
      y = from(bits(static_cast<float>(t * gs)) + static_cast<uint32_t>(static_cast<int>(rng() % 5) - 2));
      if (!(y >= 0x1p-60f && y <= 0x1p60f)) continue;
    }
    ASSERT_EQ(LadderDivRcp(y, gs, 1.0f / gs), y / gs) << "y=" << y << " gs=" << gs;
    ++checked;
  }
  int64_t with_rcp = 0, clamped = 0;
  for (int it = 0; it < 2000000; ++it) {
    const float gs = std::ldexp(mant(), static_cast<int>(rng() % 100) - 50);
    const float rcp = LadderScaleHasRcp(gs) ? 1.0f / gs : 0.0f;
    const float amax = Bf16ToFloat(static_cast<uint16_t>(1 + rng() % 0x7f7fu));
    float q6, q4;
    LadderScaleQuotients(amax, gs, rcp, q6, q4);
    ASSERT_EQ(nvfp4::FloatToE4M3(q6), nvfp4::FloatToE4M3(amax / 6.0f / gs)) << "amax=" << amax << " gs=" << gs;
    ASSERT_EQ(nvfp4::FloatToE4M3(q4), nvfp4::FloatToE4M3(amax / 4.0f / gs)) << "amax=" << amax << " gs=" << gs;
    with_rcp += rcp != 0.0f;
    clamped += rcp != 0.0f && (amax < 0x1p-57f || amax > 0x1p57f);
  }
  EXPECT_GT(with_rcp, 1000000);
  EXPECT_GT(clamped, 500000);
  EXPECT_GT(checked, 2000000);
}

// The E2M1 magnitudes looked up by PRMT for every magnitude index at every position.
TEST(E2M1Ladder, MagnitudeLookupEqualsCodec) {
  for (uint32_t pos = 0; pos < 4; ++pos) {
    for (uint32_t idx = 0; idx < 8; ++idx) {
      const uint32_t c = (idx << (4 * pos)) | (((idx + 3) & 7u) << (4 * ((pos + 1) % 4)));
      float m[4];
      E2M1Magnitudes4(c, m);
      EXPECT_EQ(m[pos], nvfp4::E2M1ToFloat(static_cast<uint8_t>(idx))) << "index " << idx << " position " << pos;
    }
  }
}

// Random bf16 groups of the kinds that reach every branch of the 4over6 choice: exact ties
// between the candidates (kind 5), multiples of a power of two, equal values,
// zeros, Gaussian data, values at and next to the ladder bounds, amax at and around
// E4M3's subnormal range and its saturation, scales outside the FMA decision's range.
std::vector<uint16_t> FourOverSixGroup(std::mt19937_64& rng, float gs, int kind) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> v(16);
  const float mag = std::ldexp(gs, static_cast<int>(rng() % 24) - 14);  // amax / gs from 2^-14 to 2^9
  for (int i = 0; i < 16; ++i) {
    float x = 0.0f;
    switch (kind) {
      case 0: x = nd(rng) * mag; break;
      case 1: x = static_cast<float>(static_cast<int>(rng() % 49) - 24) * mag / 8.0f; break;  // exact ties
      case 2: x = (rng() % 8 == 0) ? nd(rng) * mag : 0.0f; break;
      case 3: x = (i == 0 || rng() % 2) ? mag * (rng() % 2 ? 1.0f : -1.0f) : 0.0f; break;  // equal values
      case 4: x = static_cast<float>(static_cast<int>(rng() % 13) - 6) * mag; break;
      case 5:  // +-v or 0 with v / 6 / gs and v / 4 / gs exact in E4M3: both errors 0, a tie
        x = (i == 0 ? 1.0f : static_cast<float>(static_cast<int>(rng() % 3) - 1)) * 0.75f * mag;
        break;
      default: {  // next to a bound of either candidate: t * amax / 6 or t * amax / 4
        const float ts[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
        x = ts[rng() % 7] * mag / (rng() % 2 ? 6.0f : 4.0f) * 6.0f;
        uint32_t u;
        std::memcpy(&u, &x, 4);
        u = (u & 0xffff0000u) + static_cast<uint32_t>((static_cast<int>(rng() % 5) - 2) * 0x10000);
        std::memcpy(&x, &u, 4);
        if (rng() % 2) x = -x;
      }
    }
    v[i] = FloatToBf16(x);
  }
  return v;
}

TEST(FourOverSixPair, EqualsCodecQuantizeGroup) {
  std::mt19937_64 rng(std::random_device{}());
  int64_t groups = 0, fast = 0, four_won = 0, six_won_diff_bytes = 0;
  for (int it = 0; it < 400000; ++it) {
    float gs = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, static_cast<int>(rng() % 120) - 60);
    if (rng() % 8 == 0) gs = std::ldexp(1.0f, static_cast<int>(rng() % 200) - 100);  // beyond the FMA decision's range
    const int kind = static_cast<int>(rng() % 7);
    const std::vector<uint16_t> v = FourOverSixGroup(rng, gs, kind);
    uint32_t w[8];
    float x[16];
    uint32_t amax16 = 0;
    for (int i = 0; i < 8; ++i) w[i] = v[2 * i] | (static_cast<uint32_t>(v[2 * i + 1]) << 16);
    bool finite = true;
    for (int i = 0; i < 16; ++i) {
      x[i] = Bf16ToFloat(v[i]);
      amax16 = std::max<uint32_t>(amax16, v[i] & 0x7fffu);
      finite &= std::isfinite(x[i]);
    }
    if (!finite) continue;
    uint8_t want_packed[8];
    const uint8_t want_sf = nvfp4::QuantizeGroup(x, gs, nvfp4::ScaleRule::k4over6, want_packed);
    uint8_t sf = 0;
    uint32_t pk0 = 0, pk1 = 0;
    // The kernel's reciprocal of the global scale, or 0 (divide) for some groups
    const float rcp = LadderScaleHasRcp(gs) && rng() % 8 != 0 ? 1.0f / gs : 0.0f;
    if (!Quantize4over6Pair<false>(w, amax16, gs, rcp, sf, pk0, pk1)) continue;  // the codec's own path
    ++groups;
    uint32_t want0 = 0, want1 = 0;
    for (int j = 0; j < 4; ++j) {
      want0 |= static_cast<uint32_t>(want_packed[j]) << (8 * j);
      want1 |= static_cast<uint32_t>(want_packed[4 + j]) << (8 * j);
    }
    ASSERT_EQ(sf, want_sf) << "gs=" << gs << " kind " << kind;
    ASSERT_EQ(pk0, want0) << "gs=" << gs << " kind " << kind;
    ASSERT_EQ(pk1, want1) << "gs=" << gs << " kind " << kind;
    const uint8_t sf6 = nvfp4::FloatToE4M3(Bf16ToFloat(static_cast<uint16_t>(amax16)) / 6.0f / gs);
    four_won += sf != sf6;
    six_won_diff_bytes += sf == sf6 && sf6 != nvfp4::FloatToE4M3(Bf16ToFloat(static_cast<uint16_t>(amax16)) / 4.0f / gs);
    const float s6 = nvfp4::E4M3ToFloat(sf6) * gs;
    fast += FastDecisionApplies(s6);
  }
  // Each branch is taken often: both winners, and scales on both sides of the FMA range.
  std::printf("groups %lld, sf4 won %lld, sf6 won over a different sf4 %lld, FMA decision range %lld\n",
              static_cast<long long>(groups), static_cast<long long>(four_won), static_cast<long long>(six_won_diff_bytes),
              static_cast<long long>(fast));
  EXPECT_GT(groups, 200000);
  EXPECT_GT(four_won, 10000);
  EXPECT_GT(six_won_diff_bytes, 10000);
  EXPECT_GT(fast, 100000);
  EXPECT_GT(groups - fast, 5000);
}

// The FMA sums' decision against the exact sums, on the candidates' own codes: whenever
// the margin decides, it decides as the exact sums do; and exact ties (equal exact sums,
// different scales) are never decided by the margin.
TEST(FourOverSixPair, FmaDecisionAgreesWithExactSums) {
  std::mt19937_64 rng(std::random_device{}());
  int64_t decided = 0, undecided = 0, ties = 0;
  for (int it = 0; it < 300000; ++it) {
    const float gs = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 1000.0f, static_cast<int>(rng() % 60) - 30);
    const std::vector<uint16_t> v = FourOverSixGroup(rng, gs, static_cast<int>(rng() % 7));
    uint32_t w[8], p[8];
    float x[16];
    float amax = 0.0f;
    for (int i = 0; i < 8; ++i) w[i] = v[2 * i] | (static_cast<uint32_t>(v[2 * i + 1]) << 16);
    for (int i = 0; i < 16; ++i) {
      x[i] = Bf16ToFloat(v[i]);
      amax = std::max(amax, std::fabs(x[i]));
    }
    const float s6 = nvfp4::E4M3ToFloat(nvfp4::FloatToE4M3(amax / 6.0f / gs)) * gs;
    const float s4 = nvfp4::E4M3ToFloat(nvfp4::FloatToE4M3(amax / 4.0f / gs)) * gs;
    if (!LadderApplies(s6) || !LadderApplies(s4) || !FastDecisionApplies(s6) || !FastDecisionApplies(s4)) continue;
    LadderPairWords(w, p);
    uint32_t hb[7], c0, c1, q0, q1;
    LadderPairBoundsBf16(s6, hb);
    LadderGroupIdx(p, hb, c0, c1);
    LadderPairBoundsBf16(s4, hb);
    LadderGroupIdx(p, hb, q0, q1);
    const float x6 = PairCodesSquaredError(c0, c1, s6, x), x4 = PairCodesSquaredError(q0, q1, s4, x);
    // The exact sums are the codec's (QuantizeWithScale on the same codes).
    uint8_t codes[16];
    ASSERT_EQ(x6, nvfp4::QuantizeWithScale(x, nvfp4::FloatToE4M3(amax / 6.0f / gs), gs, codes));
    ASSERT_EQ(x4, nvfp4::QuantizeWithScale(x, nvfp4::FloatToE4M3(amax / 4.0f / gs), gs, codes));
    const float e6 = PairCodesSquaredErrorFma(c0, c1, s6, x), e4 = PairCodesSquaredErrorFma(q0, q1, s4, x);
    const float m = FastDecisionMargin(s6, s4, e6, e4);
    if (e4 + m < e6) {
      ASSERT_LT(x4, x6);
      ++decided;
    } else if (e6 + m < e4) {
      ASSERT_GT(x4, x6);
      ++decided;
    } else {
      ++undecided;
    }
    if (x4 == x6 && s4 != s6) ++ties;
  }
  std::printf("decided by the FMA sums %lld, by the exact sums %lld, exact ties %lld\n", static_cast<long long>(decided),
              static_cast<long long>(undecided), static_cast<long long>(ties));
  EXPECT_GT(decided, 100000);
  EXPECT_GT(undecided, 100);  // ties (and near ties) are there, and go to the exact sums
  EXPECT_GT(ties, 100);
}

}  // namespace
}  // namespace kvtier::kernels
