// CPU references for the kvtier kernels (kernels/include/kvtier/kernels.h).
//
// These are what the GPU tests compare against, and they are built with or without CUDA
// (so CI tests them on machines without a GPU):
//   - QuantizeAppendRef: the NVFP4 bytes quantize_append must write. It calls the CPU
//     codec's group rule (formats/nvfp4_math.h) itself, so "bit-identical to the codec"
//     is checked against the codec, not against a copy of it.
//   - PageValue / DequantizeRef: the value a page holds, in float64.
//   - DecodeRef: single-token attention in float64 over the *dequantized* cache, so the
//     test measures the kernel's arithmetic error, not the quantization error.
// The pool image is host memory laid out exactly like the device pool (kvt_pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "formats/layout.h"
#include "formats/nvfp4_math.h"
#include "formats/status.h"

namespace kvtier::kernels {

// A host image of the slot pool (same bytes as the device pool).
struct HostPool {
  uint8_t* base = nullptr;     // slot s at base + s * slot_bytes. Default: null (refused)
  // The stride of slot ids: >= BlockBytes(format, geometry) for slots of one size, or the
  // granule of slots of several sizes (a block spans several). Default: 0 (refused)
  size_t slot_bytes = 0;
  size_t num_slots = 0;        // slots in the image. Default: 0 (refused)
  Geometry geometry;           // L, H, D, T. Default: all zero (refused)
  KvFormat format = KvFormat::kNvfp4;  // page format. Default: nvfp4
  // Layer-major slabs (kvt_pool.slab_bytes / class_bytes): page l of slot j of a slab at
  // slab start + l * N * P + j * P. Default: 0, 0 (block-major)
  size_t slab_bytes = 0;
  size_t class_bytes = 0;

  // Invalid unless the geometry is valid for the format and the image holds a block.
  Status Validate() const;
  // Slot ids whose whole block lies in the image (all of them when a stride holds a block;
  // layer-major: those of whole slabs, less the ids of a slab's tail, see SlotValid).
  size_t usable_slots() const;
  // Whether slot id s names a slot (below usable_slots, not in a slab's tail).
  bool SlotValid(int64_t s) const;
  // Start of the page of (slot, layer).
  uint8_t* Page(size_t slot, uint32_t layer) const;
};

// bfloat16 / float16 <-> float32, round-to-nearest-even (NaN stays NaN).
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t b);
uint16_t FloatToFp16(float f);
float Fp16ToFloat(uint16_t h);

// Writes K and V of num_tokens tokens (float32, [num_tokens, H, D], already rounded to
// the 16-bit input type) into the NVFP4 pages of `layer`, token i at
// (slot_ids[i], positions[i]). Invalid (nothing written) on a bad index or non-finite
// value, or when the pool is not NVFP4.
Status QuantizeAppendRef(const HostPool& pool, std::span<const float> k, std::span<const float> v,
                         std::span<const int32_t> slot_ids, std::span<const int32_t> positions,
                         uint32_t layer, float k_scale, float v_scale, nvfp4::ScaleRule rule);

// Value of element (h, t, d) of `side` (0 = K, 1 = V) of the page (slot, layer), times the
// global scale for NVFP4 and FP8 (ignored for BF16).
double PageValue(const HostPool& pool, size_t slot, uint32_t layer, int side, uint32_t h,
                 uint32_t t, uint32_t d, float scale);

// Dequantized [num_tokens, H, D] of one side, token i from (slot_ids[i], positions[i]).
std::vector<double> DequantizeRef(const HostPool& pool, std::span<const int32_t> slot_ids,
                                  std::span<const int32_t> positions, uint32_t layer, int side,
                                  float scale);

struct DecodeRefArgs {
  std::span<const float> q;             // [batch, num_q_heads, D] (bf16-rounded values)
  std::span<const int32_t> block_table; // [batch, max_blocks]
  std::span<const int32_t> seq_lens;    // [batch]
  int batch = 0;
  int num_q_heads = 0;
  int max_blocks = 0;
  uint32_t layer = 0;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  float softmax_scale = 1.0f;
};

// out[b, hq, :] = softmax(scale * q . K^T) V over tokens [0, seq_lens[b]) in float64;
// lse[b, hq] = natural log of the softmax denominator (with the max included). A sequence
// of length 0 gives zeros and lse = -inf. Invalid on a bad argument.
Status DecodeRef(const HostPool& pool, const DecodeRefArgs& a, std::vector<double>* out,
                 std::vector<double>* lse);

}  // namespace kvtier::kernels
