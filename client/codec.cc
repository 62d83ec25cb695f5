// kvtier_nvfp4_encode / kvtier_nvfp4_decode: the CPU NVFP4 codec (formats/nvfp4.h) behind
// the C ABI, so that engines' CPU paths (kvtier.pages) write the bytes kvtierd's tiers and
// the CUDA kernels agree on.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "client/client_internal.h"
#include "formats/nvfp4.h"
#include "kvtier/kvtier.h"

using kvtier::lib::Fail;
using kvtier::lib::FromStatus;

namespace {

// n values, n % 16 == 0, and no size overflow in the byte counts the caller provides.
kvtier_status CheckCount(size_t n, const void* a, const void* b, const void* c) {
  if (a == nullptr || b == nullptr || c == nullptr) return Fail(KVTIER_INVALID, "a buffer is NULL");
  if (n % kvtier::nvfp4::kGroupSize != 0) {
    return Fail(KVTIER_INVALID, "value count " + std::to_string(n) + " is not a multiple of 16");
  }
  return KVTIER_OK;
}

}  // namespace

extern "C" kvtier_status kvtier_nvfp4_encode(const float* x, size_t n, float kv_scale, uint32_t rule,
                                             uint8_t* data, uint8_t* scales) {
  KVTIER_GUARD_BEGIN
  if (kvtier_status s = CheckCount(n, x, data, scales); s != KVTIER_OK) return s;
  if (rule > static_cast<uint32_t>(kvtier::nvfp4::ScaleRule::k4over6)) {
    return Fail(KVTIER_INVALID, "scale rule " + std::to_string(rule) + " is not 0 (max6) or 1 (4over6)");
  }
  return FromStatus(kvtier::nvfp4::Quantize(std::span<const float>(x, n), kv_scale,
                                            static_cast<kvtier::nvfp4::ScaleRule>(rule),
                                            std::span<uint8_t>(data, n / 2), std::span<uint8_t>(scales, n / 16)));
  KVTIER_GUARD_END
}

extern "C" kvtier_status kvtier_nvfp4_decode(const uint8_t* data, const uint8_t* scales, size_t n, float kv_scale,
                                             float* out) {
  KVTIER_GUARD_BEGIN
  if (kvtier_status s = CheckCount(n, data, scales, out); s != KVTIER_OK) return s;
  return FromStatus(kvtier::nvfp4::Dequantize(std::span<const uint8_t>(data, n / 2),
                                              std::span<const uint8_t>(scales, n / 16), kv_scale,
                                              std::span<float>(out, n)));
  KVTIER_GUARD_END
}
