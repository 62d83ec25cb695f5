// C ABI of kernels/include/kvtier/kernels.h: argument checks, split planning, launches.
// Everything refused here is refused before any launch, so nothing changes on failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "formats/layout.h"
#include "formats/nvfp4.h"
#include "kernels/include/kvtier/kernels.h"
#include "kernels/internal.h"
#include "kernels/support.h"

namespace kvtier::kernels {
namespace {

thread_local std::string g_error;
int Fail(int code, std::string msg) {
  g_error = std::move(msg);
  return code;
}
int Ok() {
  g_error.clear();
  return KVT_OK;
}
int CudaFail(cudaError_t e, const char* what) {
  return Fail(KVT_CUDA_ERROR, std::string(what) + ": " + cudaGetErrorString(e));
}

Geometry GeometryOf(const kvt_pool& p) {
  Geometry g;
  g.num_layers = p.num_layers;
  g.num_kv_heads = p.num_kv_heads;
  g.head_dim = p.head_dim;
  g.block_tokens = p.block_tokens;
  return g;
}

// Slot ids whose whole block lies in [base, base + num_slots * slot_bytes): every id when
// slot_bytes holds a block; with a stride below the block size (the slot classes of the
// HBM tier, whose stride is the granule) the ids from which the block would pass the end
// are refused. A layer-major pool: the ids of its whole slabs (a slab's tail past its N
// slots is refused by SlotIdValid / PoolMap::Page). CheckPool has ensured the pool holds a
// block (a slab).
uint64_t UsableSlots(const kvt_pool& p) {
  if (p.slab_bytes != 0) return (p.num_slots * p.slot_bytes / p.slab_bytes) * (p.slab_bytes / p.slot_bytes);
  const uint64_t block = BlockBytes(static_cast<KvFormat>(p.format), GeometryOf(p));
  if (p.slot_bytes >= block) return p.num_slots;
  return (p.num_slots * p.slot_bytes - block) / p.slot_bytes + 1;
}

// The address map of the pages of `layer` (internal.h PoolMap), for a checked pool.
detail::PoolMap MapOf(const kvt_pool& p, uint32_t layer) {
  const KvFormat f = static_cast<KvFormat>(p.format);
  const uint64_t page = PageBytes(f, GeometryOf(p));
  detail::PoolMap m;
  m.page_bytes = page;
  if (p.slab_bytes == 0) {
    m.slab_bytes = p.slot_bytes;
    m.per_slab = 1;
    m.layer_offset = PageOffset(f, GeometryOf(p), layer);
    return m;
  }
  m.slab_bytes = p.slab_bytes;
  m.per_slab = static_cast<uint32_t>(p.slab_bytes / p.class_bytes);
  m.layer_offset = uint64_t{layer} * m.per_slab * page;
  m.ids_per_slab = detail::FastDiv::Make(static_cast<uint32_t>(p.slab_bytes / p.slot_bytes));
  m.ids_per_slot = detail::FastDiv::Make(static_cast<uint32_t>(p.class_bytes / p.slot_bytes));
  return m;
}

// Whether slot id s names a slot of the pool, given its usable ids and a map of it (the
// host copies' check; the kernels make the same one).
bool SlotIdValid(uint64_t usable, const detail::PoolMap& m, int64_t s) {
  if (s < 0 || static_cast<uint64_t>(s) >= usable) return false;
  bool ok = true;
  (void)m.Page(static_cast<uint32_t>(s), ok);
  return ok;
}

int CheckPool(const kvt_pool* p) {
  if (p == nullptr) return Fail(KVT_INVALID, "pool is null");
  if (p->format > KVT_FORMAT_BF16) return Fail(KVT_INVALID, "unknown pool format " + std::to_string(p->format));
  const KvFormat f = static_cast<KvFormat>(p->format);
  if (Status s = GeometryOf(*p).Validate(f); !s.ok()) return Fail(KVT_INVALID, "pool geometry: " + s.message());
  if (p->base == nullptr) return Fail(KVT_INVALID, "pool base is null");
  if (reinterpret_cast<uintptr_t>(p->base) % 16 != 0) return Fail(KVT_INVALID, "pool base not 16-byte aligned");
  if (p->num_slots == 0) return Fail(KVT_INVALID, "pool has no slots");
  if (p->slot_bytes == 0 || p->slot_bytes % 16 != 0) return Fail(KVT_INVALID, "slot_bytes not a positive multiple of 16");
  // slot_bytes is the stride between slot ids: at least a block (one slot size), or the
  // granule of slots of several sizes, where a block spans several strides.
  const uint64_t block = BlockBytes(f, GeometryOf(*p));
  if (p->num_slots > UINT64_MAX / p->slot_bytes || p->num_slots * p->slot_bytes < block) {
    return Fail(KVT_INVALID, "pool of " + std::to_string(p->num_slots) + " x " + std::to_string(p->slot_bytes) +
                                 " bytes holds no block of " + std::to_string(block) + " bytes");
  }
  if (p->slab_bytes == 0 && p->class_bytes == 0) return KVT_OK;
  // Layer-major: every slot's pages inside its slab (L * P <= class_bytes and
  // N * class_bytes <= slab_bytes), slabs and classes on slot-id boundaries.
  const std::string geo = "layer-major pool (slab_bytes " + std::to_string(p->slab_bytes) + ", class_bytes " +
                          std::to_string(p->class_bytes) + ", slot_bytes " + std::to_string(p->slot_bytes) + "): ";
  if (p->slab_bytes == 0 || p->class_bytes == 0) return Fail(KVT_INVALID, geo + "slab_bytes and class_bytes go together");
  if (p->slab_bytes % p->slot_bytes != 0 || p->class_bytes % p->slot_bytes != 0) {
    return Fail(KVT_INVALID, geo + "slab and class bytes must be multiples of slot_bytes");
  }
  if (p->class_bytes < block) return Fail(KVT_INVALID, geo + "a class slot holds no block of " + std::to_string(block) + " bytes");
  if (p->class_bytes > p->slab_bytes) return Fail(KVT_INVALID, geo + "class larger than a slab");
  if (p->slab_bytes / p->slot_bytes > (uint64_t{1} << 31)) return Fail(KVT_INVALID, geo + "more than 2^31 slot ids per slab");
  if (p->num_slots * p->slot_bytes < p->slab_bytes) return Fail(KVT_INVALID, geo + "the pool holds no slab");
  return KVT_OK;
}

int CheckMappingHost(const kvt_pool& pool, int n, const int32_t* slots, const int32_t* pos) {
  if (slots == nullptr) return KVT_OK;
  if (pos == nullptr) return Fail(KVT_INVALID, "slot_ids_host given without positions_host");
  const uint64_t usable = UsableSlots(pool);
  const detail::PoolMap map = MapOf(pool, 0);
  for (int i = 0; i < n; ++i) {
    if (!SlotIdValid(usable, map, slots[i])) {
      return Fail(KVT_INVALID, "token " + std::to_string(i) + ": slot id " + std::to_string(slots[i]) +
                                   " out of range [0, " + std::to_string(usable) + ") or in a slab's tail");
    }
    if (pos[i] < 0 || static_cast<uint32_t>(pos[i]) >= pool.block_tokens) {
      return Fail(KVT_INVALID, "token " + std::to_string(i) + ": position " + std::to_string(pos[i]) +
                                   " out of range [0, " + std::to_string(pool.block_tokens) + ")");
    }
  }
  return KVT_OK;
}

// Shape checks of kvt_decode (no device access). Fills nothing.
int CheckDecode(const kvt_pool* pool, const kvt_decode_params* p) {
  if (int r = CheckPool(pool); r != KVT_OK) return r;
  if (p == nullptr) return Fail(KVT_INVALID, "params are null");
  const int D = static_cast<int>(pool->head_dim), T = static_cast<int>(pool->block_tokens);
  const int H = static_cast<int>(pool->num_kv_heads);
  // The GQA group is checked below, once num_q_heads is known to be a multiple of H.
  if (std::string why = DecodeUnsupportedReason(pool->format, D, 1, T); !why.empty()) {
    return Fail(KVT_UNSUPPORTED, "decode: " + why);
  }
  if (p->batch < 1) return Fail(KVT_INVALID, "decode: batch must be >= 1");
  if (p->num_q_heads < 1 || p->num_q_heads % H != 0) {
    return Fail(KVT_INVALID, "decode: num_q_heads " + std::to_string(p->num_q_heads) +
                                 " is not a multiple of the KV heads " + std::to_string(H));
  }
  const int group = p->num_q_heads / H;
  if (std::string why = DecodeUnsupportedReason(pool->format, D, group, T); !why.empty()) {
    return Fail(KVT_UNSUPPORTED, "decode: " + why);
  }
  if (p->layer >= pool->num_layers) return Fail(KVT_INVALID, "decode: layer out of range");
  if (p->q == nullptr || p->out == nullptr || p->block_table == nullptr || p->seq_lens == nullptr) {
    return Fail(KVT_INVALID, "decode: q, out, block_table and seq_lens are required");
  }
  if (p->max_blocks < 1 || p->max_seq_len < 0 ||
      static_cast<int64_t>(p->max_seq_len) > static_cast<int64_t>(p->max_blocks) * T) {
    return Fail(KVT_INVALID, "decode: need max_blocks >= 1 and 0 <= max_seq_len <= max_blocks * T");
  }
  if (!std::isfinite(p->softmax_scale)) return Fail(KVT_INVALID, "decode: softmax_scale not finite");
  if (pool->format == KVT_FORMAT_BF16) {
    if (p->k_scale != 1.0f || p->v_scale != 1.0f) return Fail(KVT_INVALID, "decode: bf16 pages take k_scale = v_scale = 1");
  } else if (!nvfp4::IsValidGlobalScale(p->k_scale) || !nvfp4::IsValidGlobalScale(p->v_scale)) {
    return Fail(KVT_INVALID, "decode: k_scale / v_scale must be finite, positive and normal");
  }
  if (p->num_splits < 0) return Fail(KVT_INVALID, "decode: num_splits must be >= 0");
  return KVT_OK;
}

// Multiprocessors of the current GPU, cached per device (the split planner asks on every
// decode call).
int SmCount() {
  constexpr int kMaxDev = 64;
  static std::atomic<int> cache[kMaxDev];  // 0 = not read yet
  int dev = 0;
  cudaGetDevice(&dev);
  if (dev < 0 || dev >= kMaxDev) return 132;
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v == 0) {
    v = 132;
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    cache[dev].store(v, std::memory_order_relaxed);
  }
  return v;
}

// Decode warps resident on the whole current GPU, per (format, head_dim); computed once
// per device (the occupancy query is slow enough to show up in a decode step).
int ResidentWarps(int format, int head_dim) {
  constexpr int kMaxDev = 64;
  static std::atomic<int> cache[kMaxDev][3][3];  // 0 = not computed yet
  int dev = 0;
  cudaGetDevice(&dev);
  const int di = head_dim == 64 ? 0 : (head_dim == 128 ? 1 : 2);
  if (dev < 0 || dev >= kMaxDev || format < 0 || format > 2) return 132 * 16;
  int v = cache[dev][format][di].load(std::memory_order_relaxed);
  if (v == 0) {
    v = SmCount() * detail::DecodeWarpsPerSm(format, head_dim);
    cache[dev][format][di].store(v, std::memory_order_relaxed);
  }
  return v;
}

struct SplitPlan {
  int splits = 1;
  int chunk = 16;
};

SplitPlan PlanSplits(const kvt_pool* pool, const kvt_decode_params* p) {
  SplitPlan s;
  const int len16 = ((p->max_seq_len + 15) / 16) * 16;
  if (len16 == 0) return s;
  int want = p->num_splits;
  if (want == 0) {
    const int resident = ResidentWarps(static_cast<int>(pool->format), static_cast<int>(pool->head_dim));
    const int items = p->batch * static_cast<int>(pool->num_kv_heads);
    want = resident / items;  // at most one wave
    if (want < 1) want = 1;
    // Splits shorter than 256 tokens cost more in the merge than they gain, except when
    // 256-token splits would give at most 2 warps per SM (short contexts at small batch):
    // then 128-token splits. H200: 1 x 4K and 1 x 8K 11-32% faster in every format; at
    // 1 x 16K and 2 x 8K (4 warps per SM) the 256-token splits stay ahead (docs/kernels.md).
    const int max_by_len = (len16 + 255) / 256;
    if (want > max_by_len) {
      const bool sparse = static_cast<int64_t>(items) * max_by_len <= 2 * static_cast<int64_t>(SmCount());
      want = sparse ? std::min(want, (len16 + 127) / 128) : max_by_len;
    }
  }
  if (want > len16 / 16) want = len16 / 16;
  if (want < 1) want = 1;
  s.chunk = ((len16 / 16 + want - 1) / want) * 16;
  s.splits = (len16 + s.chunk - 1) / s.chunk;
  // An automatic count that is a multiple of the warps per CTA lets each CTA merge its
  // warps' splits (decode_kernel.cuh): take the largest such count below that the
  // chunking reaches exactly (at most kDecodeWarps - 1 fewer splits).
  constexpr int kW = detail::kDecodeWarps;
  if (p->num_splits == 0 && s.splits > kW && s.splits % kW != 0) {
    const int n = len16 / 16;  // subtiles
    for (int k = s.splits / kW * kW; k >= kW; k -= kW) {
      const int chunk = (n + k - 1) / k;
      if ((n + chunk - 1) / chunk == k) {
        s.chunk = chunk * 16;
        s.splits = k;
        break;
      }
    }
  }
  return s;
}

}  // namespace
}  // namespace kvtier::kernels

using namespace kvtier;
using namespace kvtier::kernels;

extern "C" {

const char* kvt_last_error(void) { return g_error.c_str(); }

uint32_t kvt_decode_shapes(kvt_decode_shape* out, uint32_t capacity) { return DecodeShapes(out, capacity); }

int kvt_decode_supports(uint32_t format, uint32_t head_dim, uint32_t group, uint32_t block_tokens) {
  if (std::string why = DecodeUnsupportedReason(format, head_dim, group, block_tokens); !why.empty()) {
    return Fail(KVT_UNSUPPORTED, "decode: " + why);
  }
  return Ok();
}

int kvt_check_pool(const kvt_pool* pool) {
  if (int r = CheckPool(pool); r != KVT_OK) return r;
  return Ok();
}

int kvt_quantize_append(const kvt_pool* pool, const kvt_quantize_params* p, void* stream) {
  if (int r = CheckPool(pool); r != KVT_OK) return r;
  if (p == nullptr) return Fail(KVT_INVALID, "quantize_append: params are null");
  if (p->dtype > KVT_DTYPE_FP16) return Fail(KVT_INVALID, "quantize_append: unknown dtype");
  if (p->num_tokens < 0) return Fail(KVT_INVALID, "quantize_append: num_tokens < 0");
  if (p->layer >= pool->num_layers) return Fail(KVT_INVALID, "quantize_append: layer out of range");
  if (p->scale_rule > 1) return Fail(KVT_INVALID, "quantize_append: unknown scale rule");
  if (!nvfp4::IsValidGlobalScale(p->k_scale) || !nvfp4::IsValidGlobalScale(p->v_scale)) {
    return Fail(KVT_INVALID, "quantize_append: k_scale / v_scale must be finite, positive and normal");
  }
  if (p->num_tokens > 0 && (p->k == nullptr || p->v == nullptr || p->slot_ids == nullptr || p->positions == nullptr)) {
    return Fail(KVT_INVALID, "quantize_append: k, v, slot_ids and positions are required");
  }
  if (reinterpret_cast<uintptr_t>(p->k) % 16 != 0 || reinterpret_cast<uintptr_t>(p->v) % 16 != 0) {
    return Fail(KVT_INVALID, "quantize_append: k and v must be 16-byte aligned");
  }
  if (int r = CheckMappingHost(*pool, p->num_tokens, p->slot_ids_host, p->positions_host); r != KVT_OK) return r;
  const Geometry g = GeometryOf(*pool);
  const KvFormat f = static_cast<KvFormat>(pool->format);
  const PageLayout pl = MakePageLayout(f, g);
  detail::QuantizeLaunch a{};
  a.format = static_cast<int>(pool->format);
  a.k = static_cast<const uint16_t*>(p->k);
  a.v = static_cast<const uint16_t*>(p->v);
  a.fp16 = p->dtype == KVT_DTYPE_FP16;
  a.num_tokens = p->num_tokens;
  a.slot_ids = p->slot_ids;
  a.positions = p->positions;
  a.pool = static_cast<uint8_t*>(pool->base);
  a.map = MapOf(*pool, p->layer);
  a.num_slots = UsableSlots(*pool);
  a.k_data = static_cast<uint32_t>(pl.k_data);
  a.k_scale = static_cast<uint32_t>(pl.k_scale);
  a.v_data = static_cast<uint32_t>(pl.v_data);
  a.v_scale = static_cast<uint32_t>(pl.v_scale);
  a.num_kv_heads = static_cast<int>(g.num_kv_heads);
  a.head_dim = static_cast<int>(g.head_dim);
  a.block_tokens = static_cast<int>(g.block_tokens);
  a.k_scale_f = p->k_scale;
  a.v_scale_f = p->v_scale;
  a.rule = static_cast<int>(p->scale_rule);
  a.error_flag = p->error_flag;
  if (cudaError_t e = detail::LaunchQuantize(a, static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
    return CudaFail(e, "quantize_append launch");
  }
  return Ok();
}

uint64_t kvt_decode_workspace_bytes(const kvt_pool* pool, const kvt_decode_params* p) {
  if (CheckDecode(pool, p) != KVT_OK) return 0;
  const SplitPlan s = PlanSplits(pool, p);
  if (s.splits <= 1) return 0;
  const uint64_t rows = static_cast<uint64_t>(p->batch) * p->num_q_heads * s.splits;
  return rows * (pool->head_dim + 1) * sizeof(float);
}

int32_t kvt_decode_num_splits(const kvt_pool* pool, const kvt_decode_params* p) {
  if (CheckDecode(pool, p) != KVT_OK) return 0;
  return PlanSplits(pool, p).splits;
}

}  // extern "C"

namespace {
// kvt_decode, or with read_only its page-read probe (same checks, same split plan).
int DecodeImpl(const kvt_pool* pool, const kvt_decode_params* p, void* stream, bool read_only) {
  if (int r = CheckDecode(pool, p); r != KVT_OK) return r;
  if (read_only && pool->format != KVT_FORMAT_NVFP4) {
    return Fail(KVT_UNSUPPORTED, "decode read probe: NVFP4 pools only");
  }
  const int T = static_cast<int>(pool->block_tokens);
  if (p->block_table_host != nullptr) {
    const uint64_t usable = UsableSlots(*pool);
    const detail::PoolMap map = MapOf(*pool, 0);
    if (p->seq_lens_host == nullptr) return Fail(KVT_INVALID, "decode: block_table_host given without seq_lens_host");
    for (int b = 0; b < p->batch; ++b) {
      const int len = p->seq_lens_host[b];
      if (len < 0 || len > p->max_seq_len) {
        return Fail(KVT_INVALID, "decode: seq_lens[" + std::to_string(b) + "] = " + std::to_string(len) +
                                     " outside [0, max_seq_len]");
      }
      for (int blk = 0; blk < (len + T - 1) / T; ++blk) {
        const int32_t s = p->block_table_host[static_cast<size_t>(b) * p->max_blocks + blk];
        if (!SlotIdValid(usable, map, s)) {
          return Fail(KVT_INVALID, "decode: block_table[" + std::to_string(b) + "][" + std::to_string(blk) +
                                       "] = " + std::to_string(s) + " out of range [0, " +
                                       std::to_string(usable) + ") or in a slab's tail");
        }
      }
    }
  }
  const SplitPlan s = PlanSplits(pool, p);
  const uint64_t need = s.splits > 1 ? static_cast<uint64_t>(p->batch) * p->num_q_heads * s.splits *
                                           (pool->head_dim + 1) * sizeof(float)
                                     : 0;
  if (need > 0 && (p->workspace == nullptr || p->workspace_bytes < need)) {
    return Fail(KVT_INVALID, "decode: workspace of " + std::to_string(need) + " bytes required");
  }
  const Geometry g = GeometryOf(*pool);
  const KvFormat f = static_cast<KvFormat>(pool->format);
  const PageLayout pl = MakePageLayout(f, g);
  detail::DecodeLaunch a{};
  a.q = static_cast<const uint16_t*>(p->q);
  a.out = static_cast<uint16_t*>(p->out);
  a.lse = p->lse;
  a.pool = static_cast<const uint8_t*>(pool->base);
  a.map = MapOf(*pool, p->layer);
  a.num_slots = UsableSlots(*pool);
  a.num_slots32 = static_cast<uint32_t>(std::min<uint64_t>(UsableSlots(*pool), uint64_t{1} << 31));
  a.k_data = static_cast<uint32_t>(pl.k_data);
  a.k_scale = static_cast<uint32_t>(pl.k_scale);
  a.v_data = static_cast<uint32_t>(pl.v_data);
  a.v_scale = static_cast<uint32_t>(pl.v_scale);
  a.block_table = p->block_table;
  a.seq_lens = p->seq_lens;
  a.batch = p->batch;
  a.num_q_heads = p->num_q_heads;
  a.num_kv_heads = static_cast<int>(g.num_kv_heads);
  a.group = p->num_q_heads / a.num_kv_heads;
  a.max_blocks = p->max_blocks;
  a.max_seq_len = p->max_seq_len;
  a.block_tokens = T;
  a.log2_block_tokens = T == 16 ? 4 : (T == 32 ? 5 : 6);
  a.num_splits = s.splits;
  a.chunk = s.chunk;
  a.k_scale_f = p->k_scale;
  a.v_scale_f = p->v_scale;
  a.softmax_scale = p->softmax_scale;
  if (s.splits > 1) {
    a.ws_o = static_cast<float*>(p->workspace);
    a.ws_lse = a.ws_o + static_cast<uint64_t>(p->batch) * p->num_q_heads * s.splits * g.head_dim;
  }
  a.error_flag = p->error_flag;
  if (s.splits > 1) {
    // The merge grid's launch: at the decode's start when the decode leaves at least half
    // of the resident warps free (its CTAs then wait beside the decode's), else in the
    // decode's epilogue, where it does not take issue slots from a full GPU (H200: 1 x 8K
    // 10.9 -> 10.5 us early, 4 x 16K 30.7 -> 31.5 us early).
    const int64_t warps = static_cast<int64_t>(p->batch) * g.num_kv_heads * s.splits;
    a.early_trigger =
        2 * warps <= ResidentWarps(static_cast<int>(pool->format), static_cast<int>(pool->head_dim));
  }
  const int head_dim = static_cast<int>(g.head_dim);
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  if (cudaError_t e = read_only ? detail::LaunchDecodeReadProbe(head_dim, a, st)
                                : detail::LaunchDecode(static_cast<int>(pool->format), head_dim, a, st);
      e != cudaSuccess) {
    return CudaFail(e, read_only ? "decode read probe launch" : "decode launch");
  }
  return Ok();
}
}  // namespace

extern "C" {

int kvt_decode(const kvt_pool* pool, const kvt_decode_params* p, void* stream) {
  return DecodeImpl(pool, p, stream, false);
}

int kvt_decode_read_probe(const kvt_pool* pool, const kvt_decode_params* p, void* stream) {
  return DecodeImpl(pool, p, stream, true);
}

int kvt_dequantize_pages(const kvt_pool* pool, const kvt_dequant_params* p, void* stream) {
  if (int r = CheckPool(pool); r != KVT_OK) return r;
  if (p == nullptr) return Fail(KVT_INVALID, "dequantize_pages: params are null");
  if (p->num_tokens < 0) return Fail(KVT_INVALID, "dequantize_pages: num_tokens < 0");
  if (p->layer >= pool->num_layers) return Fail(KVT_INVALID, "dequantize_pages: layer out of range");
  if (p->side > 1) return Fail(KVT_INVALID, "dequantize_pages: side must be 0 (K) or 1 (V)");
  if (pool->format != KVT_FORMAT_BF16 && !nvfp4::IsValidGlobalScale(p->scale)) {
    return Fail(KVT_INVALID, "dequantize_pages: scale must be finite, positive and normal");
  }
  if (p->num_tokens > 0 && (p->out == nullptr || p->slot_ids == nullptr || p->positions == nullptr)) {
    return Fail(KVT_INVALID, "dequantize_pages: out, slot_ids and positions are required");
  }
  if (reinterpret_cast<uintptr_t>(p->out) % 16 != 0) return Fail(KVT_INVALID, "dequantize_pages: out must be 16-byte aligned");
  if (int r = CheckMappingHost(*pool, p->num_tokens, p->slot_ids_host, p->positions_host); r != KVT_OK) return r;
  const Geometry g = GeometryOf(*pool);
  const KvFormat f = static_cast<KvFormat>(pool->format);
  const PageLayout pl = MakePageLayout(f, g);
  detail::DequantLaunch a{};
  a.out = static_cast<uint16_t*>(p->out);
  a.num_tokens = p->num_tokens;
  a.slot_ids = p->slot_ids;
  a.positions = p->positions;
  a.pool = static_cast<const uint8_t*>(pool->base);
  a.map = MapOf(*pool, p->layer);
  a.num_slots = UsableSlots(*pool);
  a.data = static_cast<uint32_t>(p->side == 0 ? pl.k_data : pl.v_data);
  a.scale = static_cast<uint32_t>(p->side == 0 ? pl.k_scale : pl.v_scale);
  a.format = static_cast<int>(pool->format);
  a.num_kv_heads = static_cast<int>(g.num_kv_heads);
  a.head_dim = static_cast<int>(g.head_dim);
  a.block_tokens = static_cast<int>(g.block_tokens);
  a.scale_f = p->scale;
  a.error_flag = p->error_flag;
  if (cudaError_t e = detail::LaunchDequant(a, static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
    return CudaFail(e, "dequantize_pages launch");
  }
  return Ok();
}

int kvt_engine_pages(const kvt_engine_pages_params* p, void* stream) {
  if (p == nullptr) return Fail(KVT_INVALID, "engine_pages: params are null");
  if (p->format > KVT_FORMAT_BF16) return Fail(KVT_INVALID, "engine_pages: unknown format " + std::to_string(p->format));
  const KvFormat f = static_cast<KvFormat>(p->format);
  Geometry g;
  g.num_layers = p->num_layers;
  g.num_kv_heads = p->num_kv_heads;
  g.head_dim = p->head_dim;
  g.block_tokens = p->block_tokens;
  if (Status s = g.Validate(f); !s.ok()) return Fail(KVT_INVALID, "engine_pages: geometry: " + s.message());
  if (p->n < 0) return Fail(KVT_INVALID, "engine_pages: n < 0");
  if (p->direction > 1) return Fail(KVT_INVALID, "engine_pages: direction must be 0 (gather) or 1 (scatter)");
  const uint32_t want_elem = p->format == KVT_FORMAT_FP8 ? 1 : 2;
  if (p->elem_bytes != want_elem) {
    return Fail(KVT_INVALID, "engine_pages: elem_bytes " + std::to_string(p->elem_bytes) + " for " + KvFormatName(f) +
                                 " rows (want " + std::to_string(want_elem) + ")");
  }
  if (p->format == KVT_FORMAT_NVFP4 && p->direction != 1) {
    return Fail(KVT_UNSUPPORTED, "engine_pages: NVFP4 rows are only decoded (scatter); quantize with quantize_append");
  }
  if (p->row_stride < BlockBytes(f, g)) return Fail(KVT_INVALID, "engine_pages: row_stride below the block's bytes");
  if (p->num_blocks < 0) return Fail(KVT_INVALID, "engine_pages: num_blocks < 0");
  if (p->n == 0) return Ok();
  if (p->engine == nullptr || p->block_ids == nullptr || p->rows == nullptr) {
    return Fail(KVT_INVALID, "engine_pages: engine, block_ids and rows are required");
  }
  if (p->format == KVT_FORMAT_NVFP4 && p->scales == nullptr) return Fail(KVT_INVALID, "engine_pages: NVFP4 needs scales");
  if (p->format == KVT_FORMAT_NVFP4 && p->row_errors == nullptr) {
    return Fail(KVT_INVALID, "engine_pages: NVFP4 needs row_errors (the per-row scale check's result)");
  }
  detail::EnginePagesLaunch a{};
  a.engine = p->engine;
  a.block_stride = p->block_stride;
  a.head_stride = p->head_stride;
  a.token_stride = p->token_stride;
  a.block_ids = p->block_ids;
  a.n = p->n;
  a.num_blocks = p->num_blocks;
  a.rows = static_cast<uint8_t*>(p->rows);
  a.row_stride = p->row_stride;
  a.page_bytes = PageBytes(f, g);
  a.side_bytes = a.page_bytes / 2;
  a.num_layers = static_cast<int>(g.num_layers);
  a.num_kv_heads = static_cast<int>(g.num_kv_heads);
  a.head_dim = static_cast<int>(g.head_dim);
  a.block_tokens = static_cast<int>(g.block_tokens);
  a.elem_bytes = static_cast<int>(p->elem_bytes);
  a.format = static_cast<int>(p->format);
  a.direction = static_cast<int>(p->direction);
  a.scales = p->scales;
  a.error_flag = p->error_flag;
  a.row_errors = p->row_errors;
  if (cudaError_t e = detail::LaunchEnginePages(a, static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
    return CudaFail(e, "engine_pages launch");
  }
  return Ok();
}

int kvt_read_bandwidth_probe(const void* src, uint64_t bytes, uint32_t* sink, void* stream) {
  if (src == nullptr || sink == nullptr) return Fail(KVT_INVALID, "read probe: null pointer");
  if (reinterpret_cast<uintptr_t>(src) % 16 != 0 || bytes % 16 != 0) return Fail(KVT_INVALID, "read probe: 16-byte alignment");
  if (cudaError_t e = detail::LaunchReadProbe(src, bytes, sink, static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
    return CudaFail(e, "read probe launch");
  }
  return Ok();
}

}  // extern "C"
