// Device functions of the paged decode kernel (decode_kernel.cuh): the shared-memory
// layout of a warp's copy ring, PTX wrappers (cp.async, shared loads, PRMT, f16x2
// multiplies, mma.sync, movmatrix) and the E2M1 / E4M3 register decodes. Internal to
// kernels/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/internal.h"

namespace kvtier::kernels::detail {
namespace {

constexpr int kNvfp4 = 0, kFp8 = 1, kBf16 = 2;

// One warp's ring of subtiles (16 tokens of one KV head, K and V) in shared memory.
template <int FMT, int D>
struct Cfg {
  static constexpr int kRow = FMT == kNvfp4 ? D / 2 : (FMT == kFp8 ? D : 2 * D);  // bytes/token
  static constexpr int kSc = FMT == kNvfp4 ? D / 16 : 0;  // scale bytes per token
  static constexpr int kKData = 0;
  static constexpr int kKSc = 16 * kRow;
  static constexpr int kVData = kKSc + 16 * kSc;
  static constexpr int kVSc = kVData + 16 * kRow;
  static constexpr int kStage = kVSc + 16 * kSc;        // bytes of one subtile
  // Ring slots: NVFP4 keeps 3 subtiles in flight while it computes on a pair (5 slots).
  static constexpr int kStages = FMT == kNvfp4 ? 5 : (FMT == kFp8 ? 3 : 2);
  static constexpr int kSmemPerWarp = kStage * kStages;
  static constexpr int kKWords = kRow / 16;  // 32-bit words of one K row per thread (row/4 B)
  static constexpr int kVWords = kRow / 32;  // words of one V row per thread (row/8 B), >= 1
  static constexpr int kRegs = D / 8;        // half2 registers per row per thread
  // NVFP4 V rows are XOR-swizzled in 16-byte chunks so that the 4 tokens one load
  // instruction touches fall in different banks.
  static constexpr int kSwzMask = FMT == kNvfp4 ? ((kRow / 16) >= 4 ? 3 : (kRow / 16) - 1) : 0;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// cp.async that only runs where `pred` is set (no branch: one predicated LDGSTS).
__device__ __forceinline__ void cp_async16_if(uint32_t dst, const void* src, bool pred) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}\n" ::"r"(dst),
      "l"(src), "r"(static_cast<int>(pred))
      : "memory");
}
// 2^x, flushing results below 2^-126 to 0 (one MUFU.EX2; exp2f adds a denormal fix-up of
// 3 instructions per call). Softmax weights that small do not change an fp32 sum.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
template <int N>
__device__ __forceinline__ void cp_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

template <int N>
__device__ __forceinline__ void lds(uint32_t addr, uint32_t (&w)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                   : "=r"(w[i]), "=r"(w[i + 1]), "=r"(w[i + 2]), "=r"(w[i + 3])
                   : "r"(addr + 4 * i));
    }
  } else if constexpr (N == 2) {
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(w[0]), "=r"(w[1]) : "r"(addr));
  } else {
    static_assert(N == 1);
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(w[0]) : "r"(addr));
  }
}
__device__ __forceinline__ uint32_t lds_u8(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u8 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds_u16(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}
// Two E4M3 bytes (low 16 bits of x; byte 0 -> low half) to f16x2, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t r;
  const uint16_t h = static_cast<uint16_t>(x);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(h));
  return r;
}
// E2M1 nibbles of x -> clean bytes [s 0 0 0 e e m 0], i.e. the high byte of an fp16 that
// holds value * 2^-14 (subnormal 0.5 included): the even nibbles 0,2,4,6 into the bytes
// of `ev`, the odd nibbles 1,3,5,7 into `od`. 7 ops for 8 values; every
// half2 is then one PRMT (hibytes) that moves two such bytes into the high bytes of the
// halves and zeros the low bytes.
__device__ __forceinline__ void e2m1_spread(uint32_t x, uint32_t& ev, uint32_t& od) {
  ev = ((x << 1) & 0x0E0E0E0Eu) | ((x << 4) & 0x80808080u);
  od = ((x >> 3) & 0x0E0E0E0Eu) | (x & 0x80808080u);
}
// Byte A of w -> bits 15..8, byte B -> bits 31..24, zeros elsewhere (one PRMT with RZ).
template <int A, int B>
__device__ __forceinline__ uint32_t hibytes(uint32_t w) {
  return prmt(w, 0u, (B << 12) | (4 << 8) | (A << 4) | 4);
}
__device__ __forceinline__ uint32_t hmul2(uint32_t a, uint32_t b) {
  uint32_t r;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
  return r;
}
// a * (low half of b, in both halves) for HI = false, a * (high half of b) for HI = true:
// ptxas folds the broadcast into the HMUL2 operand (.H0_H0 / .H1_H1) instead of a PRMT
// per scale.
template <bool HI>
__device__ __forceinline__ uint32_t hmul2_bcast(uint32_t a, uint32_t b) {
  uint32_t r;
  if constexpr (HI) {
    asm("{\n .reg .f16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {h, h};\n"
        " mul.rn.f16x2 %0, %1, t;\n}\n"
        : "=r"(r)
        : "r"(a), "r"(b));
  } else {
    asm("{\n .reg .f16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {l, l};\n"
        " mul.rn.f16x2 %0, %1, t;\n}\n"
        : "=r"(r)
        : "r"(a), "r"(b));
  }
  return r;
}

template <bool BF16>
__device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (BF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}
__device__ __forceinline__ uint32_t movtrans(uint32_t x) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}
template <bool BF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (BF16) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}
__device__ __forceinline__ float bf16_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Head-dim index (relative to the thread's quarter of D) of half `e` of K register `i`.
// NVFP4: word i/4 decoded through spread bytes, whose half2s hold the nibble pairs
// (0,2) (4,6) (1,3) (5,7); FP8 and BF16: in order.
template <int FMT>
__device__ __forceinline__ constexpr int KDim(int i, int e) {
  if constexpr (FMT == kNvfp4) {
    return 8 * (i / 4) + ((i % 4) == 0 ? 0 : (i % 4) == 1 ? 4 : (i % 4) == 2 ? 1 : 5) + 2 * e;
  } else {
    return 2 * i + e;
  }
}

}  // namespace
}  // namespace kvtier::kernels::detail
