// NVFP4 element and scale arithmetic shared by the CPU codec and the CUDA kernels.
//
// Everything here is the *rule* of DESIGN.md section 3, written once so that the CPU
// codec (formats/nvfp4.cc) and every GPU kernel (kernels/) produce bit-identical bytes.
// To keep that promise the arithmetic goes through kvt_mul/kvt_div/kvt_add/kvt_sub:
// on the device they are the IEEE round-to-nearest intrinsics (__fmul_rn & co., which
// the compiler never contracts into an FMA); on the host they are plain operators and
// the files that include this header are compiled with -ffp-contract=off.
//
// Formats:
//   E2M1  (4 bits): sign | 2-bit exponent | 1-bit mantissa; magnitudes
//                   {0, 0.5, 1, 1.5, 2, 3, 4, 6}; code = sign << 3 | magnitude index.
//   E4M3  (8 bits, "e4m3fn"): sign | 4-bit exponent (bias 7) | 3-bit mantissa; no inf,
//                   0x7F/0xFF are NaN, largest finite 448, smallest subnormal 2^-9.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVT_HD __host__ __device__ __forceinline__
#else
#define KVT_HD inline
#endif

namespace kvtier::nvfp4 {

inline constexpr int kGroupSize = 16;          // values per E4M3 block scale
inline constexpr float kE2M1Max = 6.0f;        // largest E2M1 magnitude
inline constexpr float kE4M3Max = 448.0f;      // largest finite e4m3fn value
inline constexpr uint8_t kE4M3MaxCode = 0x7E;  // 448

// Which block-scale candidate(s) the quantizer tries (DESIGN.md section 3).
enum class ScaleRule : uint8_t {
  kMax6 = 0,    // sf = E4M3(amax / 6 / kv_scale)
  k4over6 = 1,  // also try amax / 4; keep it when its squared error is strictly smaller
};

KVT_HD uint32_t kvt_f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
KVT_HD float kvt_u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

#if defined(__CUDA_ARCH__)
KVT_HD float kvt_mul(float a, float b) { return __fmul_rn(a, b); }
KVT_HD float kvt_div(float a, float b) { return __fdiv_rn(a, b); }
KVT_HD float kvt_add(float a, float b) { return __fadd_rn(a, b); }
KVT_HD float kvt_sub(float a, float b) { return __fsub_rn(a, b); }
#else
KVT_HD float kvt_mul(float a, float b) { return a * b; }
KVT_HD float kvt_div(float a, float b) { return a / b; }
KVT_HD float kvt_add(float a, float b) { return a + b; }
KVT_HD float kvt_sub(float a, float b) { return a - b; }
#endif

KVT_HD float kvt_abs(float a) { return kvt_u2f(kvt_f2u(a) & 0x7fffffffu); }
// max that ignores nothing: inputs are validated finite before they reach the codec.
KVT_HD float kvt_max(float a, float b) { return a > b ? a : b; }

// ---- E2M1 -------------------------------------------------------------------------

// Magnitude of an E2M1 code (low 4 bits used), with its sign.
KVT_HD float E2M1ToFloat(uint8_t code) {
  // E2M1 is a tiny float: exponent e = idx >> 1 (bias 1), mantissa m = idx & 1. For
  // e > 0 the value is (1 + m/2) * 2^(e-1), i.e. float bits (e + 126) << 23 | m << 22;
  // e = 0 is the subnormal m * 0.5. Branch-free, no table.
  const uint32_t idx = code & 7u;
  const uint32_t normal = ((((idx >> 1) + 126u) << 23) | ((idx & 1u) << 22));
  const uint32_t bits = idx >= 2u ? normal : (idx == 1u ? 0x3F000000u : 0u);
  return kvt_u2f(bits | ((static_cast<uint32_t>(code) & 8u) << 28));
}

// Round-to-nearest-even onto the E2M1 grid with saturation to +-6. The thresholds are
// those of DESIGN.md: <=0.25 -> 0, <0.75 -> 0.5, <=1.25 -> 1, <1.75 -> 1.5, <=2.5 -> 2,
// <3.5 -> 3, <=5 -> 4, else 6 (ties go to the even mantissa). The sign bit of the input
// is kept, so a negative value that rounds to zero encodes as -0 (0x8).
KVT_HD uint8_t FloatToE2M1(float v) {
  const float a = kvt_abs(v);
  const uint32_t idx = static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a >= 0.75f) +
                       static_cast<uint32_t>(a > 1.25f) + static_cast<uint32_t>(a >= 1.75f) +
                       static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a >= 3.5f) +
                       static_cast<uint32_t>(a > 5.0f);
  return static_cast<uint8_t>(((kvt_f2u(v) >> 28) & 8u) | idx);
}

// ---- E4M3 (e4m3fn) ------------------------------------------------------------------

KVT_HD float E4M3ToFloat(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xFu;
  const uint32_t man = code & 7u;
  if ((code & 0x7Fu) == 0x7Fu) return kvt_u2f(0x7fc00000u | sign);  // NaN
  if (exp == 0) {
    // Subnormal: man * 2^-9 (exact in float32).
    const float m = static_cast<float>(man) * 0.001953125f;
    return kvt_u2f(kvt_f2u(m) | sign);
  }
  return kvt_u2f(sign | ((exp + 120u) << 23) | (man << 20));
}

// Round-to-nearest-even with saturation to +-448 (SATFINITE): values at or above 448 in
// magnitude, and infinities, give 448; NaN gives 0x7F. Pure integer arithmetic on the
// float's bits, so it is the same on every compiler and device.
KVT_HD uint8_t FloatToE4M3(float v) {
  const uint32_t bits = kvt_f2u(v);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t a = bits & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7Fu);        // NaN
  if (a >= 0x43E00000u) return static_cast<uint8_t>(sign | kE4M3MaxCode);  // >= 448, inf
  if (a >= 0x3C800000u) {
    // Normal in E4M3 (>= 2^-6): round the 23-bit mantissa to 3 bits, ties to even; a
    // carry moves into the exponent, which is what RNE wants. Rebias 127 -> 7.
    const uint32_t rounded = a + 0x7FFFFu + ((a >> 20) & 1u);
    return static_cast<uint8_t>(sign | ((rounded >> 20) - (120u << 3)));
  }
  // Subnormal in E4M3: q = RNE(|v| * 2^9), 0..8 (8 is the smallest normal, code 0x08).
  // Adding 2^23 makes the float's ulp 1, so the hardware adder does the RNE.
  const float scaled = kvt_mul(kvt_u2f(a), 512.0f);
  const uint32_t q = kvt_f2u(kvt_add(scaled, 8388608.0f)) - 0x4B000000u;
  return static_cast<uint8_t>(sign | q);
}

// ---- One group of 16 values ---------------------------------------------------------

// Quantizes x[0..16) with the effective scale s = float(sf) * kv_scale. Writes codes
// (one per byte, low 4 bits) and returns the float32 sum of squared reconstruction
// errors, accumulated in index order (the 4over6 rule compares these).
KVT_HD float QuantizeWithScale(const float* x, uint8_t sf, float kv_scale, uint8_t* codes) {
  const float s = kvt_mul(E4M3ToFloat(sf), kv_scale);
  float err = 0.0f;
  for (int i = 0; i < kGroupSize; ++i) {
    const uint8_t q = (s == 0.0f) ? uint8_t{0} : FloatToE2M1(kvt_div(x[i], s));
    codes[i] = q;
    const float d = kvt_sub(kvt_mul(E2M1ToFloat(q), s), x[i]);
    err = kvt_add(err, kvt_mul(d, d));
  }
  return err;
}

// Quantizes one group of 16 values: writes 8 packed bytes (low nibble = even element)
// and returns the E4M3 block-scale byte.
KVT_HD uint8_t QuantizeGroup(const float* x, float kv_scale, ScaleRule rule, uint8_t* packed) {
  float amax = 0.0f;
  for (int i = 0; i < kGroupSize; ++i) amax = kvt_max(amax, kvt_abs(x[i]));
  uint8_t sf = FloatToE4M3(kvt_div(kvt_div(amax, 6.0f), kv_scale));
  uint8_t codes[kGroupSize];
  const float err6 = QuantizeWithScale(x, sf, kv_scale, codes);
  if (rule == ScaleRule::k4over6) {
    const uint8_t sf4 = FloatToE4M3(kvt_div(kvt_div(amax, 4.0f), kv_scale));
    uint8_t codes4[kGroupSize];
    const float err4 = QuantizeWithScale(x, sf4, kv_scale, codes4);
    if (err4 < err6) {
      sf = sf4;
      for (int i = 0; i < kGroupSize; ++i) codes[i] = codes4[i];
    }
  }
  for (int j = 0; j < kGroupSize / 2; ++j) {
    packed[j] = static_cast<uint8_t>((codes[2 * j] & 0xFu) | ((codes[2 * j + 1] & 0xFu) << 4));
  }
  return sf;
}

// Decoded value of one element: e2m1(code) * e4m3(sf) * kv_scale, left to right.
// e2m1 * e4m3 is exact in float32 (and in BF16/FP16), so only the last product rounds.
KVT_HD float DecodeValue(uint8_t code, uint8_t sf, float kv_scale) {
  return kvt_mul(kvt_mul(E2M1ToFloat(code), E4M3ToFloat(sf)), kv_scale);
}

}  // namespace kvtier::nvfp4
