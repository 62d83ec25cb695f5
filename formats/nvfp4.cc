// Compiled with -ffp-contract=off (see formats/CMakeLists.txt): the codec's float
// arithmetic must round exactly as written so that GPU kernels can match it.
#include "formats/nvfp4.h"

#include <cmath>
#include <cstring>
#include <string>

#if defined(__SSE2__)
#include <emmintrin.h>
#define KVTIER_CODEC_SSE2 1
#endif

namespace kvtier::nvfp4 {

bool IsValidGlobalScale(float kv_scale) {
  return std::isnormal(kv_scale) && kv_scale > 0.0f;
}

Status CheckFinite(std::span<const float> x) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (!std::isfinite(x[i])) {
      return Status::Invalid("value " + std::to_string(i) + " is not finite (" +
                             std::to_string(x[i]) + ")");
    }
  }
  return Status::Ok();
}

#if KVTIER_CODEC_SSE2
namespace {

// SSE2 version of QuantizeWithScale for one group: the same IEEE operations in the same
// order per value (divps/mulps/subps round exactly like their scalar forms), so the
// bytes are identical to nvfp4_math.h; tests/formats checks that on random and edge
// inputs. Writes 8 packed bytes and returns the float32 squared error (summed in index
// order, as the 4over6 rule requires) when want_err is set.
inline float QuantizeGroupSse2(const __m128 x[4], float s, bool want_err, uint8_t* packed) {
  if (s == 0.0f) {
    std::memset(packed, 0, kGroupSize / 2);
    if (!want_err) return 0.0f;
    float err = 0.0f;
    alignas(16) float xs[16];
    for (int k = 0; k < 4; ++k) _mm_store_ps(xs + 4 * k, x[k]);
    for (int i = 0; i < 16; ++i) err = err + (0.0f - xs[i]) * (0.0f - xs[i]);
    return err;
  }
  const __m128 vs = _mm_set1_ps(s);
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128i code[4];
  alignas(16) float d2[16];
  for (int k = 0; k < 4; ++k) {
    const __m128 q = _mm_div_ps(x[k], vs);
    const __m128 a = _mm_and_ps(q, abs_mask);
    // idx = (a > 0.25) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5)
    //     + (a > 5); each compare is an all-ones lane (-1), so subtract them.
    __m128i idx = _mm_setzero_si128();
    idx = _mm_sub_epi32(idx, _mm_castps_si128(_mm_cmpgt_ps(a, _mm_set1_ps(0.25f))));
    idx = _mm_sub_epi32(idx, _mm_castps_si128(_mm_cmpge_ps(a, _mm_set1_ps(0.75f))));
    idx = _mm_sub_epi32(idx, _mm_castps_si128(_mm_cmpgt_ps(a, _mm_set1_ps(1.25f))));
    idx = _mm_sub_epi32(idx, _mm_castps_si128(_mm_cmpge_ps(a, _mm_set1_ps(1.75f))));
    idx = _mm_sub_epi32(idx, _mm_castps_si128(_mm_cmpgt_ps(a, _mm_set1_ps(2.5f))));
    idx = _mm_sub_epi32(idx, _mm_castps_si128(_mm_cmpge_ps(a, _mm_set1_ps(3.5f))));
    idx = _mm_sub_epi32(idx, _mm_castps_si128(_mm_cmpgt_ps(a, _mm_set1_ps(5.0f))));
    const __m128i sign = _mm_and_si128(_mm_srli_epi32(_mm_castps_si128(q), 28), _mm_set1_epi32(8));
    code[k] = _mm_or_si128(idx, sign);
    if (want_err) {
      // E2M1 magnitude from idx: 0 -> 0, 1 -> 0.5, else (1 + m/2) * 2^(e-1) with
      // e = idx >> 1, m = idx & 1, i.e. float bits (e + 126) << 23 | m << 22.
      const __m128i e = _mm_srli_epi32(idx, 1);
      const __m128i m = _mm_and_si128(idx, _mm_set1_epi32(1));
      __m128i bits = _mm_or_si128(_mm_slli_epi32(_mm_add_epi32(e, _mm_set1_epi32(126)), 23),
                                  _mm_slli_epi32(m, 22));
      const __m128i is_half = _mm_cmpeq_epi32(idx, _mm_set1_epi32(1));
      const __m128i is_zero = _mm_cmpeq_epi32(idx, _mm_setzero_si128());
      bits = _mm_or_si128(_mm_andnot_si128(is_half, bits),
                          _mm_and_si128(is_half, _mm_set1_epi32(0x3F000000)));
      bits = _mm_andnot_si128(is_zero, bits);
      bits = _mm_or_si128(bits, _mm_slli_epi32(sign, 28));
      const __m128 d = _mm_sub_ps(_mm_mul_ps(_mm_castsi128_ps(bits), vs), x[k]);
      _mm_store_ps(d2 + 4 * k, _mm_mul_ps(d, d));
    }
  }
  // 16 codes (one per 32-bit lane) -> 16 bytes -> 8 bytes of nibble pairs.
  const __m128i w01 = _mm_packs_epi32(code[0], code[1]);
  const __m128i w23 = _mm_packs_epi32(code[2], code[3]);
  const __m128i b = _mm_packus_epi16(w01, w23);  // byte i = code i
  // As u16 lanes: v = c[2j] | c[2j+1] << 8  ->  c[2j] | c[2j+1] << 4.
  const __m128i lo = _mm_and_si128(b, _mm_set1_epi16(0x000F));
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi16(0x00F0));
  const __m128i nib = _mm_packus_epi16(_mm_or_si128(lo, hi), _mm_setzero_si128());
  _mm_storel_epi64(reinterpret_cast<__m128i*>(packed), nib);
  float err = 0.0f;
  if (want_err) {
    for (int i = 0; i < 16; ++i) err = err + d2[i];
  }
  return err;
}

uint8_t QuantizeGroupFast(const float* xp, float kv_scale, ScaleRule rule, uint8_t* packed) {
  __m128 x[4];
  __m128 amax = _mm_setzero_ps();
  const __m128 abs_mask = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  for (int k = 0; k < 4; ++k) {
    x[k] = _mm_loadu_ps(xp + 4 * k);
    amax = _mm_max_ps(amax, _mm_and_ps(x[k], abs_mask));  // max is exact: order-free
  }
  amax = _mm_max_ps(amax, _mm_shuffle_ps(amax, amax, _MM_SHUFFLE(1, 0, 3, 2)));
  amax = _mm_max_ps(amax, _mm_shuffle_ps(amax, amax, _MM_SHUFFLE(2, 3, 0, 1)));
  const float a = _mm_cvtss_f32(amax);
  uint8_t sf = FloatToE4M3((a / 6.0f) / kv_scale);
  if (rule == ScaleRule::kMax6) {
    QuantizeGroupSse2(x, E4M3ToFloat(sf) * kv_scale, false, packed);
    return sf;
  }
  const float err6 = QuantizeGroupSse2(x, E4M3ToFloat(sf) * kv_scale, true, packed);
  const uint8_t sf4 = FloatToE4M3((a / 4.0f) / kv_scale);
  uint8_t packed4[8];
  const float err4 = QuantizeGroupSse2(x, E4M3ToFloat(sf4) * kv_scale, true, packed4);
  if (err4 < err6) {
    std::memcpy(packed, packed4, 8);
    sf = sf4;
  }
  return sf;
}

}  // namespace
#endif  // KVTIER_CODEC_SSE2

void QuantizeUnchecked(const float* x, size_t n, float kv_scale, ScaleRule rule, uint8_t* data,
                       uint8_t* scales) {
  const size_t groups = n / kGroupSize;
  for (size_t g = 0; g < groups; ++g) {
#if KVTIER_CODEC_SSE2
    scales[g] = QuantizeGroupFast(x + g * kGroupSize, kv_scale, rule, data + g * (kGroupSize / 2));
#else
    scales[g] = QuantizeGroup(x + g * kGroupSize, kv_scale, rule, data + g * (kGroupSize / 2));
#endif
  }
}

void QuantizeUncheckedScalar(const float* x, size_t n, float kv_scale, ScaleRule rule,
                             uint8_t* data, uint8_t* scales) {
  const size_t groups = n / kGroupSize;
  for (size_t g = 0; g < groups; ++g) {
    scales[g] = QuantizeGroup(x + g * kGroupSize, kv_scale, rule, data + g * (kGroupSize / 2));
  }
}

void DequantizeUnchecked(const uint8_t* data, const uint8_t* scales, size_t n, float kv_scale,
                         float* out) {
  // e2m1 magnitudes times the block scale are exact; precompute the 16 products of a
  // block once, then one multiply by kv_scale per value (the rule's last rounding).
  const size_t groups = n / kGroupSize;
  for (size_t g = 0; g < groups; ++g) {
    const float sf = E4M3ToFloat(scales[g]);
    float lut[16];
    for (int c = 0; c < 16; ++c) lut[c] = E2M1ToFloat(static_cast<uint8_t>(c)) * sf;
    const uint8_t* d = data + g * (kGroupSize / 2);
    float* o = out + g * kGroupSize;
    for (int j = 0; j < kGroupSize / 2; ++j) {
      o[2 * j] = lut[d[j] & 0xF] * kv_scale;
      o[2 * j + 1] = lut[d[j] >> 4] * kv_scale;
    }
  }
}

Status Quantize(std::span<const float> x, float kv_scale, ScaleRule rule, std::span<uint8_t> data,
                std::span<uint8_t> scales) {
  if (x.size() % kGroupSize != 0) {
    return Status::Invalid("value count " + std::to_string(x.size()) +
                           " is not a multiple of 16");
  }
  if (!IsValidGlobalScale(kv_scale)) {
    return Status::Invalid("global scale must be a finite positive normal float, got " +
                           std::to_string(kv_scale));
  }
  if (data.size() != x.size() / 2 || scales.size() != x.size() / kGroupSize) {
    return Status::Invalid("output sizes do not match the input (need n/2 data and n/16 scales)");
  }
  if (rule != ScaleRule::kMax6 && rule != ScaleRule::k4over6) {
    return Status::Invalid("unknown scale rule");
  }
  KVTIER_RETURN_IF_ERROR(CheckFinite(x));
  QuantizeUnchecked(x.data(), x.size(), kv_scale, rule, data.data(), scales.data());
  return Status::Ok();
}

Status Dequantize(std::span<const uint8_t> data, std::span<const uint8_t> scales, float kv_scale,
                  std::span<float> out) {
  if (out.size() % kGroupSize != 0 || data.size() != out.size() / 2 ||
      scales.size() != out.size() / kGroupSize) {
    return Status::Invalid("sizes do not match: need n/2 data bytes and n/16 scale bytes");
  }
  if (!IsValidGlobalScale(kv_scale)) {
    return Status::Invalid("global scale must be a finite positive normal float");
  }
  for (size_t g = 0; g < scales.size(); ++g) {
    if ((scales[g] & 0x7F) == 0x7F) {
      return Status::Corrupt("block scale " + std::to_string(g) + " is an E4M3 NaN");
    }
  }
  DequantizeUnchecked(data.data(), scales.data(), out.size(), kv_scale, out.data());
  return Status::Ok();
}

float QuantizeDequantizeGlobalOnly(std::span<const float> x, std::span<float> out) {
  float amax = 0.0f;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  const float s = amax / kE2M1Max;
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = s == 0.0f ? 0.0f : E2M1ToFloat(FloatToE2M1(x[i] / s)) * s;
  }
  return s;
}

float GlobalScaleFromAmax(float amax) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  const float s = amax / (kE4M3Max * kE2M1Max);
  return IsValidGlobalScale(s) ? s : 1.0f;
}

}  // namespace kvtier::nvfp4
