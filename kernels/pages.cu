// quantize_append, dequantize_pages and the pure-read probe.
//
// quantize_append: one thread per group of 16 values (one E4M3 block scale) of K or V.
// It reads 32 contiguous bytes, runs the group rule of formats/nvfp4_math.h (the same
// source the CPU codec compiles, with __fmul_rn/__fdiv_rn on the device) with the
// per-value division replaced by an exact threshold test (QuantizeWithScaleNoDiv), and
// writes 8 data bytes and 1 scale byte. Consecutive threads take consecutive groups of one token's
// row, so loads and stores coalesce. That is the general kernel (QuantizeKernel); the
// usual shapes take QuantizePairKernel (one thread per group of K and of V, the ladder on
// pairs of 16-bit values), with max6 (QuantizeMax6Group) or 4over6 (Quantize4over6Pair,
// kernels/e2m1_ladder.h).
//
// The same launcher writes FP8 and BF16 pages (StoreKernel): one thread per 16 values, the
// same bounds and finiteness checks, 16 (FP8) or 32 (BF16) bytes stored per thread.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "formats/nvfp4_math.h"
#include "kernels/e2m1_ladder.h"
#include "kernels/internal.h"

namespace kvtier::kernels::detail {
namespace {

__device__ __forceinline__ uint32_t prmt_b32(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

__device__ __forceinline__ float to_float(uint16_t x, bool fp16) {
  if (fp16) return __half2float(__ushort_as_half(x));
  return __uint_as_float(static_cast<uint32_t>(x) << 16);
}

// ---- Division-free group rule (kernels/e2m1_ladder.h explains why it is exact) -------
// Same codes and (when kErr) the same error sum as nvfp4::QuantizeWithScale.
template <bool kErr>
__device__ __forceinline__ float QuantizeWithScaleNoDiv(const float* x, uint8_t sf, float kv_scale,
                                                        uint8_t* codes) {
  using namespace nvfp4;
  const float s = kvt_mul(E4M3ToFloat(sf), kv_scale);
  if (!LadderApplies(s)) return QuantizeWithScale(x, sf, kv_scale, codes);
  const E2M1Ladder l = MakeLadder(s);
  float err = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroupSize; ++i) {
    const uint8_t q = LadderCode(l, x[i]);
    codes[i] = q;
    if constexpr (kErr) {
      const float d = kvt_sub(kvt_mul(E2M1ToFloat(q), s), x[i]);
      err = kvt_add(err, kvt_mul(d, d));
    }
  }
  return err;
}

// nvfp4::QuantizeGroup with QuantizeWithScaleNoDiv in place of QuantizeWithScale.
template <int RULE>
__device__ __forceinline__ uint8_t QuantizeGroupNoDiv(const float* x, float kv_scale, uint8_t* packed) {
  using namespace nvfp4;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kGroupSize; ++i) amax = kvt_max(amax, kvt_abs(x[i]));
  uint8_t sf = FloatToE4M3(kvt_div(kvt_div(amax, 6.0f), kv_scale));
  uint8_t codes[kGroupSize];
  const float err6 = QuantizeWithScaleNoDiv<RULE == 1>(x, sf, kv_scale, codes);
  if constexpr (RULE == 1) {
    const uint8_t sf4 = FloatToE4M3(kvt_div(kvt_div(amax, 4.0f), kv_scale));
    uint8_t codes4[kGroupSize];
    const float err4 = QuantizeWithScaleNoDiv<true>(x, sf4, kv_scale, codes4);
    if (err4 < err6) {
      sf = sf4;
#pragma unroll
      for (int i = 0; i < kGroupSize; ++i) codes[i] = codes4[i];
    }
  }
#pragma unroll
  for (int j = 0; j < kGroupSize / 2; ++j) {
    packed[j] = static_cast<uint8_t>((codes[2 * j] & 0xFu) | ((codes[2 * j + 1] & 0xFu) << 4));
  }
  return sf;
}

// RULE is a template constant so that, for max6, the squared-error sums that only 4over6
// reads are dead code and vanish.
template <int RULE>
__global__ void __launch_bounds__(256) QuantizeKernel(const QuantizeLaunch a) {
  const int groups_per_row = a.head_dim / 16;
  const int64_t per_side = static_cast<int64_t>(a.num_tokens) * a.num_kv_heads * groups_per_row;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int side = blockIdx.y;
  if (idx >= per_side) return;
  const int g = static_cast<int>(idx % groups_per_row);
  const int64_t th = idx / groups_per_row;
  const int h = static_cast<int>(th % a.num_kv_heads);
  const int tok = static_cast<int>(th / a.num_kv_heads);
  const int32_t slot = a.slot_ids[tok];
  const int32_t pos = a.positions[tok];
  bool in_slab = true;
  const uint64_t page_off =
      slot < 0 ? 0 : a.map.Page(static_cast<uint32_t>(slot), in_slab);
  if (slot < 0 || static_cast<uint64_t>(slot) >= a.num_slots || !in_slab || pos < 0 || pos >= a.block_tokens) {
    if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrSlotRange);
    return;
  }
  const uint16_t* src = (side == 0 ? a.k : a.v) + idx * 16;
  const uint4 r0 = __ldg(reinterpret_cast<const uint4*>(src));
  const uint4 r1 = __ldg(reinterpret_cast<const uint4*>(src) + 1);
  const uint32_t w[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
  float x[16];
  bool finite = true;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = to_float(static_cast<uint16_t>(w[i] & 0xffffu), a.fp16);
    x[2 * i + 1] = to_float(static_cast<uint16_t>(w[i] >> 16), a.fp16);
    finite &= isfinite(x[2 * i]) && isfinite(x[2 * i + 1]);
  }
  if (!finite) {
    if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrNonFinite);
    return;
  }
  const float gs = side == 0 ? a.k_scale_f : a.v_scale_f;
  uint8_t packed[8];
  const uint8_t sf = QuantizeGroupNoDiv<RULE>(x, gs, packed);
  uint8_t* page = a.pool + page_off;
  const size_t row = static_cast<size_t>(h) * a.block_tokens + pos;
  uint8_t* data = page + (side == 0 ? a.k_data : a.v_data) + row * (a.head_dim / 2) + g * 8;
  uint8_t* sc = page + (side == 0 ? a.k_scale : a.v_scale) + row * groups_per_row + g;
  uint2 pk;
  pk.x = packed[0] | (packed[1] << 8) | (packed[2] << 16) | (static_cast<uint32_t>(packed[3]) << 24);
  pk.y = packed[4] | (packed[5] << 8) | (packed[6] << 16) | (static_cast<uint32_t>(packed[7]) << 24);
  *reinterpret_cast<uint2*>(data) = pk;
  *sc = sf;
}

// ---- max6, fast path: 32-bit indices, amax and the finite check on packed 16-bit
// magnitudes, and the ladder on pairs of values at once ----------------------------------
//
// The pair logic (bounds as 16-bit values, binary search over the flags) is
// LadderPairCodes in kernels/e2m1_ladder.h, tested on the CPU against the codec.

// The codec's FloatToE4M3 and E4M3ToFloat by the hardware conversions (about 40
// instructions per group fewer). FloatToE4M3 rounds to nearest even, subnormals
// included, and saturates at 448 (inf too); cvt.rn.satfinite does the same. The only
// difference is NaN (codec: sign | 0x7F; hardware: 0x7F), and the argument here, amax / 6
// / gs with amax finite and gs > 0, is never NaN. E4M3 -> f16 is exact.
__device__ __forceinline__ uint8_t E4M3Hw(float x) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(0.0f), "f"(x));
  return static_cast<uint8_t>(r & 0xffu);
}
__device__ __forceinline__ float E4M3ToFloatHw(uint8_t b) {
  uint32_t r;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(static_cast<uint16_t>(b)));
  return __half2float(__ushort_as_half(static_cast<uint16_t>(r & 0xffffu)));
}

// Per lane, the magnitude bits of the group's largest |x| (a NaN anywhere gives a NaN,
// whose bits are >= those of inf): 7 half2 max of absolute values (.NaN propagates NaN,
// subnormals are kept) and one mask, where a LOP3 + an integer max per word took 16.
// For finite values the float max of |x| is the integer max of the magnitude bits.
template <bool kFp16>
__device__ __forceinline__ uint32_t AbsMax2(uint32_t a, uint32_t b) {
  uint32_t r;
  if constexpr (kFp16) {
    asm("max.NaN.xorsign.abs.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  } else {
    asm("max.NaN.xorsign.abs.bf16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  }
  return r;
}
template <bool kFp16>
__device__ __forceinline__ uint32_t GroupAbsMaxBits(const uint32_t (&w)[8]) {
  const uint32_t a = AbsMax2<kFp16>(AbsMax2<kFp16>(w[0], w[1]), AbsMax2<kFp16>(w[2], w[3]));
  const uint32_t b = AbsMax2<kFp16>(AbsMax2<kFp16>(w[4], w[5]), AbsMax2<kFp16>(w[6], w[7]));
  return AbsMax2<kFp16>(a, b) & 0x7fff7fffu;
}

// Per group of one side: the scale byte and the 8 data bytes (codes of values 0..7, 8..15).
// mx: GroupAbsMaxBits(w) (the caller's finite check already has it).
template <bool kFp16>
__device__ __forceinline__ uint8_t QuantizeMax6Group(const uint32_t (&w)[8], uint32_t mx, float gs,
                                                     uint32_t& pk0, uint32_t& pk1) {
  constexpr bool fp16 = kFp16;
  using namespace nvfp4;
  const uint32_t amax16 = max(mx & 0xffffu, mx >> 16);  // finite: checked by the caller
  const float amax = to_float(static_cast<uint16_t>(amax16), fp16);
  const uint8_t sf = E4M3Hw(kvt_div(kvt_div(amax, 6.0f), gs));
  const float s = kvt_mul(E4M3ToFloatHw(sf), gs);
  if (LadderApplies(s)) {
    const E2M1Ladder l = MakeLadder(s);
    uint32_t hb[7];
#pragma unroll
    for (int k = 0; k < 7; ++k) {
      if constexpr (fp16) {
        const uint32_t b16 = __half_as_ushort(__float2half_ru(__uint_as_float(l.b[k])));
        hb[k] = b16 | (b16 << 16);
      } else {  // the float bits rounded up to 16 bits, in both lanes (one PRMT)
        hb[k] = prmt_b32(l.b[k] + 0xffffu, 0u, 0x3232);
      }
    }
    // word 0 holds values 0..7 (w[0..3]), word 1 values 8..15 (w[4..7]); value 2i is the
    // low half of w[i].
    pk0 = LadderPairCodes<0>(prmt_b32(w[0], w[2], 0x5410), hb) | LadderPairCodes<1>(prmt_b32(w[0], w[2], 0x7632), hb) |
          LadderPairCodes<2>(prmt_b32(w[1], w[3], 0x5410), hb) | LadderPairCodes<3>(prmt_b32(w[1], w[3], 0x7632), hb);
    pk1 = LadderPairCodes<0>(prmt_b32(w[4], w[6], 0x5410), hb) | LadderPairCodes<1>(prmt_b32(w[4], w[6], 0x7632), hb) |
          LadderPairCodes<2>(prmt_b32(w[5], w[7], 0x5410), hb) | LadderPairCodes<3>(prmt_b32(w[5], w[7], 0x7632), hb);
  } else {
    float x[16];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      x[2 * i] = to_float(static_cast<uint16_t>(w[i] & 0xffffu), fp16);
      x[2 * i + 1] = to_float(static_cast<uint16_t>(w[i] >> 16), fp16);
    }
    uint8_t codes[kGroupSize];
    QuantizeWithScale(x, sf, gs, codes);
    pk0 = pk1 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      pk0 |= static_cast<uint32_t>(codes[i] & 0xFu) << (4 * i);
      pk1 |= static_cast<uint32_t>(codes[8 + i] & 0xFu) << (4 * i);
    }
  }
  return sf;
}

// ---- 4over6, fast path: Quantize4over6Pair (kernels/e2m1_ladder.h), the codec's
// QuantizeGroup out of line for scales outside the ladder's range ---------------------

template <bool kFp16>
__device__ __forceinline__ void GroupFloatsDev(const uint32_t (&w)[8], float (&x)[16]) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = to_float(static_cast<uint16_t>(w[i] & 0xffffu), kFp16);
    x[2 * i + 1] = to_float(static_cast<uint16_t>(w[i] >> 16), kFp16);
  }
}

// Arguments and result by value (x: the group's words; result: the scale byte, then the
// two data words), so that nothing goes through local memory.
template <bool kFp16>
__device__ __noinline__ uint4 Quantize4over6Slow(uint4 r0, uint4 r1, float gs) {
  const uint32_t w[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
  float x[16];
  GroupFloatsDev<kFp16>(w, x);
  uint8_t packed[8];
  const uint8_t sf = nvfp4::QuantizeGroup(x, gs, nvfp4::ScaleRule::k4over6, packed);
  return make_uint4(sf, packed[0] | (packed[1] << 8) | (packed[2] << 16) | (static_cast<uint32_t>(packed[3]) << 24),
                    packed[4] | (packed[5] << 8) | (packed[6] << 16) | (static_cast<uint32_t>(packed[7]) << 24), 0u);
}

template <bool kFp16>
__device__ __forceinline__ uint8_t Quantize4over6Group(const uint32_t (&w)[8], uint32_t mx, float gs, float rcp,
                                                       uint32_t& pk0, uint32_t& pk1) {
  const uint32_t amax16 = max(mx & 0xffffu, mx >> 16);  // finite: checked by the caller
  uint8_t sf;
  if (Quantize4over6Pair<kFp16>(w, amax16, gs, rcp, sf, pk0, pk1)) return sf;
  const uint4 r = Quantize4over6Slow<kFp16>(make_uint4(w[0], w[1], w[2], w[3]), make_uint4(w[4], w[5], w[6], w[7]), gs);
  pk0 = r.y;
  pk1 = r.z;
  return static_cast<uint8_t>(r.x);
}

// One thread per (token, head, group): the group of K and the same group of V (one slot
// lookup, two independent chains). The inputs are loaded before the slot check, so the
// two global round trips overlap.
// kFp16: the inputs' type (a.fp16) as a template constant, so that the bf16 and fp16
// paths carry no per-value selects. RULE: 0 max6, 1 4over6. 4over6 is held to 3 blocks
// per SM (80 registers, no spill; 4 blocks would spill); max6's bounds stay without a
// minimum (0), since a minimum of 1 changes its register allocation (46 -> 59) and slows it.
template <bool kFp16, int RULE>
__global__ void __launch_bounds__(256, RULE == 1 ? 3 : 0) QuantizePairKernel(const QuantizeLaunch a, uint32_t per_side,
                                                          int log2_gpr) {
  const uint32_t idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= per_side) return;
  const uint4* srck = reinterpret_cast<const uint4*>(a.k + static_cast<size_t>(idx) * 16);
  const uint4* srcv = reinterpret_cast<const uint4*>(a.v + static_cast<size_t>(idx) * 16);
  const uint4 k0 = __ldg(srck), k1 = __ldg(srck + 1), v0 = __ldg(srcv), v1 = __ldg(srcv + 1);
  const uint32_t groups_per_row = 1u << log2_gpr;
  const uint32_t g = idx & (groups_per_row - 1);
  const uint32_t th = idx >> log2_gpr;
  const uint32_t H = static_cast<uint32_t>(a.num_kv_heads);
  const uint32_t tok = th / H;
  const uint32_t h = th - tok * H;
  const int32_t slot = a.slot_ids[tok];
  const int32_t pos = a.positions[tok];
  bool in_slab = true;
  const uint64_t page_off =
      slot < 0 ? 0 : a.map.Page(static_cast<uint32_t>(slot), in_slab);
  if (slot < 0 || static_cast<uint64_t>(slot) >= a.num_slots || !in_slab || pos < 0 || pos >= a.block_tokens) {
    if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrSlotRange);
    return;
  }
  uint8_t* page = a.pool + page_off;
  const uint32_t row = h * static_cast<uint32_t>(a.block_tokens) + static_cast<uint32_t>(pos);
  const uint32_t lim = kFp16 ? 0x7c00u : 0x7f80u;  // |x| bits at or above: inf or NaN
#pragma unroll
  for (int side = 0; side < 2; ++side) {
    const uint4 r0 = side == 0 ? k0 : v0, r1 = side == 0 ? k1 : v1;
    const uint32_t w[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
    const uint32_t mx = GroupAbsMaxBits<kFp16>(w);
    if (max(mx & 0xffffu, mx >> 16) >= lim) {  // this side's group keeps its old bytes
      if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrNonFinite);
      continue;
    }
    uint32_t pk0, pk1;
    const float gs = side == 0 ? a.k_scale_f : a.v_scale_f;
    const uint8_t sf = RULE == 0 ? QuantizeMax6Group<kFp16>(w, mx, gs, pk0, pk1)
                                 : Quantize4over6Group<kFp16>(w, mx, gs, side == 0 ? a.k_rcp_f : a.v_rcp_f, pk0, pk1);
    uint8_t* data = page + (side == 0 ? a.k_data : a.v_data) + static_cast<size_t>(row) * (a.head_dim / 2) + g * 8;
    uint8_t* sc = page + (side == 0 ? a.k_scale : a.v_scale) + static_cast<size_t>(row) * groups_per_row + g;
    *reinterpret_cast<uint2*>(data) = make_uint2(pk0, pk1);
    *sc = sf;
  }
}

// FP8 or BF16 pages (format 1 or 2): one thread per 16 values of one side (blockIdx.y).
// FP8: E4M3 of x / scale, rounded to nearest even and saturating at +-448 (what
// `(x / scale).clamp(-448, 448).to(torch.float8_e4m3fn)` gives). BF16: the values as they
// are (bf16 input) or rounded to nearest even (fp16 input). A token whose slot or
// position is out of range, or a group with a non-finite value, is skipped and flagged,
// as in the NVFP4 kernels.
__global__ void __launch_bounds__(256) StoreKernel(const QuantizeLaunch a, int format) {
  const int groups_per_row = a.head_dim / 16;
  const int64_t per_side = static_cast<int64_t>(a.num_tokens) * a.num_kv_heads * groups_per_row;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int side = blockIdx.y;
  if (idx >= per_side) return;
  const int g = static_cast<int>(idx % groups_per_row);
  const int64_t th = idx / groups_per_row;
  const int h = static_cast<int>(th % a.num_kv_heads);
  const int tok = static_cast<int>(th / a.num_kv_heads);
  const int32_t slot = a.slot_ids[tok];
  const int32_t pos = a.positions[tok];
  bool in_slab = true;
  const uint64_t page_off =
      slot < 0 ? 0 : a.map.Page(static_cast<uint32_t>(slot), in_slab);
  if (slot < 0 || static_cast<uint64_t>(slot) >= a.num_slots || !in_slab || pos < 0 || pos >= a.block_tokens) {
    if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrSlotRange);
    return;
  }
  const uint16_t* src = (side == 0 ? a.k : a.v) + idx * 16;
  const uint4 r0 = __ldg(reinterpret_cast<const uint4*>(src));
  const uint4 r1 = __ldg(reinterpret_cast<const uint4*>(src) + 1);
  uint32_t w[8] = {r0.x, r0.y, r0.z, r0.w, r1.x, r1.y, r1.z, r1.w};
  float x[16];
  bool finite = true;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[2 * i] = to_float(static_cast<uint16_t>(w[i] & 0xffffu), a.fp16);
    x[2 * i + 1] = to_float(static_cast<uint16_t>(w[i] >> 16), a.fp16);
    finite &= isfinite(x[2 * i]) && isfinite(x[2 * i + 1]);
  }
  if (!finite) {
    if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrNonFinite);
    return;
  }
  uint8_t* page = a.pool + page_off;
  const size_t row = static_cast<size_t>(h) * a.block_tokens + pos;
  const uint32_t region = side == 0 ? a.k_data : a.v_data;
  if (format == 1) {
    const float gs = side == 0 ? a.k_scale_f : a.v_scale_f;
    uint32_t o[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint32_t q = __nv_cvt_float_to_fp8(__fdiv_rn(x[i], gs), __NV_SATFINITE, __NV_E4M3);
      o[i / 4] |= q << (8 * (i % 4));
    }
    *reinterpret_cast<uint4*>(page + region + row * a.head_dim + g * 16) = make_uint4(o[0], o[1], o[2], o[3]);
    return;
  }
  if (a.fp16) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      __nv_bfloat162 b = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
      w[i] = *reinterpret_cast<uint32_t*>(&b);
    }
  }
  uint4* dst = reinterpret_cast<uint4*>(page + region + row * a.head_dim * 2 + g * 32);
  dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
  dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
}

// One thread per 16 values of one side; writes 16 bf16 (32 bytes).
__global__ void __launch_bounds__(256) DequantKernel(const DequantLaunch a) {
  const int groups_per_row = a.head_dim / 16;
  const int64_t total = static_cast<int64_t>(a.num_tokens) * a.num_kv_heads * groups_per_row;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int g = static_cast<int>(idx % groups_per_row);
  const int64_t th = idx / groups_per_row;
  const int h = static_cast<int>(th % a.num_kv_heads);
  const int tok = static_cast<int>(th / a.num_kv_heads);
  const int32_t slot = a.slot_ids[tok];
  const int32_t pos = a.positions[tok];
  uint16_t* dst = a.out + idx * 16;
  bool in_slab = true;
  const uint64_t page_off =
      slot < 0 ? 0 : a.map.Page(static_cast<uint32_t>(slot), in_slab);
  if (slot < 0 || static_cast<uint64_t>(slot) >= a.num_slots || !in_slab || pos < 0 || pos >= a.block_tokens) {
    if (a.error_flag != nullptr) atomicOr(a.error_flag, kErrSlotRange);
    return;
  }
  const uint8_t* page = a.pool + page_off;
  const size_t row = static_cast<size_t>(h) * a.block_tokens + pos;
  float v[16];
  if (a.format == 0) {
    const uint2 d = *reinterpret_cast<const uint2*>(page + a.data + row * (a.head_dim / 2) + g * 8);
    const uint8_t sf = page[a.scale + row * groups_per_row + g];
    const uint32_t w[2] = {d.x, d.y};
    // DecodeValue's order, (e2m1 * e4m3) * scale: e2m1 * e4m3 is exact, so the value is
    // the CPU codec's (kvtier_nvfp4_decode) bit for bit, before and after BF16 rounding.
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const uint8_t code = static_cast<uint8_t>((w[i / 8] >> (4 * (i % 8))) & 0xF);
      v[i] = nvfp4::DecodeValue(code, sf, a.scale_f);
    }
  } else if (a.format == 1) {
    const uint4 d = *reinterpret_cast<const uint4*>(page + a.data + row * a.head_dim + g * 16);
    const uint32_t w[4] = {d.x, d.y, d.z, d.w};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      v[i] = __fmul_rn(nvfp4::E4M3ToFloat(static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)))), a.scale_f);
    }
  } else {
    const uint4* p = reinterpret_cast<const uint4*>(page + a.data + row * a.head_dim * 2 + g * 32);
    reinterpret_cast<uint4*>(dst)[0] = p[0];
    reinterpret_cast<uint4*>(dst)[1] = p[1];
    return;
  }
  uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    __nv_bfloat162 b = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    o[i] = *reinterpret_cast<uint32_t*>(&b);
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(o[0], o[1], o[2], o[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// Grid-stride 16-byte streaming loads, four in flight per thread, folded with XOR.
__global__ void __launch_bounds__(512) ReadProbeKernel(const uint4* src, uint64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = __ldcs(src + i + k * stride);
#pragma unroll
    for (int k = 0; k < 4; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads alive; almost never stores
}

}  // namespace

cudaError_t LaunchQuantize(const QuantizeLaunch& launch, cudaStream_t stream) {
  QuantizeLaunch a = launch;
  a.k_rcp_f = LadderScaleHasRcp(a.k_scale_f) ? 1.0f / a.k_scale_f : 0.0f;
  a.v_rcp_f = LadderScaleHasRcp(a.v_scale_f) ? 1.0f / a.v_scale_f : 0.0f;
  const int64_t per_side = static_cast<int64_t>(a.num_tokens) * a.num_kv_heads * (a.head_dim / 16);
  if (per_side == 0) return cudaSuccess;
  dim3 grid(static_cast<unsigned>((per_side + 255) / 256), 2);
  const int gpr = a.head_dim / 16;
  if (a.format != 0) {
    StoreKernel<<<grid, 256, 0, stream>>>(a, a.format);
  } else if (per_side <= 0xffffffffLL && (gpr & (gpr - 1)) == 0) {
    int log2_gpr = 0;
    while ((1 << log2_gpr) < gpr) ++log2_gpr;
    const unsigned blocks = static_cast<unsigned>((per_side + 255) / 256);
    const uint32_t n = static_cast<uint32_t>(per_side);
    if (a.rule == 0) {
      if (a.fp16) {
        QuantizePairKernel<true, 0><<<blocks, 256, 0, stream>>>(a, n, log2_gpr);
      } else {
        QuantizePairKernel<false, 0><<<blocks, 256, 0, stream>>>(a, n, log2_gpr);
      }
    } else if (a.fp16) {
      QuantizePairKernel<true, 1><<<blocks, 256, 0, stream>>>(a, n, log2_gpr);
    } else {
      QuantizePairKernel<false, 1><<<blocks, 256, 0, stream>>>(a, n, log2_gpr);
    }
  } else if (a.rule == 0) {
    QuantizeKernel<0><<<grid, 256, 0, stream>>>(a);
  } else {
    QuantizeKernel<1><<<grid, 256, 0, stream>>>(a);
  }
  return cudaGetLastError();
}

cudaError_t LaunchDequant(const DequantLaunch& a, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(a.num_tokens) * a.num_kv_heads * (a.head_dim / 16);
  if (total == 0) return cudaSuccess;
  DequantKernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(a);
  return cudaGetLastError();
}

// NVFP4 scatter, before the decode: one CUDA block per row i checks the row's block id,
// every E4M3 block scale byte of every layer and side, and the global scales, and writes
// row_errors[i] (0, or kErrSlotRange | kErrBadScale). A scale byte is bad when it is an
// E4M3 NaN (0x7F, 0xFF) or has its sign bit set (no encoder writes a negative or -0
// scale), i.e. when it is >= 0x7F unsigned. A global scale is bad when it is not a finite
// positive normal float. EnginePagesKernel then skips every row with a non-zero entry, so
// a row with a bad scale leaves the engine's pages as they were.
__global__ void __launch_bounds__(256) EnginePagesCheckKernel(const EnginePagesLaunch a) {
  const int64_t i = blockIdx.x;
  const int L = a.num_layers;
  const uint64_t region = static_cast<uint64_t>(a.num_kv_heads) * a.block_tokens * (a.head_dim / 16);
  const uint64_t data_bytes = region * 8;  // H*T*D/2
  const uint8_t* row = a.rows + i * a.row_stride;
  bool bad = false;
  for (int r = threadIdx.x; r < 2 * L; r += blockDim.x) {
    const float g = a.scales[r];
    bad |= !(isfinite(g) && g >= 1.17549435e-38f);
  }
  // The 2L scale regions of region bytes each, at l * page_bytes + s * side_bytes + data_bytes.
  const bool vec = (region & 15) == 0 && ((reinterpret_cast<uintptr_t>(row) | a.side_bytes | data_bytes) & 15) == 0;
  if (vec) {
    const uint64_t units = region / 16;
    for (uint64_t e = threadIdx.x; e < 2 * L * units; e += blockDim.x) {
      const uint64_t r = e / units, u = e % units;
      const uint4 w = *reinterpret_cast<const uint4*>(row + r * a.side_bytes + data_bytes + u * 16);
      bad |= (__vcmpgeu4(w.x, 0x7F7F7F7Fu) | __vcmpgeu4(w.y, 0x7F7F7F7Fu) | __vcmpgeu4(w.z, 0x7F7F7F7Fu) |
              __vcmpgeu4(w.w, 0x7F7F7F7Fu)) != 0;
    }
  } else {
    for (uint64_t e = threadIdx.x; e < 2 * L * region; e += blockDim.x) {
      const uint64_t r = e / region, u = e % region;
      bad |= row[r * a.side_bytes + data_bytes + u] >= 0x7F;
    }
  }
  int32_t code = __syncthreads_or(bad) ? kErrBadScale : 0;
  if (threadIdx.x == 0) {
    const int64_t b = a.block_ids[i];
    if (b < 0 || b >= a.num_blocks) code |= kErrSlotRange;
    a.row_errors[i] = code;
    if (code != 0 && a.error_flag != nullptr) atomicOr(a.error_flag, code);
  }
}

// One CUDA block per (row i, layer l, side s, head h): the T head_dim rows of that head.
// Rows whose engine and kvtier addresses are both 16-byte aligned move as uint4; others
// byte by byte (an odd pitch or padding), which is rare and correct.
__global__ void __launch_bounds__(256) EnginePagesKernel(const EnginePagesLaunch a) {
  const int H = a.num_kv_heads, T = a.block_tokens, D = a.head_dim;
  int64_t q = blockIdx.x;
  const int h = static_cast<int>(q % H);
  q /= H;
  const int s = static_cast<int>(q % 2);
  q /= 2;
  const int l = static_cast<int>(q % a.num_layers);
  const int64_t i = q / a.num_layers;
  const int64_t b = a.block_ids[i];
  if (b < 0 || b >= a.num_blocks) {
    if (a.error_flag != nullptr && threadIdx.x == 0) atomicOr(a.error_flag, kErrSlotRange);
    return;
  }
  uint8_t* eng = reinterpret_cast<uint8_t*>(a.engine[2 * l + s]) + b * a.block_stride + h * a.head_stride;
  uint8_t* side = a.rows + i * a.row_stride + l * a.page_bytes + s * a.side_bytes;
  if (a.format == 0) {
    // NVFP4 rows -> BF16 engine rows, 16 values (one block scale) per thread step. A row
    // the check refused is not touched.
    if (a.row_errors[i] != 0) return;
    const int G = D / 16;
    const float scale = a.scales[2 * l + s];
    const uint8_t* data = side + static_cast<size_t>(h) * T * (D / 2);
    const uint8_t* sfs = side + static_cast<size_t>(H) * T * (D / 2) + static_cast<size_t>(h) * T * G;
    for (int e = threadIdx.x; e < T * G; e += blockDim.x) {
      const int t = e / G, g = e % G;
      const uint8_t* d = data + static_cast<size_t>(t) * (D / 2) + g * 8;
      uint32_t w[2];
      if ((reinterpret_cast<uintptr_t>(d) & 7) == 0) {
        const uint2 v = *reinterpret_cast<const uint2*>(d);
        w[0] = v.x;
        w[1] = v.y;
      } else {
        w[0] = w[1] = 0;
        for (int k = 0; k < 8; ++k) w[k / 4] |= static_cast<uint32_t>(d[k]) << (8 * (k % 4));
      }
      const uint8_t sf = sfs[static_cast<size_t>(t) * G + g];
      uint32_t o[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint8_t c0 = static_cast<uint8_t>((w[(2 * k) / 8] >> (4 * ((2 * k) % 8))) & 0xF);
        const uint8_t c1 = static_cast<uint8_t>((w[(2 * k + 1) / 8] >> (4 * ((2 * k + 1) % 8))) & 0xF);
        __nv_bfloat162 v2 = __floats2bfloat162_rn(nvfp4::DecodeValue(c0, sf, scale), nvfp4::DecodeValue(c1, sf, scale));
        o[k] = *reinterpret_cast<uint32_t*>(&v2);
      }
      uint8_t* dst = eng + static_cast<int64_t>(t) * a.token_stride + g * 32;
      if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
        reinterpret_cast<uint4*>(dst)[0] = make_uint4(o[0], o[1], o[2], o[3]);
        reinterpret_cast<uint4*>(dst)[1] = make_uint4(o[4], o[5], o[6], o[7]);
      } else {
        for (int k = 0; k < 32; ++k) dst[k] = static_cast<uint8_t>(o[k / 4] >> (8 * (k % 4)));
      }
    }
    return;
  }
  const int row = D * a.elem_bytes;
  uint8_t* kv = side + static_cast<size_t>(h) * T * row;
  const bool gather = a.direction == 0;
  bool aligned = row % 16 == 0 && (a.token_stride & 15) == 0 && (reinterpret_cast<uintptr_t>(eng) & 15) == 0 &&
                 (reinterpret_cast<uintptr_t>(kv) & 15) == 0;
  if (aligned) {
    const int units = row / 16;
    for (int e = threadIdx.x; e < T * units; e += blockDim.x) {
      const int t = e / units, c = e % units;
      uint4* pe = reinterpret_cast<uint4*>(eng + static_cast<int64_t>(t) * a.token_stride) + c;
      uint4* pk = reinterpret_cast<uint4*>(kv + static_cast<size_t>(t) * row) + c;
      if (gather) {
        *pk = *pe;
      } else {
        *pe = *pk;
      }
    }
  } else {
    for (int e = threadIdx.x; e < T * row; e += blockDim.x) {
      const int t = e / row, c = e % row;
      uint8_t* pe = eng + static_cast<int64_t>(t) * a.token_stride + c;
      uint8_t* pk = kv + static_cast<size_t>(t) * row + c;
      if (gather) {
        *pk = *pe;
      } else {
        *pe = *pk;
      }
    }
  }
}

cudaError_t LaunchEnginePages(const EnginePagesLaunch& a, cudaStream_t stream) {
  const int64_t blocks = static_cast<int64_t>(a.n) * a.num_layers * 2 * a.num_kv_heads;
  if (blocks == 0) return cudaSuccess;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  // Threads per CUDA block: one per work item of a head (T * D/16 scale groups for NVFP4,
  // T * 16-byte units for an aligned copy), in whole warps, at most 256. Fewer idle
  // threads per block lets more blocks share an SM.
  const int64_t items = static_cast<int64_t>(a.block_tokens) *
                        (a.format == 0 ? a.head_dim / 16 : (a.head_dim * a.elem_bytes + 15) / 16);
  const unsigned threads = static_cast<unsigned>(std::min<int64_t>(256, std::max<int64_t>(32, (items + 31) / 32 * 32)));
  if (a.format == 0) {
    EnginePagesCheckKernel<<<static_cast<unsigned>(a.n), 256, 0, stream>>>(a);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  EnginePagesKernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(a);
  return cudaGetLastError();
}

cudaError_t LaunchReadProbe(const void* src, uint64_t bytes, uint32_t* sink, cudaStream_t stream) {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  ReadProbeKernel<<<sms * 4, 512, 0, stream>>>(static_cast<const uint4*>(src), bytes / 16, sink);
  return cudaGetLastError();
}

}  // namespace kvtier::kernels::detail
