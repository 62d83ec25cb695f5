// Division-free E2M1 rounding of x / s, bit-identical to nvfp4::FloatToE2M1(x / s) (the
// codec's rule, formats/nvfp4_math.h) for 2^-80 <= s <= 2^80. Shared by the
// quantize_append kernel (kernels/pages.cu) and its CPU test (tests/kernels/).
//
// The codec rounds q = RN(x / s) and places |q| on the E2M1 ladder (q > 0.25, q >= 0.75,
// q > 1.25, q >= 1.75, q > 2.5, q >= 3.5, q > 5). Each test on the rounded quotient is a
// test on the exact quotient: t has at most 3 significant bits, so its float mantissa is
// even and a tie rounds to t, hence
//   RN(q) >  t  <=>  |x| / s >  t + u/2        (u = ulp(t))
//   RN(q) >= t  <=>  |x| / s >= t - u/2        (t is no power of two: the ulp below t is u)
// For s > 0 that is |x| > P or |x| >= P with P = (t +- u/2) * s exactly, i.e. |x| >= X
// for X the smallest float above (at or above) P. Per scale and threshold:
//   h = s * u/2                 (exact: a power of two times s)
//   c = fma(t, s, +-h) = RN(P)
//   e = fma(-t, s, c) = c - t*s (exact: |c - t*s| is a few ulps of t*s, on its grid)
//   X = c if c > P (>= P), else the next float after c.
// Then each value needs only integer compares of |x|'s bits. The exactness arguments need
// no underflow, hence the range of s (LadderApplies); outside it, and for s = 0, callers
// use the codec's division. The code's sign is x's sign (s > 0 and RN keep it, -0 too).
#pragma once

#include <cmath>
#include <cstdint>

#include "formats/nvfp4_math.h"

namespace kvtier::kernels {

KVT_HD float LadderFma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fmaf(a, b, c);
#endif
}

KVT_HD bool LadderApplies(float s) { return s >= 0x1p-80f && s <= 0x1p80f; }

template <bool kStrict>
KVT_HD uint32_t LadderBound(float t, float h, float s) {
  const float hh = kStrict ? h : -h;
  const float c = LadderFma(t, s, hh);
  const float e = LadderFma(-t, s, c);
  const bool at_or_above = kStrict ? (e > hh) : (e >= hh);
  return nvfp4::kvt_f2u(c) + (at_or_above ? 0u : 1u);
}

// The 7 bounds (float bits) for scale s; requires LadderApplies(s).
struct E2M1Ladder {
  uint32_t b[7];
};
KVT_HD E2M1Ladder MakeLadder(float s) {
  E2M1Ladder l;
  l.b[0] = LadderBound<true>(0.25f, s * 0x1p-26f, s);
  l.b[1] = LadderBound<false>(0.75f, s * 0x1p-25f, s);
  l.b[2] = LadderBound<true>(1.25f, s * 0x1p-24f, s);
  l.b[3] = LadderBound<false>(1.75f, s * 0x1p-24f, s);
  l.b[4] = LadderBound<true>(2.5f, s * 0x1p-23f, s);
  l.b[5] = LadderBound<false>(3.5f, s * 0x1p-23f, s);
  l.b[6] = LadderBound<true>(5.0f, s * 0x1p-22f, s);
  return l;
}
// == nvfp4::FloatToE2M1(x / s) for finite x and the s the ladder was made for.
KVT_HD uint8_t LadderCode(const E2M1Ladder& l, float x) {
  const uint32_t bits = nvfp4::kvt_f2u(x);
  const uint32_t a = bits & 0x7fffffffu;
  const uint32_t idx = static_cast<uint32_t>(a >= l.b[0]) + static_cast<uint32_t>(a >= l.b[1]) +
                       static_cast<uint32_t>(a >= l.b[2]) + static_cast<uint32_t>(a >= l.b[3]) +
                       static_cast<uint32_t>(a >= l.b[4]) + static_cast<uint32_t>(a >= l.b[5]) +
                       static_cast<uint32_t>(a >= l.b[6]);
  return static_cast<uint8_t>(((bits >> 28) & 8u) | idx);
}

// ---- Pairs of 16-bit inputs (quantize_append's max6 fast path, kernels/pages.cu) ------
// For a 16-bit input (bf16 or fp16) the test |x| >= X (X a float bound) is exactly
// |x| >= H with H the smallest 16-bit value >= X, and that is an integer compare of the
// magnitude bits. hb[k] holds H_k in both 16-bit lanes. Two values (v, v+4) share a
// 32-bit word p; with bit 15 of each lane forced on, (p | 0x80008000) - hb[k] leaves bit
// 15 (31) set iff that lane passes bound k (no borrow crosses lanes: H < 0x8000).
//
// The code is the number of bounds passed, and the flags are monotone in k (the bounds
// are sorted), so it is found by binary search: code bit 2 is f3; bit 1 is f5 or f1 by
// bit 2; bit 0 is f6, f4, f2 or f0 by bits 2 and 1. Each lane picks its next bound with a
// lane mask (PRMT in sign-replicate mode copies bit 15 (31) of a flag word into its whole
// 16-bit lane) and one LOP3 select; the masks also place code bits 2 and 1 with one LOP3
// each. Per pair of values: 3 subtractions, 2 PRMT, 4 selects, 6 placement ops (the
// thermometer decode it replaced took 7 + 4 + 8).
KVT_HD uint32_t LadderLaneMask(uint32_t f) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(f), "r"(0u), "r"(0xBB99u));
  return r;
#else
  return ((f & 0x8000u) != 0 ? 0x0000FFFFu : 0u) | ((f & 0x80000000u) != 0 ? 0xFFFF0000u : 0u);
#endif
}
KVT_HD uint32_t LadderSelect(uint32_t m, uint32_t a, uint32_t b) { return (m & a) | (~m & b); }
// Codes of values v = V and V+4 (the lanes of p, 16-bit with the sign in bit 15) as
// nibbles at bits 4V and 4V+16.
template <int V>
KVT_HD uint32_t LadderPairCodes(uint32_t p, const uint32_t (&hb)[7]) {
  const uint32_t g = p | 0x80008000u;
  const uint32_t m2 = LadderLaneMask(g - hb[3]);                      // code >= 4
  const uint32_t m1 = LadderLaneMask(g - LadderSelect(m2, hb[5], hb[1]));  // >= 6 / >= 2
  const uint32_t b0 = LadderSelect(m2, LadderSelect(m1, hb[6], hb[4]), LadderSelect(m1, hb[2], hb[0]));
  const uint32_t f0 = g - b0;  // code bit 0 in bit 15 (31)
  constexpr uint32_t m = 0x00010001u << (4 * V);
  return ((p >> (12 - 4 * V)) & (m << 3)) | (m2 & (m << 2)) | (m1 & (m << 1)) | ((f0 >> (15 - 4 * V)) & m);
}

}  // namespace kvtier::kernels
