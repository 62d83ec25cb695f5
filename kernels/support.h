// The decode shapes the kernels serve: one table, read by kvt_decode's checks
// (api.cu), by kvt_decode_supports / kvt_decode_shapes (api.cu and api_nocuda.cc, so a
// build without CUDA answers the same) and through them by the Python side
// (kvtier.kernels.decode_shapes), which refuses a model before it allocates anything.
// decode_launch.cu instantiates exactly these head dims and groups; a shape added here
// must be instantiated there (the GPU test DecodeShapes walks this table).
#ifndef KVTIER_KERNELS_SUPPORT_H_
#define KVTIER_KERNELS_SUPPORT_H_

#include <cstdint>
#include <string>

#include "kernels/include/kvtier/kernels.h"

namespace kvtier::kernels {

inline constexpr uint32_t kDecodeHeadDims[] = {64, 128, 256};
inline constexpr uint32_t kDecodeGroups[] = {1, 2, 4, 8};
inline constexpr uint32_t kDecodeBlockTokens[] = {16, 32, 64};

// head_dim 256 is instantiated for NVFP4 pages only (decode_launch.cu).
inline bool DecodeHeadDimServed(uint32_t format, uint32_t head_dim) {
  return head_dim == 64 || head_dim == 128 || (head_dim == 256 && format == KVT_FORMAT_NVFP4);
}

// "" when kvt_decode serves pages of `format` with this head_dim, GQA group (query heads
// per KV head) and block_tokens; otherwise the reason, one line.
inline std::string DecodeUnsupportedReason(uint32_t format, uint32_t head_dim, uint32_t group,
                                           uint32_t block_tokens) {
  if (format > KVT_FORMAT_BF16) return "unknown page format " + std::to_string(format);
  static const char* const kNames[] = {"nvfp4", "fp8", "bf16"};
  if (!DecodeHeadDimServed(format, head_dim)) {
    return "head_dim " + std::to_string(head_dim) + " unsupported for " + kNames[format] +
           " pages (64, 128; 256 for nvfp4)";
  }
  if (group != 1 && group != 2 && group != 4 && group != 8) {
    return "GQA group " + std::to_string(group) + " unsupported (1, 2, 4, 8)";
  }
  if (block_tokens != 16 && block_tokens != 32 && block_tokens != 64) {
    return "block_tokens " + std::to_string(block_tokens) + " unsupported (16, 32, 64)";
  }
  return "";
}

// Writes up to `capacity` served shapes to `out` and returns how many there are.
inline uint32_t DecodeShapes(kvt_decode_shape* out, uint32_t capacity) {
  uint32_t n = 0;
  for (uint32_t f = KVT_FORMAT_NVFP4; f <= KVT_FORMAT_BF16; ++f) {
    for (uint32_t d : kDecodeHeadDims) {
      if (!DecodeHeadDimServed(f, d)) continue;
      for (uint32_t g : kDecodeGroups) {
        for (uint32_t t : kDecodeBlockTokens) {
          if (out != nullptr && n < capacity) out[n] = kvt_decode_shape{f, d, g, t};
          ++n;
        }
      }
    }
  }
  return n;
}

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_SUPPORT_H_
