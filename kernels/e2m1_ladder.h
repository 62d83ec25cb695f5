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

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

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
// Magnitude indices (code & 7) of values v = V and V+4 (the lanes of p, 16-bit with the
// sign in bit 15) as nibbles at bits 4V and 4V+16; bit 3 of each nibble is left 0.
template <int V>
KVT_HD uint32_t LadderPairIdx(uint32_t p, const uint32_t (&hb)[7]) {
  const uint32_t g = p | 0x80008000u;
  const uint32_t m2 = LadderLaneMask(g - hb[3]);                      // code >= 4
  const uint32_t m1 = LadderLaneMask(g - LadderSelect(m2, hb[5], hb[1]));  // >= 6 / >= 2
  const uint32_t b0 = LadderSelect(m2, LadderSelect(m1, hb[6], hb[4]), LadderSelect(m1, hb[2], hb[0]));
  const uint32_t f0 = g - b0;  // code bit 0 in bit 15 (31)
  constexpr uint32_t m = 0x00010001u << (4 * V);
  return (m2 & (m << 2)) | (m1 & (m << 1)) | ((f0 >> (15 - 4 * V)) & m);
}
// The sign bits of values V and V+4 (bit 15 and 31 of p) at bits 4V+3 and 4V+19.
template <int V>
KVT_HD uint32_t LadderPairSigns(uint32_t p) {
  return (p >> (12 - 4 * V)) & (0x00080008u << (4 * V));
}
// Codes of values v = V and V+4 (the lanes of p, 16-bit with the sign in bit 15) as
// nibbles at bits 4V and 4V+16.
template <int V>
KVT_HD uint32_t LadderPairCodes(uint32_t p, const uint32_t (&hb)[7]) {
  return LadderPairSigns<V>(p) | LadderPairIdx<V>(p, hb);
}

// The 16-bit bounds hb straight from s, for bf16 inputs (the 4over6 path). Each test of
// the ladder is |x| > P (strict) or |x| >= P with P = t*s + h or t*s - h (h = s * u/2, as
// above; t*s +- h is exact in a single FMA's infinitely precise result). For a bf16
// magnitude that is |x| >= H with H the smallest bf16 above P (strict) or at or above P:
//   strict:     H = RD_bf16(P) + 1 ulp = (bits(fma_rd(t, s, h)) >> 16) + 1
//   not strict: H = RU_bf16(P)         = (bits(fma_ru(t, s, -h)) + 0xffff) >> 16
// (RD_bf16(RD_f32(P)) = RD_bf16(P): bf16 values are floats; the same for RU). One FMA
// and two integer ops per bound, where MakeLadder + the rounding up took six. Equal to
// the bounds made from MakeLadder for every s with LadderApplies(s) (kernels_ref_test
// E2M1Ladder.DirectBf16BoundsEqualLadderBounds).
KVT_HD float LadderFmaRd(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rd(a, b, c);
#else
  // a*b + c is exact in double for the ladder's arguments (t has at most 3 significant
  // bits, c = +-s * 2^-k with k <= 26: at most 49 bits between the highest and lowest);
  // round it toward -inf into a float.
  const double p = static_cast<double>(a) * b + c;
  float f = static_cast<float>(p);
  if (static_cast<double>(f) > p) f = std::nextafter(f, -INFINITY);
  return f;
#endif
}
KVT_HD float LadderFmaRu(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_ru(a, b, c);
#else
  const double p = static_cast<double>(a) * b + c;
  float f = static_cast<float>(p);
  if (static_cast<double>(f) < p) f = std::nextafter(f, INFINITY);
  return f;
#endif
}
KVT_HD uint32_t LadderHalfHigh(uint32_t u) {  // the high 16 bits of u in both lanes
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(u), "r"(0u), "r"(0x3232u));
  return r;
#else
  return (u >> 16) | (u & 0xffff0000u);
#endif
}
KVT_HD void LadderPairBoundsBf16(float s, uint32_t (&hb)[7]) {
  constexpr float t[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float h26 = s * 0x1p-26f, h25 = s * 0x1p-25f, h24 = s * 0x1p-24f, h23 = s * 0x1p-23f, h22 = s * 0x1p-22f;
  const float h[7] = {h26, -h25, h24, -h24, h23, -h23, h22};
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 7; ++k) {
    if (k % 2 == 0) {  // strict
      hb[k] = LadderHalfHigh(nvfp4::kvt_f2u(LadderFmaRd(t[k], s, h[k]))) + 0x00010001u;
    } else {
      hb[k] = LadderHalfHigh(nvfp4::kvt_f2u(LadderFmaRu(t[k], s, h[k])) + 0xffffu);
    }
  }
}

// ---- 4over6: the pair ladder on packed 16-bit compares (kernels/pages.cu) ------------
// The same binary search as LadderPairIdx with each flag made by one packed compare of
// |x| against the bound: set.ge.u32.{bf16x2,f16x2} writes 0xFFFF or 0 per lane, the lane
// mask itself (the subtraction and the sign-replicating PRMT took two instructions), and
// code bit 0 is then placed by the same LOP3 as bits 2 and 1 (no shift). The lanes hold
// magnitudes (sign bit cleared: finite, >= +0) and bounds (> 0, fp16's may be inf), for
// which the float order is the order of the bits; the host copy compares the bits. No
// denormal flush: the compares carry no .ftz. Per pair of values: 3 compares, 4 selects,
// 3 placements (LadderPairIdx: 3 subtractions, 2 PRMT, 4 selects, 6 placement ops).
template <bool kFp16>
KVT_HD uint32_t LadderGeMask(uint32_t a, uint32_t h) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if constexpr (kFp16) {
    asm("set.ge.u32.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(h));
  } else {
    asm("set.ge.u32.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(h));
  }
  return r;
#else
  return ((a & 0xffffu) >= (h & 0xffffu) ? 0x0000FFFFu : 0u) | ((a >> 16) >= (h >> 16) ? 0xFFFF0000u : 0u);
#endif
}
// Both lanes' magnitudes (sign bits cleared). On the device abs.{bf16x2,f16x2} (no .ftz:
// subnormals kept), which ptxas folds into the compares that read it as an operand
// modifier, where the AND was one more ALU instruction a pair word.
template <bool kFp16>
KVT_HD uint32_t LadderAbs2(uint32_t p) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  if constexpr (kFp16) {
    asm("abs.f16x2 %0, %1;\n" : "=r"(r) : "r"(p));
  } else {
    asm("abs.bf16x2 %0, %1;\n" : "=r"(r) : "r"(p));
  }
  return r;
#else
  return p & 0x7fff7fffu;
#endif
}
// Magnitude indices of values V and V+4 (the lanes of pa: magnitudes, sign bits clear) as
// nibbles at bits 4V and 4V+16, equal to LadderPairIdx<V> of the signed word.
template <int V, bool kFp16>
KVT_HD uint32_t LadderPairIdxGe(uint32_t pa, const uint32_t (&hb)[7]) {
  const uint32_t m2 = LadderGeMask<kFp16>(pa, hb[3]);                             // code >= 4
  const uint32_t m1 = LadderGeMask<kFp16>(pa, LadderSelect(m2, hb[5], hb[1]));  // >= 6 / >= 2
  const uint32_t m0 = LadderGeMask<kFp16>(
      pa, LadderSelect(m2, LadderSelect(m1, hb[6], hb[4]), LadderSelect(m1, hb[2], hb[0])));
  constexpr uint32_t m = 0x00010001u << (4 * V);
  return (m2 & (m << 2)) | (m1 & (m << 1)) | (m0 & m);
}
// Magnitude indices of a group's values 0..7 (c0) and 8..15 (c1) from its pair words with
// the sign bits cleared (pa[i] = p[i] & 0x7fff7fff, p from LadderPairWords).
template <bool kFp16>
KVT_HD void LadderGroupIdxGe(const uint32_t (&pa)[8], const uint32_t (&hb)[7], uint32_t& c0, uint32_t& c1) {
  c0 = LadderPairIdxGe<0, kFp16>(pa[0], hb) | LadderPairIdxGe<1, kFp16>(pa[1], hb) |
       LadderPairIdxGe<2, kFp16>(pa[2], hb) | LadderPairIdxGe<3, kFp16>(pa[3], hb);
  c1 = LadderPairIdxGe<0, kFp16>(pa[4], hb) | LadderPairIdxGe<1, kFp16>(pa[5], hb) |
       LadderPairIdxGe<2, kFp16>(pa[6], hb) | LadderPairIdxGe<3, kFp16>(pa[7], hb);
}

// ---- 4over6: a candidate's squared error from its pair codes (kernels/pages.cu) -------
// The 4over6 rule compares err = sum_i (E2M1ToFloat(q_i) * s - x_i)^2, accumulated in
// index order in float32 (nvfp4::QuantizeWithScale). q_i carries x_i's sign and RN is
// symmetric, so each term is RN(RN(|E2M1(q_i)| * s) - |x_i|)^2: the same bits.
//
// |E2M1(q)| is an fp16 value whose low byte is 0: high byte {00,38,3C,3E,40,42,44,46}[i]
// for magnitude index i = q & 7. One PRMT looks the high bytes up for four codes at once
// (each code's index is a byte selector), one more per two values places them as fp16x2
// (the other operand, 0, gives the low bytes), and the fp16 -> f32 conversions (HADD2.F32)
// run on the FMA pipe, beside the integer work.

// PRMT (default mode) on the device; the same on the host, for the CPU tests.
KVT_HD uint32_t LadderPrmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
#else
  const uint64_t t = a | (static_cast<uint64_t>(b) << 32);
  uint32_t r = 0;
  for (int j = 0; j < 4; ++j) {
    const uint32_t n = (sel >> (4 * j)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(t >> (8 * (n & 7u))) & 0xFFu;
    if ((n & 8u) != 0) byte = (byte & 0x80u) != 0 ? 0xFFu : 0u;
    r |= byte << (8 * j);
  }
  return r;
#endif
}

// fp16 (a normal value or +0, as here) to float.
KVT_HD float LadderHalfToFloat(uint32_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(static_cast<uint16_t>(h)));
#else
  h &= 0xffffu;
  if (h == 0) return 0.0f;
  return nvfp4::kvt_u2f(((h & 0x8000u) << 16) | ((((h >> 10) & 31u) + 112u) << 23) | ((h & 1023u) << 13));
#endif
}

// |E2M1ToFloat| of the four codes in the low 16 bits of c (nibble j = code j; bit 3 of
// each nibble must be 0).
KVT_HD void E2M1Magnitudes4(uint32_t c, float (&m)[4]) {
  const uint32_t hi = LadderPrmt(0x3E3C3800u, 0x46444240u, c);
  const uint32_t h01 = LadderPrmt(hi, 0u, 0x1404u);
  const uint32_t h23 = LadderPrmt(hi, 0u, 0x3424u);
  m[0] = LadderHalfToFloat(h01);
  m[1] = LadderHalfToFloat(h01 >> 16);
  m[2] = LadderHalfToFloat(h23);
  m[3] = LadderHalfToFloat(h23 >> 16);
}

KVT_HD float LadderFabs(float x) {
#if defined(__CUDA_ARCH__)
  return fabsf(x);  // an operand modifier of the FADD that uses it
#else
  return std::fabs(x);
#endif
}

// == the error nvfp4::QuantizeWithScale returns for magnitude indices pk0 (values 0..7,
// nibble i = value i, bit 3 of each nibble 0) and pk1 (values 8..15), scale s (> 0) and
// the group's values x.
KVT_HD float PairCodesSquaredError(uint32_t pk0, uint32_t pk1, float s, const float (&x)[16]) {
  using namespace nvfp4;
  float err = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int q = 0; q < 4; ++q) {
    float m[4];
    E2M1Magnitudes4((q < 2 ? pk0 : pk1) >> (16 * (q & 1)), m);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < 4; ++j) {
      const float d = kvt_sub(kvt_mul(m[j], s), LadderFabs(x[4 * q + j]));
      // 0 + d^2 is d^2 (d^2 >= +0), so the first term needs no add.
      err = (q == 0 && j == 0) ? kvt_mul(d, d) : kvt_add(err, kvt_mul(d, d));
    }
  }
  return err;
}

// ---- 4over6: deciding by FMA sums, with a bound ---------------------------------------
// PairCodesSquaredErrorFma computes the same sum as fma(d~, d~, acc) with
// d~ = fma(|E2M1(q_i)|, s, -|x_i|): no rounding of the product and of each square. Per
// candidate (u = 2^-24, p_i = |E2M1(q_i)| * s <= 6s, E = the exact real sum of d_i^2):
//   each term: |d^2 - d~^2| <= (u p + 2u|d|)(2|d| + 2u p) <= u p^2 + 5u d^2 (+ O(u^2)),
//              so over 16 terms <= 576u s^2 + 5u E;
//   the sums:  the codec's 16 squares and 15 adds <= 31u E, the FMA chain's 16 <= 16u E.
// So each candidate's FMA sum is within 576u s^2 + 52u E of the codec's, and a margin of
// 2^-13 (s6^2 + s4^2 + e6 + e4) (2048u: over 3x the sum of both bounds, which also covers
// the rounding of the margin and of the comparisons) separates the cases where the FMA sums
// decide the comparison from those the exact sums must. Squares must neither underflow
// nor overflow for these relative bounds, hence 2^-40 <= s <= 2^40 (a subnormal d^2 is off
// by less than 2^-149, far below u s^2); a sum that overflows is never decided by the
// margin (inf + m < x is false), so the exact sums decide it.
KVT_HD bool FastDecisionApplies(float s) { return s >= 0x1p-40f && s <= 0x1p40f; }
KVT_HD float FastDecisionMargin(float s6, float s4, float e6, float e4) {
  using namespace nvfp4;
  return kvt_mul(0x1p-13f, kvt_add(kvt_add(kvt_mul(s6, s6), kvt_mul(s4, s4)), kvt_add(e6, e4)));
}
KVT_HD float PairCodesSquaredErrorFma(uint32_t pk0, uint32_t pk1, float s, const float (&x)[16]) {
  float err = 0.0f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int q = 0; q < 4; ++q) {
    float m[4];
    E2M1Magnitudes4((q < 2 ? pk0 : pk1) >> (16 * (q & 1)), m);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int j = 0; j < 4; ++j) {
      const float d = LadderFma(m[j], s, -LadderFabs(x[4 * q + j]));
      err = LadderFma(d, d, err);
    }
  }
  return err;
}

// ---- 4over6 on pairs of 16-bit inputs (quantize_append, kernels/pages.cu) --------------
// Per group: sf6 = E4M3(amax / 6 / gs) and sf4 = E4M3(amax / 4 / gs) (amax / 4 is exact,
// so amax * 0.25 is the codec's amax / 4.0 bit for bit), the quotients without a division
// where gs allows (LadderScaleQuotients) and both bytes in one conversion each way, both
// candidates' magnitude indices by the pair ladder on packed compares (LadderGroupIdxGe;
// bounds by LadderPairBounds), both errors by FMA sums with a bound, the codec's exact sums
// where the bound does not decide (see above), the smaller error winning and sf6 on a tie,
// then x's signs. When both scales round to the same byte
// (both saturate at 448, or both are 0) the errors are equal and max6's codes are the
// answer: one ladder. The host build (bf16 only) is the CPU tests' copy of the kernel's.

// The candidates' scale quotients without a division (the codec's kvt_div, bit for bit).
// amax / 6: q0 = amax * RN(1/6), then one correction through the exact residual
// fma(-q0, 6, amax). Equal to RN(amax / 6) for every amax with at most 11 significant bits
// (every bf16 and fp16 value) from 2^-126 up (kernels_ref_test
// FourOverSixPair.DivisionsWithoutDivideAreExact checks all of them); a smaller amax only
// ever leads to the codec's own path (its scales are far below LadderApplies' range).
KVT_HD float LadderDiv6(float amax) {
  constexpr float c = 1.0f / 6.0f;
  const float q0 = nvfp4::kvt_mul(amax, c);
  return LadderFma(LadderFma(-q0, 6.0f, amax), c, q0);
}
// RN(y / gs) from rcp = RN(1 / gs): q0 = y * rcp and two corrections q += (y - q*gs) * rcp,
// each residual exact in an FMA (Markstein: from a reciprocal within half an ulp and a
// quotient within one ulp, one correction rounds correctly; the first brings q0, up to 1.5
// ulps off, within one). Needs y and gs with no underflow in the residuals: y in
// [2^-60, 2^60] and gs in [2^-30, 2^30] (LadderScaleHasRcp) are far inside that.
KVT_HD bool LadderScaleHasRcp(float gs) { return gs >= 0x1p-30f && gs <= 0x1p30f; }
KVT_HD float LadderDivRcp(float y, float gs, float rcp) {
  const float q0 = nvfp4::kvt_mul(y, rcp);
  const float q1 = LadderFma(LadderFma(-q0, gs, y), rcp, q0);
  return LadderFma(LadderFma(-q1, gs, y), rcp, q1);
}
KVT_HD float LadderClamp(float x, float lo, float hi) {
#if defined(__CUDA_ARCH__)
  return fminf(fmaxf(x, lo), hi);
#else
  return x < lo ? lo : (x > hi ? hi : x);
#endif
}
// The candidates' quotients amax / 6 / gs and amax / 4 / gs, whose E4M3 bytes are the
// codec's. rcp: RN(1 / gs) where LadderScaleHasRcp(gs), else 0 (the codec's divisions).
// With rcp, amax is first clamped to [2^-57, 2^57]: then both quotients are RN of the exact
// ones for amax in that range, and outside it both scale bytes are the same either way (0
// below: the quotients are < 2^-29, far under E4M3's smallest half step 2^-10; 448 above:
// they are > 2^25).
KVT_HD void LadderScaleQuotients(float amax, float gs, float rcp, float& q6, float& q4) {
  using namespace nvfp4;
  if (rcp != 0.0f) {
    const float a = LadderClamp(amax, 0x1p-57f, 0x1p57f);
    q6 = LadderDivRcp(LadderDiv6(a), gs, rcp);
    q4 = LadderDivRcp(kvt_mul(a, 0.25f), gs, rcp);
  } else {
    q6 = kvt_div(kvt_div(amax, 6.0f), gs);
    q4 = kvt_div(kvt_mul(amax, 0.25f), gs);
  }
}

// Both candidates' E4M3 round trips, one conversion each way on the device
// (cvt.rn.satfinite.e4m3x2.f32 takes two floats, cvt.rn.f16x2.e4m3x2 returns two
// halves), equal to the codec's FloatToE4M3 / E4M3ToFloat for every argument that is not
// NaN (and amax / 6 / gs, amax finite, gs > 0, never is). Host: the codec's.
KVT_HD void LadderE4M3Pair(float q6, float q4, uint8_t& sf6, uint8_t& sf4) {
#if defined(__CUDA_ARCH__)
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(q4), "f"(q6));
  sf6 = static_cast<uint8_t>(r & 0xffu);
  sf4 = static_cast<uint8_t>(r >> 8);
#else
  sf6 = nvfp4::FloatToE4M3(q6);
  sf4 = nvfp4::FloatToE4M3(q4);
#endif
}
KVT_HD void LadderE4M3PairToFloat(uint8_t sf6, uint8_t sf4, float& f6, float& f4) {
#if defined(__CUDA_ARCH__)
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(static_cast<uint16_t>(sf6 | (sf4 << 8))));
  f6 = __half2float(__ushort_as_half(static_cast<uint16_t>(r & 0xffffu)));
  f4 = __half2float(__ushort_as_half(static_cast<uint16_t>(r >> 16)));
#else
  f6 = nvfp4::E4M3ToFloat(sf6);
  f4 = nvfp4::E4M3ToFloat(sf4);
#endif
}

// The 16-bit ladder bounds (both lanes) of scale s; requires LadderApplies(s). bf16:
// LadderPairBoundsBf16; fp16 (device only) the same with the hardware's directed
// float -> half conversions: strict H = RD_half(P) + 1 ulp (RD of a value above 65504 is
// 65504, so H is then inf, which no finite value reaches), not strict H = RU_half(P).
template <bool kFp16>
KVT_HD void LadderPairBounds(float s, uint32_t (&hb)[7]) {
  if constexpr (kFp16) {
#if defined(__CUDA_ARCH__)
    constexpr float t[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    const float h26 = s * 0x1p-26f, h25 = s * 0x1p-25f, h24 = s * 0x1p-24f, h23 = s * 0x1p-23f, h22 = s * 0x1p-22f;
    const float h[7] = {h26, -h25, h24, -h24, h23, -h23, h22};
#pragma unroll
    for (int k = 0; k < 7; ++k) {
      const uint32_t b16 = k % 2 == 0 ? __half_as_ushort(__float2half_rd(__fmaf_rd(t[k], s, h[k]))) + 1u
                                      : __half_as_ushort(__float2half_ru(__fmaf_ru(t[k], s, h[k])));
      hb[k] = b16 | (b16 << 16);
    }
#endif
  } else {
    LadderPairBoundsBf16(s, hb);
  }
}

template <bool kFp16>
KVT_HD float LadderToFloat(uint32_t h16) {
  if constexpr (kFp16) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(static_cast<uint16_t>(h16)));
#else
    return 0.0f;  // not built on the host
#endif
  } else {
    return nvfp4::kvt_u2f(h16 << 16);
  }
}

// The 16 values of a group as floats (value 2i is the low half of w[i]).
template <bool kFp16>
KVT_HD void LadderGroupFloats(const uint32_t (&w)[8], float (&x)[16]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = LadderToFloat<kFp16>(w[i] & 0xffffu);
    x[2 * i + 1] = LadderToFloat<kFp16>(w[i] >> 16);
  }
}

// The pair words of a group: value V in the low lane, V+4 in the high lane (values 0..7
// from w[0..3], 8..15 from w[4..7]).
KVT_HD void LadderPairWords(const uint32_t (&w)[8], uint32_t (&p)[8]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int h = 0; h < 2; ++h) {
    p[4 * h + 0] = LadderPrmt(w[4 * h + 0], w[4 * h + 2], 0x5410);
    p[4 * h + 1] = LadderPrmt(w[4 * h + 0], w[4 * h + 2], 0x7632);
    p[4 * h + 2] = LadderPrmt(w[4 * h + 1], w[4 * h + 3], 0x5410);
    p[4 * h + 3] = LadderPrmt(w[4 * h + 1], w[4 * h + 3], 0x7632);
  }
}

// Magnitude indices of values 0..7 (c0) and 8..15 (c1), one nibble per value.
KVT_HD void LadderGroupIdx(const uint32_t (&p)[8], const uint32_t (&hb)[7], uint32_t& c0, uint32_t& c1) {
  c0 = LadderPairIdx<0>(p[0], hb) | LadderPairIdx<1>(p[1], hb) | LadderPairIdx<2>(p[2], hb) | LadderPairIdx<3>(p[3], hb);
  c1 = LadderPairIdx<0>(p[4], hb) | LadderPairIdx<1>(p[5], hb) | LadderPairIdx<2>(p[6], hb) | LadderPairIdx<3>(p[7], hb);
}

#if defined(__CUDACC__)
#define KVT_HD_NOINLINE __host__ __device__ __noinline__
#else
#define KVT_HD_NOINLINE inline
#endif
// The exact decision (the codec's sums, term for term): 1 when candidate 4 (q0, q1, s4)
// has the smaller error. Out of line and with arguments by value: it is rare, and inline
// its registers would count against the main path's.
template <bool kFp16>
KVT_HD_NOINLINE int LadderExactFourWins(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, uint32_t w4, uint32_t w5,
                                        uint32_t w6, uint32_t w7, uint32_t c0, uint32_t c1, uint32_t q0, uint32_t q1,
                                        float s6, float s4) {
  const uint32_t w[8] = {w0, w1, w2, w3, w4, w5, w6, w7};
  float x[16];
  LadderGroupFloats<kFp16>(w, x);
  return PairCodesSquaredError(q0, q1, s4, x) < PairCodesSquaredError(c0, c1, s6, x) ? 1 : 0;
}

// One group of 16-bit inputs (w: value 2i in the low half of w[i]; amax16: the largest
// magnitude's bits, finite) under 4over6: the scale byte and the data words (codes of
// values 0..7 in pk0, 8..15 in pk1, nibble i = value i), equal to nvfp4::QuantizeGroup.
// rcp: RN(1 / gs) where LadderScaleHasRcp(gs), else 0. Returns false, writing nothing,
// when a candidate scale is outside the ladder's range (zero included): the caller then
// runs QuantizeGroup itself.
template <bool kFp16>
KVT_HD bool Quantize4over6Pair(const uint32_t (&w)[8], uint32_t amax16, float gs, float rcp, uint8_t& sf_out,
                               uint32_t& pk0, uint32_t& pk1) {
  using namespace nvfp4;
  const float amax = LadderToFloat<kFp16>(amax16);
  float q6, q4;
  LadderScaleQuotients(amax, gs, rcp, q6, q4);
  uint8_t sf6, sf4;
  LadderE4M3Pair(q6, q4, sf6, sf4);
  float f6, f4;
  LadderE4M3PairToFloat(sf6, sf4, f6, f4);
  const float s6 = kvt_mul(f6, gs);
  const float s4 = kvt_mul(f4, gs);
  if (!LadderApplies(s6) || !LadderApplies(s4)) return false;
  uint32_t p[8], pa[8];
  LadderPairWords(w, p);
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 8; ++i) pa[i] = LadderAbs2<kFp16>(p[i]);
  uint32_t hb[7];
  LadderPairBounds<kFp16>(s6, hb);
  uint32_t c0, c1;
  LadderGroupIdxGe<kFp16>(pa, hb, c0, c1);
  uint8_t sf = sf6;
  if (sf4 != sf6) {  // equal bytes: equal errors, and a tie keeps max6
    uint32_t q0, q1;
    LadderPairBounds<kFp16>(s4, hb);
    LadderGroupIdxGe<kFp16>(pa, hb, q0, q1);
    float x[16];
    LadderGroupFloats<kFp16>(w, x);
    int four = -1;  // 1: sf4 wins, 0: sf6 wins, -1: the FMA sums do not decide
    if (FastDecisionApplies(s6) && FastDecisionApplies(s4)) {
      const float e6 = PairCodesSquaredErrorFma(c0, c1, s6, x);
      const float e4 = PairCodesSquaredErrorFma(q0, q1, s4, x);
      const float margin = FastDecisionMargin(s6, s4, e6, e4);
      if (kvt_add(e4, margin) < e6) {
        four = 1;
      } else if (kvt_add(e6, margin) < e4) {
        four = 0;
      }
    }
    if (four < 0) {
      four = LadderExactFourWins<kFp16>(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], c0, c1, q0, q1, s6, s4);
    }
    if (four == 1) {
      c0 = q0;
      c1 = q1;
      sf = sf4;
    }
  }
  // The codes carry x's sign (-0 included), whichever scale won.
  pk0 = c0 | LadderPairSigns<0>(p[0]) | LadderPairSigns<1>(p[1]) | LadderPairSigns<2>(p[2]) | LadderPairSigns<3>(p[3]);
  pk1 = c1 | LadderPairSigns<0>(p[4]) | LadderPairSigns<1>(p[5]) | LadderPairSigns<2>(p[6]) | LadderPairSigns<3>(p[7]);
  sf_out = sf;
  return true;
}

}  // namespace kvtier::kernels
