/* kvtier kernels: C ABI of the CUDA kernels that read and write KV pages in the slot pool.
 *
 * What lives here (DESIGN.md sections 3 and 4):
 *   - kvt_quantize_append: BF16/FP16 K and V of one layer -> pages written straight into
 *     pool slots: NVFP4 bit-identical to the CPU codec (formats/nvfp4.h) for every input,
 *     FP8 as E4M3 of x / scale (round to nearest even, saturating at +-448), BF16 as is.
 *   - kvt_decode: fused paged decode attention (one query token per sequence) over NVFP4,
 *     FP8 (E4M3, per-layer scale) or BF16 pages, split-KV ("flash-decoding") with an LSE
 *     merge so that batch 1 at long context fills the GPU.
 *   - kvt_dequantize_pages: pages -> BF16 [tokens, H, D] (prefill workspace).
 *   - kvt_engine_pages: an engine's paged KV tensors <-> kvtier block rows in one launch
 *     (kvtier.pages), decoding NVFP4 rows to BF16 on the way in.
 *
 * The pool: slot s starts at pool + s * slot_bytes; inside a slot the pages of layers
 * 0..L-1 follow each other (formats/layout.h gives the bytes of a page), unless the pool
 * is layer-major (kvt_pool.slab_bytes, kvtierd's HBM arena): then one layer's pages of
 * the slots of a slab lie side by side (kvt_pool says where). Block tables hold
 * slot ids (int32). Every pointer named "device" must be device memory (or managed).
 * slot_bytes is the stride between slot ids: a slot size of at least a block, or, for an
 * arena of slots of several sizes (kvtierd's HBM tier with slot classes), its granule
 * (kvtier_hbm_granule), where a block spans several strides; offsets are 64-bit.
 *
 * Errors: every function returns a kvt_status (0 = OK) and never throws; on failure
 * kvt_last_error() gives a one-line reason (thread-local, valid until the next call of
 * this API on the same thread). Invalid or unsupported arguments are refused before
 * anything is launched, so the pool and the outputs are unchanged.
 *
 * Bounds: the launchers take num_slots, and the kernels never read or write outside
 * [pool, pool + num_slots * slot_bytes): a slot id whose block would pass the end (with a
 * stride below the block size, the last ones) is out of range like one >= num_slots. When host copies of the block table / slot
 * mapping are passed, they are validated before launch (KVT_INVALID on an out-of-range
 * entry, nothing launched). Without host copies, a kernel that meets an out-of-range
 * entry skips it (no access), sets *error_flag (if given) to a non-zero code and, for
 * decode, writes NaN to the outputs of that sequence.
 *
 * Supported decode shapes: head_dim 64 or 128 (and 256 for NVFP4 pages); block_tokens
 * 16, 32 or 64; query heads per KV head (GQA group) 1, 2, 4 or 8. Anything else is
 * KVT_UNSUPPORTED. kvt_decode_shapes lists them and kvt_decode_supports answers for one
 * shape, in a build without CUDA too: an integration asks before it allocates.
 *
 * CUDA graphs: kvt_decode may be captured (global capture mode too, and as the process's
 * first decode) and replayed with new contents in the same buffers (queries, seq_lens,
 * block table, pool). The split plan is fixed at capture from max_seq_len and the GPU, so
 * replays must keep seq_lens <= the captured max_seq_len and the same workspace. A split
 * decode is two kernels joined by a programmatic (PDL) edge. Tested: DecodeGraph in
 * tests/kernels/gpu_test.cc. One workspace must not serve two decodes at once.
 *
 * Built without CUDA, every launcher returns KVT_UNSUPPORTED (the CPU references in
 * kernels/reference.h are always built).
 */
#ifndef KVTIER_KERNELS_H_
#define KVTIER_KERNELS_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Same values as kvtier::StatusCode (formats/status.h). */
typedef enum kvt_status {
  KVT_OK = 0,
  KVT_INVALID = 6,
  KVT_UNSUPPORTED = 7,
  KVT_CUDA_ERROR = 100 /* a CUDA call failed; kvt_last_error() names it */
} kvt_status;

/* Element format of the pages (formats/layout.h KvFormat). */
typedef enum kvt_format { KVT_FORMAT_NVFP4 = 0, KVT_FORMAT_FP8 = 1, KVT_FORMAT_BF16 = 2 } kvt_format;

/* 16-bit floating type of activations handed to quantize_append. */
typedef enum kvt_dtype { KVT_DTYPE_BF16 = 0, KVT_DTYPE_FP16 = 1 } kvt_dtype;

/* Where the pages live and what they look like (the scale contract's geometry). */
typedef struct kvt_pool {
  void* base;            /* device; slot s at base + s * slot_bytes; 16-byte aligned */
  uint64_t slot_bytes;   /* stride of slot ids, a positive multiple of 16: >= L * page
                            bytes, or the granule of slots of several sizes */
  uint64_t num_slots;    /* slot ids in [0, num_slots) whose block ends inside
                            num_slots * slot_bytes */
  uint32_t num_layers;   /* L */
  uint32_t num_kv_heads; /* H */
  uint32_t head_dim;     /* D */
  uint32_t block_tokens; /* T */
  uint32_t format;       /* kvt_format */
  /* Layer-major slabs (appended; 0 = block-major, the layout above). The pool is cut into
   * slabs of slab_bytes, each holding N = slab_bytes / class_bytes slots of class_bytes
   * stored layer-major: page l of the slot j of a slab at
   *   slab start + l * N * P + j * P          (P = the page bytes, formats/layout.h)
   * and slot id s is slot j = (s * slot_bytes % slab_bytes) / class_bytes of slab
   * s * slot_bytes / slab_bytes. One layer's pages of the slots of a slab lie dense, so a
   * decode of one layer over many blocks reads a compact region. Both multiples of
   * slot_bytes, L * P <= class_bytes <= slab_bytes, slab_bytes / slot_bytes <= 2^31, and
   * the pool holds a slab. An id in a slab's tail past its N slots is out of range. */
  uint64_t slab_bytes;
  uint64_t class_bytes;
} kvt_pool;

typedef struct kvt_quantize_params {
  const void* k;                 /* device [num_tokens, H, D] dtype, contiguous */
  const void* v;                 /* device [num_tokens, H, D] dtype, contiguous */
  uint32_t dtype;                /* kvt_dtype */
  int32_t num_tokens;            /* >= 0 */
  const int32_t* slot_ids;       /* device [num_tokens]: slot of each token */
  const int32_t* positions;      /* device [num_tokens]: position in block, [0, T) */
  const int32_t* slot_ids_host;  /* optional host copy, validated before launch; or NULL */
  const int32_t* positions_host; /* optional host copy; NULL unless slot_ids_host is set */
  uint32_t layer;                /* layer index < L */
  float k_scale;                 /* this layer's K global (dequantization) scale (1 for BF16) */
  float v_scale;                 /* this layer's V global scale (1 for BF16) */
  uint32_t scale_rule;           /* 0 = max6, 1 = 4over6 (NVFP4; ignored otherwise) */
  int32_t* error_flag;           /* optional device int: set non-zero on a skipped token */
} kvt_quantize_params;

typedef struct kvt_decode_params {
  const void* q;                 /* device [batch, num_q_heads, D] bf16 */
  void* out;                     /* device [batch, num_q_heads, D] bf16 */
  float* lse;                    /* optional device [batch, num_q_heads] f32: natural-log
                                    log-sum-exp of the scaled scores; or NULL */
  const int32_t* block_table;    /* device [batch, max_blocks] slot ids */
  const int32_t* seq_lens;       /* device [batch] tokens of each sequence, [0, max_seq_len] */
  const int32_t* block_table_host; /* optional host copy, validated before launch; or NULL */
  const int32_t* seq_lens_host;    /* host copy, required when block_table_host is set */
  int32_t batch;                 /* >= 1 */
  int32_t num_q_heads;           /* a multiple of H; group = num_q_heads / H in {1,2,4,8} */
  int32_t max_blocks;            /* columns of block_table */
  int32_t max_seq_len;           /* >= every seq_lens[b]; <= max_blocks * T */
  uint32_t layer;                /* < L */
  float k_scale;                 /* K global scale (NVFP4, FP8); must be 1 for BF16 */
  float v_scale;                 /* V global scale (NVFP4, FP8); must be 1 for BF16 */
  float softmax_scale;           /* e.g. 1/sqrt(D) */
  int32_t num_splits;            /* KV splits per sequence; 0 = chosen from the GPU size */
  void* workspace;               /* device scratch of kvt_decode_workspace_bytes(); may be
                                    NULL when that is 0 */
  uint64_t workspace_bytes;
  int32_t* error_flag;           /* optional device int: set non-zero on a refused entry */
} kvt_decode_params;

typedef struct kvt_dequant_params {
  void* out;                     /* device [num_tokens, H, D] bf16 */
  int32_t num_tokens;
  const int32_t* slot_ids;       /* device [num_tokens] */
  const int32_t* positions;      /* device [num_tokens] */
  const int32_t* slot_ids_host;  /* optional host copies, validated before launch */
  const int32_t* positions_host;
  uint32_t layer;
  uint32_t side;                 /* 0 = K, 1 = V */
  float scale;                   /* global scale of that side (NVFP4, FP8) */
  int32_t* error_flag;
} kvt_dequant_params;

/* Copies between an engine's paged KV tensors and kvtier block rows (kvtier.pages): n
 * blocks x L layers x K/V x H heads x T tokens of one head_dim row each, in one launch.
 * Engine side: the row of (block b, layer l, side s, head h, token t) is at
 *   engine[2*l + s] + b * block_stride + h * head_stride + t * token_stride
 * (bytes; any NHD/HND order and padding). kvtier side: row i of the block bytes at
 * rows + i * row_stride, the page of layer l at l * page bytes, HND (formats/layout.h).
 * format BF16/FP8: rows hold that format and the bytes are copied (elem_bytes 2 / 1), in
 * either direction. format NVFP4: scatter only; the rows' NVFP4 pages are decoded to BF16
 * as DecodeValue does ((e2m1 * e4m3) * scale, the CPU codec's value bit for bit before the
 * BF16 rounding), with scales[2*l + s] the global scales. A block id outside
 * [0, num_blocks) is skipped and sets *error_flag.
 * NVFP4 rows are checked on the device before they are decoded, in the same stream order
 * (no host synchronization): row_errors[i] becomes 0 when row i is sound, else the OR of
 * 1 (block id out of range) and 8 (a bad scale: a block scale byte that is an E4M3 NaN or
 * negative, 0x7F and above, or a global scale that is not a finite positive normal
 * float). A row with a non-zero entry is not decoded: its engine pages keep their bytes.
 * The caller reads row_errors after the stream passes the call and treats those blocks as
 * not loaded. */
typedef struct kvt_engine_pages_params {
  const uint64_t* engine;        /* device [2 * L]: address of block 0 of layer l, side s */
  int64_t block_stride;          /* bytes between blocks of the engine tensors */
  int64_t head_stride;           /* bytes between heads */
  int64_t token_stride;          /* bytes between tokens */
  uint32_t elem_bytes;           /* engine element bytes: 2 (bf16; NVFP4 decode), 1 (fp8) */
  const int64_t* block_ids;      /* device [n]: the engine block of row i */
  int32_t n;                     /* >= 0 */
  int64_t num_blocks;            /* engine blocks per layer (the id bound) */
  void* rows;                    /* device: row i at rows + i * row_stride */
  uint64_t row_stride;           /* >= the block's bytes */
  uint32_t num_layers, num_kv_heads, head_dim, block_tokens; /* L H D T of the rows */
  uint32_t format;               /* kvt_format of the rows */
  const float* scales;           /* device [2 * L] (NVFP4), else NULL */
  uint32_t direction;            /* 0 = gather (engine -> rows), 1 = scatter (rows -> engine) */
  int32_t* error_flag;           /* optional device int */
  int32_t* row_errors;           /* device [n], NVFP4 only (required there): 0 = row i decoded,
                                    else 1 | 8 as above; written by the call, never read first */
} kvt_engine_pages_params;
int kvt_engine_pages(const kvt_engine_pages_params* p, void* stream);

/* One decode shape: pages of `format` read with this head_dim, GQA group (query heads per
 * KV head) and block_tokens. */
typedef struct kvt_decode_shape {
  uint32_t format;       /* kvt_format */
  uint32_t head_dim;
  uint32_t group;
  uint32_t block_tokens;
} kvt_decode_shape;

/* Writes the shapes kvt_decode serves (every combination, by format, head_dim, group,
 * block_tokens) to out[0, capacity) and returns how many there are; out may be NULL when
 * capacity is 0. Works in a build without CUDA. */
uint32_t kvt_decode_shapes(kvt_decode_shape* out, uint32_t capacity);

/* KVT_OK when kvt_decode serves this shape, else KVT_UNSUPPORTED with the reason in
 * kvt_last_error(). Works in a build without CUDA. */
int kvt_decode_supports(uint32_t format, uint32_t head_dim, uint32_t group, uint32_t block_tokens);

/* One-line reason for the last failure on this thread ("" after success). */
const char* kvt_last_error(void);

/* Checks a pool description (geometry valid for its format, the pool holds a block,
 * alignment). */
int kvt_check_pool(const kvt_pool* pool);

int kvt_quantize_append(const kvt_pool* pool, const kvt_quantize_params* p, void* stream);

/* Bytes of scratch kvt_decode needs for these parameters (0 when no split is used). */
uint64_t kvt_decode_workspace_bytes(const kvt_pool* pool, const kvt_decode_params* p);
/* The split count kvt_decode will use (after the automatic choice). */
int32_t kvt_decode_num_splits(const kvt_pool* pool, const kvt_decode_params* p);

int kvt_decode(const kvt_pool* pool, const kvt_decode_params* p, void* stream);

/* Benchmark aid: runs kvt_decode's copy pipeline over exactly the page bytes that
 * kvt_decode(pool, p) reads (same checks, split plan and block-table walk) and computes
 * nothing: out, lse and the workspace are left as they are. It gives the memory-side
 * ceiling of the decode's access pattern. NVFP4 pools only (KVT_UNSUPPORTED otherwise). */
int kvt_decode_read_probe(const kvt_pool* pool, const kvt_decode_params* p, void* stream);

int kvt_dequantize_pages(const kvt_pool* pool, const kvt_dequant_params* p, void* stream);

/* Streams `bytes` from `src` (device) and folds them into a checksum written to *sink:
 * the pure-read roofline the decode benchmark compares against. */
int kvt_read_bandwidth_probe(const void* src, uint64_t bytes, uint32_t* sink, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_KERNELS_H_ */
