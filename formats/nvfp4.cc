// Compiled with -ffp-contract=off (see formats/CMakeLists.txt): the codec's float
// arithmetic must round exactly as written so that GPU kernels can match it.
#include "formats/nvfp4.h"

#include <cmath>
#include <string>

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

void QuantizeUnchecked(const float* x, size_t n, float kv_scale, ScaleRule rule, uint8_t* data,
                       uint8_t* scales) {
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
