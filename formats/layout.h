// Page and block layout of KV blocks: the byte offsets every tier and kernel agree on.
//
// A *page* is one layer's K and V for T tokens of one tensor-parallel rank. NVFP4 pages
// are byte-compatible with vLLM's NVFP4 page in HND order (DESIGN.md section 3):
//
//   | K_data H*T*(D/2) | K_sf H*T*(D/16) | V_data H*T*(D/2) | V_sf H*T*(D/16) |
//   data byte  of (h, t, d) = side + (h*T + t)*(D/2)  + d/2   (low nibble: even d)
//   scale byte of (h, t, d) = side + H*T*(D/2) + (h*T + t)*(D/16) + d/16
//
// FP8 pages hold one E4M3 byte per value, | K H*T*D | V H*T*D | (per-tensor scale in the
// contract); BF16 pages two bytes per value, | K H*T*D*2 | V H*T*D*2 |, both HND.
// A *block* is the pages of all L layers for the same T tokens, layer after layer; it
// fills one slot in every tier and has one key.
#pragma once

#include <cstddef>
#include <cstdint>

#include "formats/status.h"

namespace kvtier {

// Element format of a KV block.
enum class KvFormat : uint8_t {
  kNvfp4 = 0,  // E2M1 values, E4M3 scale per 16 values along D, FP32 per-layer scale
  kFp8 = 1,    // E4M3 values, FP32 per-layer scale
  kBf16 = 2,   // bfloat16 values
};
const char* KvFormatName(KvFormat f);
// Parses "nvfp4" / "fp8" / "bf16". Returns false on anything else.
bool ParseKvFormat(const char* s, KvFormat* out);

// Shape of the KV cache one contract describes.
struct Geometry {
  uint32_t num_layers = 0;    // L
  uint32_t num_kv_heads = 0;  // H, of this tensor-parallel rank
  uint32_t head_dim = 0;      // D; a multiple of 16 for NVFP4
  uint32_t block_tokens = 0;  // T, tokens per block

  // Invalid unless every field is in range: L in [1, 1024], H in [1, 256],
  // D in [16, 1024] and a multiple of 16, T in [1, 1024], and a block under 4 GiB.
  Status Validate(KvFormat format) const;

  bool operator==(const Geometry&) const = default;
};

inline constexpr size_t kSlotAlignment = 4096;  // every slot and NVMe payload

inline constexpr size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Offsets of the four regions of one page, relative to the page start.
struct PageLayout {
  size_t k_data = 0;
  size_t k_scale = 0;  // == v_data for FP8/BF16 (no scale regions)
  size_t v_data = 0;
  size_t v_scale = 0;
  size_t page_bytes = 0;
};

PageLayout MakePageLayout(KvFormat format, const Geometry& g);

// Bytes of one page (one layer) and of one block (all layers).
size_t PageBytes(KvFormat format, const Geometry& g);
size_t BlockBytes(KvFormat format, const Geometry& g);
// Block bytes rounded up to the slot alignment: what one slot in any tier occupies.
size_t SlotBytes(KvFormat format, const Geometry& g);
// Bytes of block scales inside one block (0 for FP8/BF16), for stats.
size_t BlockScaleBytes(KvFormat format, const Geometry& g);

// Offset within a block of the page of `layer`.
inline size_t PageOffset(KvFormat format, const Geometry& g, uint32_t layer) {
  return static_cast<size_t>(layer) * PageBytes(format, g);
}

// NVFP4 element addressing within one side (K or V) of a page; `side` is the offset of
// that side's data region (k_data or v_data). Offsets follow the formula above.
inline size_t Nvfp4DataOffset(const Geometry& g, size_t side, uint32_t h, uint32_t t,
                              uint32_t d) {
  return side + (static_cast<size_t>(h) * g.block_tokens + t) * (g.head_dim / 2) + d / 2;
}
inline size_t Nvfp4ScaleOffset(const Geometry& g, size_t side, uint32_t h, uint32_t t,
                               uint32_t d) {
  const size_t data_bytes = static_cast<size_t>(g.num_kv_heads) * g.block_tokens * (g.head_dim / 2);
  return side + data_bytes + (static_cast<size_t>(h) * g.block_tokens + t) * (g.head_dim / 16) +
         d / 16;
}

}  // namespace kvtier
