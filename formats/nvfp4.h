// The NVFP4 codec on the CPU: arrays of float32 <-> packed E2M1 data + E4M3 block scales.
//
// This is the reference every other producer of NVFP4 bytes (the GPU quantize-append
// kernel above all) must match bit for bit. The per-value rule lives in nvfp4_math.h;
// this file adds validation, the array loops and the per-tensor helpers.
//
// Array layout used by these functions (and by `kvtierctl codec`): for n values (n a
// multiple of 16), `data` holds n/2 bytes, byte j = code[2j] | code[2j+1] << 4, and
// `scales` holds n/16 E4M3 bytes, scale g covering values [16g, 16g+16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "formats/nvfp4_math.h"
#include "formats/status.h"

namespace kvtier::nvfp4 {

// A global (per-layer, per-K/V) scale is usable when it is a finite, positive, normal
// float32. Anything else would make every block scale meaningless.
bool IsValidGlobalScale(float kv_scale);

// Checks that every value is finite. Returns Invalid naming the first bad index.
Status CheckFinite(std::span<const float> x);

// Quantizes x (x.size() % 16 == 0, all finite) into data (x.size()/2 bytes) and scales
// (x.size()/16 bytes). Invalid on any size mismatch, non-finite value or bad kv_scale;
// nothing is written then.
Status Quantize(std::span<const float> x, float kv_scale, ScaleRule rule, std::span<uint8_t> data,
                std::span<uint8_t> scales);

// Inverse of Quantize: out[i] = e2m1(code_i) * e4m3(sf) * kv_scale.
Status Dequantize(std::span<const uint8_t> data, std::span<const uint8_t> scales, float kv_scale,
                  std::span<float> out);

// Unchecked inner loops (callers have validated): n values, n % 16 == 0.
void QuantizeUnchecked(const float* x, size_t n, float kv_scale, ScaleRule rule, uint8_t* data,
                       uint8_t* scales);
// The portable one-group-at-a-time loop over nvfp4_math.h's QuantizeGroup (what the
// GPU kernels run). QuantizeUnchecked uses an SSE2 path on x86-64 that produces the
// same bytes; this one is kept for the tests that prove it and for the benchmark.
void QuantizeUncheckedScalar(const float* x, size_t n, float kv_scale, ScaleRule rule,
                             uint8_t* data, uint8_t* scales);
void DequantizeUnchecked(const uint8_t* data, const uint8_t* scales, size_t n, float kv_scale,
                         float* out);

// Global-scale-only 4-bit quantization (one FP32 scale for the whole tensor, s = amax/6,
// no block scales): the baseline the published NVFP4 comparison uses. Writes the
// dequantized values to out. Returns the scale.
float QuantizeDequantizeGlobalOnly(std::span<const float> x, std::span<float> out);

// The global scale that maps the tensor's amax onto the top of the E4M3 x E2M1 range:
// amax / (448 * 6). Returns 1.0 for an all-zero tensor.
float GlobalScaleFromAmax(float amax);

}  // namespace kvtier::nvfp4
