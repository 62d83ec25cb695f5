// Launch arguments shared by the host side (api.cu) and the kernels (*.cu). Internal:
// callers use kernels/include/kvtier/kernels.h. All sizes are validated by api.cu before
// any of these structs reaches a kernel.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace kvtier::kernels::detail {

// Unsigned division by a divisor fixed at launch, in a multiply-high and a shift (the
// round-up method of Granlund and Montgomery): exact for every n < 2^31 and every d >= 1
// (m = floor(2^32 (2^s - d) / d) + 1 with s = ceil(log2 d); then umulhi(n, m) <= n, so the
// sum does not wrap). Slot ids are below 2^31 (kvt_pool ids are int32).
struct FastDiv {
  uint32_t d = 1, m = 1, s = 0;
  static FastDiv Make(uint32_t divisor) {
    FastDiv f;
    f.d = divisor == 0 ? 1 : divisor;
    while ((uint64_t{1} << f.s) < f.d) ++f.s;
    f.m = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << f.s) - f.d)) / f.d + 1);
    return f;
  }
#ifdef __CUDACC__
  __host__ __device__
#endif
  uint32_t Div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, m);
#else
    const uint32_t hi = static_cast<uint32_t>((uint64_t{n} * m) >> 32);
#endif
    return (hi + n) >> s;
  }
};

// Where the page of one layer of a slot lies: the ONE address function of the kernels
// (kvt_pool, kernels.h). The pool is cut into slabs of slab_bytes; a slab holds N slots of
// class_bytes, stored layer-major: page l of the slot j of the slab at
//   slab start + l * N * P + j * P
// Slot id s is at offset s * slot_bytes (the granule), so its slab is s / ids_per_slab and
// j = (s % ids_per_slab) / ids_per_slot. Block-major pools (the slot's L pages side by
// side) are the case N = 1 with a slab of one granule: page l of slot s at
// s * slot_bytes + l * P; a granule below the block's bytes is fine there.
struct PoolMap {
  uint64_t slab_bytes = 0;    // bytes per slab (block-major: slot_bytes)
  uint64_t layer_offset = 0;  // l * N * P for the launch's layer
  uint64_t page_bytes = 0;    // P
  uint32_t per_slab = 1;      // N: slots per slab (block-major: 1)
  FastDiv ids_per_slab;       // slab_bytes / slot_bytes (block-major: 1)
  FastDiv ids_per_slot;       // class_bytes / slot_bytes (block-major: 1)
  // The offset of slot `slot`'s page from the pool's base. `ok` is cleared when the id
  // falls in a slab's tail past its last slot (no slot lives there); the caller has
  // checked slot < the usable ids.
#ifdef __CUDACC__
  __host__ __device__
#endif
  uint64_t Page(uint32_t slot, bool& ok) const {
    const uint32_t slab = ids_per_slab.Div(slot);
    const uint32_t j = ids_per_slot.Div(slot - slab * ids_per_slab.d);
    ok = ok && j < per_slab;
    return static_cast<uint64_t>(slab) * slab_bytes + layer_offset + static_cast<uint64_t>(j) * page_bytes;
  }
};

struct DecodeLaunch {
  const uint16_t* q;        // [B, Hq, D] bf16
  uint16_t* out;            // [B, Hq, D] bf16
  float* lse;               // [B, Hq] or null
  const uint8_t* pool;      // the page of slot s at pool + map.Page(s)
  PoolMap map;
  uint64_t num_slots;
  // min(num_slots, 2^31): a block-table entry e is valid iff uint32(e) < num_slots32 (a
  // negative entry is >= 2^31 as uint32): one 32-bit compare instead of two 64-bit ones.
  uint32_t num_slots32;
  uint32_t k_data, k_scale, v_data, v_scale;  // region offsets inside a page
  const int32_t* block_table;  // [B, max_blocks]
  const int32_t* seq_lens;     // [B]
  int batch, num_q_heads, num_kv_heads, group, max_blocks, max_seq_len;
  int block_tokens, log2_block_tokens;
  int num_splits, chunk;    // tokens per split: a multiple of 16
  int ws_parts;             // partial results per (b, hq) in the workspace (set by the launcher:
                            // num_splits / kDecodeWarps when a CTA merges its warps' splits)
  float k_scale_f, v_scale_f;  // global scales
  float softmax_scale;
  float* ws_o;              // [B, Hq, ws_parts, D] partial outputs (normalized)
  float* ws_lse;            // [B, Hq, ws_parts] partial log2-sum-exp
  int32_t* error_flag;      // or null
  // The decode lets the merge grid launch (griddepcontrol.launch_dependents) at its start
  // instead of in its epilogue, so the merge CTAs can be resident, waiting in
  // griddepcontrol.wait, before the decode's last CTAs end (set by api.cu when the
  // decode's grid leaves at least half of the GPU's resident warps free).
  int early_trigger;
};

// The paged decode (decode_kernel.cuh), then, when the splits leave more than one partial
// per row, the split merge (decode_merge.cu). format: 0 nvfp4, 1 fp8, 2 bf16. Returns the
// launch error.
cudaError_t LaunchDecode(int format, int head_dim, const DecodeLaunch& a, cudaStream_t stream);
// The page-read probe (kvt_decode_read_probe): the NVFP4 decode's copy pipeline over the
// same bytes, with no arithmetic and no output.
cudaError_t LaunchDecodeReadProbe(int head_dim, const DecodeLaunch& a, cudaStream_t stream);
// Warps of the decode kernel resident per SM (occupancy x warps per CTA), for the split choice.
int DecodeWarpsPerSm(int format, int head_dim);
// The split merge of a.ws_parts partials per (b, hq) row, launched with PDL: the lean merge
// kernel (128-thread blocks, one round of loads) up to kLeanParts partials per row, the
// general merge kernel beyond.
cudaError_t LaunchDecodeMerge(int head_dim, const DecodeLaunch& a, cudaStream_t stream);
inline constexpr int kLeanParts = 256;
inline constexpr int kDecodeWarps = 4;  // warps per CTA; one warp per (b, kv head, split)

struct QuantizeLaunch {
  int format;               // kvt_format: 0 nvfp4, 1 fp8, 2 bf16
  const uint16_t* k;        // [N, H, D]
  const uint16_t* v;
  int fp16;                 // 0 bf16, 1 fp16
  int num_tokens;
  const int32_t* slot_ids;
  const int32_t* positions;
  uint8_t* pool;
  PoolMap map;
  uint64_t num_slots;
  uint32_t k_data, k_scale, v_data, v_scale;
  int num_kv_heads, head_dim, block_tokens;
  float k_scale_f, v_scale_f;
  // RN(1 / scale) where LadderScaleHasRcp(scale) (kernels/e2m1_ladder.h), else 0: the
  // 4over6 pair path's division-free scale quotients. Set by LaunchQuantize.
  float k_rcp_f, v_rcp_f;
  int rule;                 // 0 max6, 1 4over6
  int32_t* error_flag;
};
cudaError_t LaunchQuantize(const QuantizeLaunch& a, cudaStream_t stream);

struct DequantLaunch {
  uint16_t* out;            // [N, H, D] bf16
  int num_tokens;
  const int32_t* slot_ids;
  const int32_t* positions;
  const uint8_t* pool;
  PoolMap map;
  uint64_t num_slots;
  uint32_t data, scale;     // region offsets of the side
  int format, num_kv_heads, head_dim, block_tokens;
  float scale_f;
  int32_t* error_flag;
};
cudaError_t LaunchDequant(const DequantLaunch& a, cudaStream_t stream);

// kvt_engine_pages: one CUDA block per (row i, layer, side, head), T rows of head_dim.
struct EnginePagesLaunch {
  const uint64_t* engine;
  int64_t block_stride, head_stride, token_stride;
  const int64_t* block_ids;
  int n;
  int64_t num_blocks;
  uint8_t* rows;
  uint64_t row_stride, page_bytes, side_bytes;  // kvtier page and side (K or V) bytes
  int num_layers, num_kv_heads, head_dim, block_tokens, elem_bytes, format, direction;
  const float* scales;
  int32_t* error_flag;
  int32_t* row_errors;  // NVFP4 scatter: [n], written by the scale check, read by the decode
};
cudaError_t LaunchEnginePages(const EnginePagesLaunch& a, cudaStream_t stream);

cudaError_t LaunchReadProbe(const void* src, uint64_t bytes, uint32_t* sink, cudaStream_t stream);

// Error codes the kernels write to *error_flag (ORed).
inline constexpr int32_t kErrSlotRange = 1;   // slot id / position out of range: skipped
inline constexpr int32_t kErrNonFinite = 2;   // non-finite input value: token skipped
inline constexpr int32_t kErrSeqLen = 4;      // sequence length out of range
inline constexpr int32_t kErrBadScale = 8;    // NVFP4 block or global scale not usable: row skipped

}  // namespace kvtier::kernels::detail
