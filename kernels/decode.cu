// Fused paged decode attention over NVFP4, FP8 or BF16 pages (one query token per
// sequence), for sm_90 with mma.sync tensor-core instructions. See docs/kernels.md for
// the design and the measurements; the short version:
//
// Work: one warp per (sequence b, KV head h, split s); a split is a run of `chunk` tokens
// (a multiple of 16). The warp streams its tokens 16 at a time (a "subtile", never
// crossing a page since T is a multiple of 16) through a private shared-memory ring
// filled by cp.async (NSTAGE subtiles deep), so many bytes are in flight per SM without
// holding them in registers.
//
// Per subtile, in registers:
//   S^T[16 tokens x 8 queries] = K[16 x D] . Q^T   (m16n8k16, K is the A operand,
//                                                   the GQA group's queries are N)
//   online softmax on S (fp32, exp2), P^T moved to B-operand layout by movmatrix
//   O^T[D x 8] += V^T[D x 16] . P^T                (V^T is the A operand)
// Queries beyond the group size are zero columns and are not written.
//
// Splits: each warp ends with (running max, denominators, O) of its split. When the split
// count is a multiple of the 4 warps per CTA, the CTA's warps hold consecutive splits of
// one (b, h) and warp 0 merges them (one partial per CTA, or the output itself when the
// CTA covers the sequence); the merge kernel, launched with PDL, combines the rest.
//
// NVFP4 values are decoded in registers from whole 32-bit words straight to fp16 *without*
// the exponent-bias multiply: the half holds e2m1 * 2^-14 (subnormal for 0.5). The
// default decode (DEC 10, "lean32a") spreads a word into clean fp16 high bytes and builds
// each half2 with one PRMT, runs the online softmax over 32 tokens (two subtiles), splits
// the QK product into two independent HMMA chains, and keeps the common path of the
// 32-token step free of branches (the last, partial step runs separately). Multiplying by the E4M3 block scale (converted exactly by cvt.f16x2.e4m3x2) is
// then exact in fp16 (the product's lowest bit is >= 2^-24, the fp16 subnormal step), and
// the 2^14 and the per-layer scales are folded into the fp32 score scale and the output.
// The order of head_dim inside a thread's registers is permuted to match whole loaded
// words; Q is loaded in the same permuted order (a dot product does not care).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/internal.h"

namespace kvtier::kernels::detail {
namespace {

constexpr int kNvfp4 = 0, kFp8 = 1, kBf16 = 2;

// MODE: 0 one subtile per softmax step, 1 two (DEC >= 3).
template <int FMT, int D, int MODE = 0>
struct Cfg {
  static constexpr int kRow = FMT == kNvfp4 ? D / 2 : (FMT == kFp8 ? D : 2 * D);  // bytes/token
  static constexpr int kSc = FMT == kNvfp4 ? D / 16 : 0;  // scale bytes per token
  static constexpr int kKData = 0;
  static constexpr int kKSc = 16 * kRow;
  static constexpr int kVData = kKSc + 16 * kSc;
  static constexpr int kVSc = kVData + 16 * kRow;
  static constexpr int kStage = kVSc + 16 * kSc;        // bytes of one subtile
  static constexpr int kStages =
      FMT == kNvfp4 ? (MODE == 1 ? 5 : 4) : (FMT == kFp8 ? 3 : 2);
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
// E2M1 nibbles J (low half) and J+4 (high half) of x -> f16x2 holding value * 2^-14.
template <int J>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t x) {
  const uint32_t mag = J <= 2 ? (x << (9 - 4 * J)) : (x >> 3);
  const uint32_t sgn = x << (12 - 4 * J);
  return (mag & 0x0E000E00u) | (sgn & 0x80008000u);
}
// E2M1 nibbles of x -> E4M3 bytes holding value * 2^-6 (sign to bit 7, the 3 magnitude
// bits to bits 4..2: exponent bias 7 instead of 1, subnormal 0.5 included): the odd
// nibbles 1,3,5,7 into the bytes of `od`, the even nibbles 0,2,4,6 into `ev`.
__device__ __forceinline__ void e2m1_to_e4m3(uint32_t x, uint32_t& ev, uint32_t& od) {
  od = (x & 0x80808080u) | ((x >> 2) & 0x1C1C1C1Cu);
  ev = ((x << 4) & 0x80808080u) | ((x << 2) & 0x1C1C1C1Cu);
}
// E2M1 nibbles of x -> clean bytes [s 0 0 0 e e m 0], i.e. the high byte of an fp16 that
// holds value * 2^-14 (as e2m1_pair, subnormal 0.5 included): the even nibbles 0,2,4,6
// into the bytes of `ev`, the odd nibbles 1,3,5,7 into `od`. 7 ops for 8 values; every
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
template <int FMT, int DEC>
__device__ __forceinline__ constexpr int KDim(int i, int e) {
  if constexpr (FMT == kNvfp4 && DEC == 0) {
    return 8 * (i / 4) + (i % 4) + 4 * e;  // word i/4, nibble pair (j, j+4)
  } else if constexpr (FMT == kNvfp4) {
    // word i/4 via E4M3 bytes (DEC 1) or spread bytes (DEC 2): (0,2) (4,6) (1,3) (5,7)
    return 8 * (i / 4) + ((i % 4) == 0 ? 0 : (i % 4) == 1 ? 4 : (i % 4) == 2 ? 1 : 5) + 2 * e;
  } else {
    return 2 * i + e;
  }
}

// DEC (NVFP4 only) picks the E2M1 decode: 0 = shift/mask straight to fp16 (value * 2^-14),
// 1 = shift/mask to E4M3 bytes then the hardware e4m3x2 -> f16x2 conversion (value * 2^-6),
// 2 = spread into clean fp16 high bytes (e2m1_spread) + one PRMT per half2 (value * 2^-14),
// 3 = the decode of 2 with 32 tokens (two subtiles) per online-softmax step,
// 4 = 3 with the QK product split into two independent HMMA chains (even / odd k-steps),
// 5 = 4 with branch-free full pairs, a lean cp.async issue, qk_scale folded into the exp2
// FFMA and MUFU.EX2 without the denormal fix-up ("lean32"), 7 = 5 with the block table
// read ahead, 10 = 7 with per-lane shared-memory offsets, 12 = 10 with the lazy running
// max (no shuffles unless a score passes the max by kLazySlack), 21 = 12 with the
// block-table entry checked by one 32-bit compare and no select ("lean32c", the default).
// Numbers measured slower or level and removed (not reused): 6 "pipe32" (software-
// pipelined), 8 "lean32h" (IMAD.HI in the spread), 9 "lean32o" (96 registers, 5 CTAs/SM; spilled on sm_100), 11 "lean32d"
// (6-slot ring), 13 "lean32v" (the first subtile's V decoded before the softmax), 14
// "lean32i" (a leaner cp.async issue), 15 "tma32" (the ring filled by TMA bulk copies on
// per-slot mbarriers: correct, 25% slower), 16 "lean32w" (12 in one-warp CTAs), 17
// "lean32s" (copy constants from shared memory), 18 "fold" (K block scales folded into the
// fp32 scores, one MMA per scale group: 6-7% slower), 19 "lean32e" (QK, softmax and PV of
// a pair as one branch-free block, the lazy-max vote after PV and a split restart when it
// fires: 1.2% slower; commit 324b947), 20 "lean32b" (block table read in 32-entry windows,
// entries by shuffle: 1.5-3% slower, the shuffle's convergence checks; commit 2f81479);
// docs/kernels.md.
// All are tested; the default is the one measured fastest (docs/kernels.md).
template <int FMT, int D, int DEC>
__global__ void __launch_bounds__(kDecodeWarps * 32, D >= 256 ? 2 : 4)
    DecodeKernel(const DecodeLaunch a) {
  constexpr bool kPair = DEC >= 3;          // 32 tokens per softmax step
  constexpr int kDec = DEC >= 3 ? 2 : DEC;  // the E2M1 decode
  constexpr bool kSplitQk = DEC >= 4;  // QK as two independent HMMA chains
  // DEC 5: the pair loop without branches on its common path (full pairs; the last,
  // partial pair runs the DEC 4 body once), cheaper cp.async issue, qk_scale folded into
  // one FFMA per score, MUFU.EX2 without the denormal fix-up.
  constexpr bool kOpt = DEC >= 5;
  // DEC 7: DEC 5 with the block-table entry of each subtile loaded two issues ahead (its
  // load no longer stalls the cp.async issue).
  constexpr bool kPref = DEC == 7 || DEC >= 10;
  // DEC 21 ("lean32c"): lean32m with a leaner subtile issue: the block-table entry checked
  // by one 32-bit compare (num_slots32), the page address from the entry as loaded (a
  // refused entry's copies are predicated off, so no select), and the entry's index by an
  // unsigned shift (no sign extension).
  // The page-read probe copies as the default (lean32c) does.
  constexpr bool kTrim = DEC == 21 || DEC == kReadOnlyVariant;
  // DEC 10: DEC 7 with the per-lane part of the V data / V scale shared-memory addresses
  // computed once (the V swizzle term does not depend on the token pair), so each load
  // is the slot base plus a lane register plus an immediate.
  constexpr bool kLaneOff = DEC >= 10;
  // DEC 12: the full pairs' softmax keeps its running max while no score passes it by
  // more than kLazySlack (log2 units): one vote instead of the 3-round shuffle max, the
  // alpha exp2s and the rescale vote. Every lane keeps the same max (it only moves in
  // the warp-uniform slow path, after the full reduction), and P <= 2^kLazySlack fits
  // fp16. O and l are exact for any reference max, so nothing else changes.
  constexpr bool kLazyMax = DEC >= 12;
  // kReadOnlyVariant (99): the page-read probe. The copies of lean32c, no arithmetic, no
  // output: what the decode's memory access pattern alone costs (kvt_decode_read_probe).
  constexpr bool kReadOnly = DEC == kReadOnlyVariant;
  using C = Cfg<FMT, D, kPair ? 1 : 0>;
  constexpr bool kBf = FMT == kBf16;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int gid = lane >> 2, tq = lane & 3;
  // The merge grid (PDL) may be launched now: its CTAs take the room this grid leaves on
  // the SMs and wait in griddepcontrol.wait until this grid is done and its writes are
  // visible. Exited CTAs count as triggered.
  if (a.early_trigger) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  const int work = blockIdx.x * kDecodeWarps + warp;
  const int total = a.batch * a.num_kv_heads * a.num_splits;
  if (work >= total) return;
  const int split = work % a.num_splits;
  const int h = (work / a.num_splits) % a.num_kv_heads;
  const int b = work / (a.num_splits * a.num_kv_heads);
  uint8_t* ring = smem + warp * C::kSmemPerWarp;
  const uint32_t ring_s = smem_addr(ring);

  int bad = 0;
  int seq_len = a.seq_lens[b];
  if (seq_len < 0 || seq_len > a.max_seq_len) {
    bad = kErrSeqLen;
    seq_len = 0;
  }
  const int t_begin = split * a.chunk;
  const int t_end = min(t_begin + a.chunk, seq_len);
  const int n_sub = t_end > t_begin ? (t_end - t_begin + 15) >> 4 : 0;

  // ---- cp.async producer: subtile j of this warp into ring stage j % kStages ----------
  const int32_t* bt = a.block_table + static_cast<size_t>(b) * a.max_blocks;
  // Per-lane constant parts of the copy addresses: the warp's head inside a page, this
  // lane's chunk offsets (V chunks swizzled), and which side's scales it copies.
  const uint8_t* pool_l = a.pool + a.page_offset;
  const uint32_t head_rows = static_cast<uint32_t>(h * a.block_tokens);
  auto issue = [&](int j) {
    const int t0 = t_begin + 16 * j;
    // One uniform load per subtile (cached); checked before any byte of the page is read.
    const int32_t slot = __ldg(bt + (t0 >> a.log2_block_tokens));
    if (slot < 0 || static_cast<uint64_t>(slot) >= a.num_slots) bad |= kErrSlotRange;
    if (bad) return;  // never touch memory through a refused entry
    const uint8_t* page = pool_l + static_cast<uint64_t>(static_cast<uint32_t>(slot)) * a.slot_bytes;
    const uint32_t row0 = head_rows + static_cast<uint32_t>(t0 & (a.block_tokens - 1));
    const uint8_t* kd = page + a.k_data + row0 * C::kRow;
    const uint8_t* vd = page + a.v_data + row0 * C::kRow;
    const uint8_t* ks = page + a.k_scale + row0 * C::kSc;
    const uint8_t* vs = page + a.v_scale + row0 * C::kSc;
    const uint32_t st = ring_s + (j % C::kStages) * C::kStage;
    // K and V data: kRow chunks each (16 rows x kRow bytes), lane-strided; the region of
    // every copy is known at compile time. Then the scale chunks (kSc per side, <= 32).
#pragma unroll
    for (int it = 0; it < C::kRow / 32; ++it) {
      const int off = 16 * (lane + 32 * it);
      cp_async16(st + C::kKData + off, kd + off);
    }
#pragma unroll
    for (int it = 0; it < C::kRow / 32; ++it) {
      const int off = 16 * (lane + 32 * it);
      const int r = off / C::kRow;
      const int cc = (off % C::kRow) / 16;
      cp_async16(st + C::kVData + r * C::kRow + ((cc ^ ((r >> 1) & C::kSwzMask)) * 16), vd + off);
    }
    if constexpr (C::kSc > 0) {
      static_assert(2 * C::kSc <= 32, "scale chunks must fit one lane pass");
      if (lane < C::kSc) {
        cp_async16(st + C::kKSc + 16 * lane, ks + 16 * lane);
      } else if (lane < 2 * C::kSc) {
        cp_async16(st + C::kVSc + 16 * (lane - C::kSc), vs + 16 * (lane - C::kSc));
      }
    }
  };

  // kOpt issue: the same copies, with the per-lane parts of every address (region
  // offsets, lane chunk, V swizzle, which side's scales) computed once, 32-bit offsets
  // from one 64-bit page pointer, the ring slot passed in (no % kStages), and the
  // scale copies and the refusal as predicates instead of branches.
  constexpr int kDataIt = C::kRow / 32;  // 16-byte data chunks per lane and side
  uint32_t o_gk = 0, o_gv = 0, o_gs = 0, o_ds = 0;
  uint32_t o_dv[kDataIt];
  bool o_ps = false;
  if constexpr (kOpt) {
    o_gk = a.k_data + 16u * lane;
    o_gv = a.v_data + 16u * lane;
#pragma unroll
    for (int it = 0; it < kDataIt; ++it) {
      const int off = 16 * (lane + 32 * it);
      const int r = off / C::kRow;
      const int cc = (off % C::kRow) / 16;
      o_dv[it] = C::kVData + r * C::kRow + ((cc ^ ((r >> 1) & C::kSwzMask)) * 16);
    }
    if constexpr (C::kSc > 0) {
      o_ps = lane < 2 * C::kSc;
      const bool ks = lane < C::kSc;
      o_gs = ks ? a.k_scale + 16u * lane : a.v_scale + 16u * (lane - C::kSc);
      o_ds = ks ? C::kKSc + 16 * lane : C::kVSc + 16 * (lane - C::kSc);
    }
  }
  auto bt_entry = [&](int jj) -> int32_t {
    if constexpr (kTrim) {
      return jj < n_sub ? __ldg(bt + (static_cast<uint32_t>(t_begin + 16 * jj) >> a.log2_block_tokens)) : 0;
    }
    return jj < n_sub ? __ldg(bt + ((t_begin + 16 * jj) >> a.log2_block_tokens)) : 0;
  };
  int32_t pf0 = 0, pf1 = 0;  // kPref: entries of the next two subtiles to issue
  if constexpr (kPref) {
    pf0 = bt_entry(0);
    pf1 = bt_entry(1);
  }
  // Subtiles are issued in order j = 0, 1, 2, ...
  auto issue_std = [&](int j, uint32_t st) {
    const int t0 = t_begin + 16 * j;
    const bool want = j < n_sub;
    int32_t slot = 0;
    if constexpr (kPref) {
      slot = pf0;
      pf0 = pf1;
      pf1 = bt_entry(j + 2);
    } else {
      if (want) slot = __ldg(bt + (t0 >> a.log2_block_tokens));
    }
    const bool ok = kTrim ? static_cast<uint32_t>(slot) < a.num_slots32
                          : slot >= 0 && static_cast<uint64_t>(slot) < a.num_slots;
    if (!ok) bad |= kErrSlotRange;
    const bool go = want && !bad;  // never touch memory through a refused entry
    const uint8_t* page =
        pool_l + static_cast<uint64_t>(static_cast<uint32_t>(kTrim || ok ? slot : 0)) * a.slot_bytes;
    const uint32_t row0 = head_rows + static_cast<uint32_t>(t0 & (a.block_tokens - 1));
    const uint8_t* kd = page + (o_gk + row0 * C::kRow);
    const uint8_t* vd = page + (o_gv + row0 * C::kRow);
#pragma unroll
    for (int it = 0; it < kDataIt; ++it) {
      cp_async16_if(st + C::kKData + 16 * lane + 512 * it, kd + 512 * it, go);
    }
#pragma unroll
    for (int it = 0; it < kDataIt; ++it) cp_async16_if(st + o_dv[it], vd + 512 * it, go);
    if constexpr (C::kSc > 0) {
      cp_async16_if(st + o_ds, page + (o_gs + row0 * C::kSc), go && o_ps);
    }
  };
  auto issue_opt = [&](int j, uint32_t st) { issue_std(j, st); };

#pragma unroll
  for (int j = 0; j < C::kStages - (kPair ? 2 : 1); ++j) {
    if constexpr (kOpt) {
      issue_opt(j, ring_s + j * C::kStage);
    } else {
      if (j < n_sub) issue(j);
    }
    cp_commit();
  }

  // Q is loaded after the first copies are on their way, so its global-load latency
  // overlaps theirs (at batch 1 every warp starts at once and waits for both).
  // ---- Q as the B operand, in the permuted head_dim order of the K registers --------
  const int qn = gid < a.group ? gid : 0;  // query column of this thread (B's n index)
  const uint16_t* qrow =
      a.q + (static_cast<size_t>(b) * a.num_q_heads + h * a.group + qn) * D + tq * (D / 4);
  float qv[C::kRegs][2];
  float qmax = 0.f;
#pragma unroll
  for (int i = 0; i < C::kRegs; ++i) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      qv[i][e] = gid < a.group ? bf16_to_float(qrow[KDim<FMT, DEC>(i, e)]) : 0.f;
      qmax = fmaxf(qmax, fabsf(qv[i][e]));
    }
  }
  // fp16 needs Q brought into range: multiply by a power of two chosen from the warp's
  // max |q| (exact), and divide it back out of the scores.
  float qmul = 1.f;
  if constexpr (!kBf) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, o));
    int ex = 0;
    if (qmax > 0.f && isfinite(qmax)) {
      frexpf(qmax, &ex);
      ex = max(-120, min(120, 8 - ex));
    }
    qmul = ldexpf(1.f, ex);
  }
  // kOpt folds qk_scale into the exp2 argument, which needs qk_scale >= 0 (the max of the
  // scaled scores is then the scaled max): a negative softmax scale negates Q instead.
  if constexpr (kOpt) {
    if (a.softmax_scale < 0.f) qmul = -qmul;
  }
  uint32_t qb[C::kRegs];
#pragma unroll
  for (int i = 0; i < C::kRegs; ++i) qb[i] = pack2<kBf>(qv[i][0] * qmul, qv[i][1] * qmul);
  // Q B-fragment words 2k and 2k+1.
  auto qpair = [&](int k, uint32_t& b0, uint32_t& b1) {
    b0 = qb[2 * k];
    b1 = qb[2 * k + 1];
  };

  constexpr float kLog2e = 1.4426950408889634f;
  // kLazyMax: how far (log2 units) a score may pass the running max before the max moves;
  // P <= 2^kLazySlack = 256 stays far inside fp16.
  constexpr float kLazySlack = 8.f;
  // Undo the power of two of the raw NVFP4 decode (2^-14, or 2^-6 through E4M3).
  const float fmt_k = FMT == kNvfp4 ? (DEC == 1 ? 64.f : 16384.f) : 1.f;
  const float qk_scale = a.softmax_scale * kLog2e * a.k_scale_f * fmt_k / qmul;
  const float v_factor = a.v_scale_f * fmt_k;

  float acc[D / 16][4];
#pragma unroll
  for (int m = 0; m < D / 16; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
  float mrun[2] = {-1e30f, -1e30f};  // running max (log2 units) of query cols 2tq, 2tq+1
  float lrun[2] = {0.f, 0.f};        // this thread's partial denominators

  // kLaneOff: per-lane K data / K scale offsets (row gid; row gid+8 is an immediate away)
  const uint32_t k_lane = kLaneOff ? C::kKData + gid * C::kRow + tq * (C::kRow / 4) : 0;
  const uint32_t ks_lane = kLaneOff ? C::kKSc + gid * C::kSc + tq * (D / 64) : 0;
  // ---- K rows gid and gid+8 of the subtile at `st` -> A fragments; S^T = K . Q^T -----
  auto qk = [&](const uint32_t st, float (&s)[4]) {
    s[0] = s[1] = s[2] = s[3] = 0.f;
    {
      uint32_t kr[2][C::kRegs];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = gid + 8 * r;
        uint32_t w[C::kKWords];
        if constexpr (kLaneOff) {
          lds<C::kKWords>(st + k_lane + r * 8 * C::kRow, w);
        } else {
          lds<C::kKWords>(st + C::kKData + row * C::kRow + tq * (C::kRow / 4), w);
        }
        if constexpr (FMT == kNvfp4) {
          constexpr int kG = D / 64;  // scale groups per thread-row
          const uint32_t sa =
              kLaneOff ? st + ks_lane + r * 8 * C::kSc : st + C::kKSc + row * C::kSc + tq * kG;
          uint32_t sfb[kG];
          // kOpt, kG >= 2: sfb[g] holds the pair of groups (g & ~1, g | 1), and the
          // multiply broadcasts the half it needs (hmul2_bcast).
          if constexpr (kG == 1) {
            const uint32_t x = lds_u8(sa);
            sfb[0] = e4m3x2_to_f16x2(x | (x << 8));
          } else if constexpr (kG == 2 && kOpt) {
            sfb[0] = sfb[1] = e4m3x2_to_f16x2(lds_u16(sa));
          } else if constexpr (kG == 4 && kOpt) {
            uint32_t x[1];
            lds<1>(sa, x);
            sfb[0] = sfb[1] = e4m3x2_to_f16x2(x[0]);
            sfb[2] = sfb[3] = e4m3x2_to_f16x2(x[0] >> 16);
          } else if constexpr (kG == 2) {
            const uint32_t pr = e4m3x2_to_f16x2(lds_u16(sa));
            sfb[0] = prmt(pr, pr, 0x1010);
            sfb[1] = prmt(pr, pr, 0x3232);
          } else {
            uint32_t x[1];
            lds<1>(sa, x);
            const uint32_t lo = e4m3x2_to_f16x2(x[0]), hi = e4m3x2_to_f16x2(x[0] >> 16);
            sfb[0] = prmt(lo, lo, 0x1010);
            sfb[1] = prmt(lo, lo, 0x3232);
            sfb[2] = prmt(hi, hi, 0x1010);
            sfb[3] = prmt(hi, hi, 0x3232);
          }
#pragma unroll
          for (int wi = 0; wi < C::kKWords; ++wi) {
            const uint32_t sc = sfb[wi / 2];
            if constexpr (kOpt && kG >= 2) {
              uint32_t ev, od;
              e2m1_spread(w[wi], ev, od);
              // words 0-1 of a group pair take its low scale, words 2-3 the high one
              auto put = [&](auto hi) {
                constexpr bool kHi = decltype(hi)::value;
                kr[r][4 * wi + 0] = hmul2_bcast<kHi>(hibytes<0, 1>(ev), sc);
                kr[r][4 * wi + 1] = hmul2_bcast<kHi>(hibytes<2, 3>(ev), sc);
                kr[r][4 * wi + 2] = hmul2_bcast<kHi>(hibytes<0, 1>(od), sc);
                kr[r][4 * wi + 3] = hmul2_bcast<kHi>(hibytes<2, 3>(od), sc);
              };
              if ((wi / 2) % 2 == 0) {
                put(std::false_type{});
              } else {
                put(std::true_type{});
              }
            } else if constexpr (kDec == 2) {
              uint32_t ev, od;
              e2m1_spread(w[wi], ev, od);
              kr[r][4 * wi + 0] = hmul2(hibytes<0, 1>(ev), sc);  // nibbles 0, 2
              kr[r][4 * wi + 1] = hmul2(hibytes<2, 3>(ev), sc);  // 4, 6
              kr[r][4 * wi + 2] = hmul2(hibytes<0, 1>(od), sc);  // 1, 3
              kr[r][4 * wi + 3] = hmul2(hibytes<2, 3>(od), sc);  // 5, 7
            } else if constexpr (kDec == 0) {
              kr[r][4 * wi + 0] = hmul2(e2m1_pair<0>(w[wi]), sc);
              kr[r][4 * wi + 1] = hmul2(e2m1_pair<1>(w[wi]), sc);
              kr[r][4 * wi + 2] = hmul2(e2m1_pair<2>(w[wi]), sc);
              kr[r][4 * wi + 3] = hmul2(e2m1_pair<3>(w[wi]), sc);
            } else {
              uint32_t ev, od;
              e2m1_to_e4m3(w[wi], ev, od);
              kr[r][4 * wi + 0] = hmul2(e4m3x2_to_f16x2(ev), sc);
              kr[r][4 * wi + 1] = hmul2(e4m3x2_to_f16x2(ev >> 16), sc);
              kr[r][4 * wi + 2] = hmul2(e4m3x2_to_f16x2(od), sc);
              kr[r][4 * wi + 3] = hmul2(e4m3x2_to_f16x2(od >> 16), sc);
            }
          }
        } else if constexpr (FMT == kFp8) {
#pragma unroll
          for (int wi = 0; wi < C::kKWords; ++wi) {
            kr[r][2 * wi] = e4m3x2_to_f16x2(w[wi]);
            kr[r][2 * wi + 1] = e4m3x2_to_f16x2(w[wi] >> 16);
          }
        } else {
#pragma unroll
          for (int wi = 0; wi < C::kKWords; ++wi) kr[r][wi] = w[wi];
        }
      }
      if constexpr (kSplitQk) {
        // even and odd k-steps accumulate separately: two dependent chains of D/32 HMMAs
        // instead of one of D/16, joined by 4 FADD.
        float s2[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int ks = 0; ks < D / 16; ks += 2) {
          uint32_t b0, b1, b2, b3;
          qpair(ks, b0, b1);
          qpair(ks + 1, b2, b3);
          mma<kBf>(s, kr[0][2 * ks], kr[1][2 * ks], kr[0][2 * ks + 1], kr[1][2 * ks + 1], b0, b1);
          mma<kBf>(s2, kr[0][2 * ks + 2], kr[1][2 * ks + 2], kr[0][2 * ks + 3], kr[1][2 * ks + 3], b2, b3);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i] += s2[i];
      } else {
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
          uint32_t b0, b1;
          qpair(ks, b0, b1);
          mma<kBf>(s, kr[0][2 * ks], kr[1][2 * ks], kr[0][2 * ks + 1], kr[1][2 * ks + 1], b0, b1);
        }
      }
    }
  };

  // ---- V of tokens (2tq, 2tq+1) and (2tq+8, 2tq+9), rows of D/8 head dims; O^T += V^T . P^T
  // (subtile at `st`, first token t0, `tail` when it holds tokens >= t_end).
  uint32_t v_lane = 0, vs_lane = 0;  // kLaneOff: per-lane V data / V scale offsets
  if constexpr (kLaneOff && FMT == kNvfp4) {
    const int boff = gid * (C::kRow / 8);
    v_lane = C::kVData + 2 * tq * C::kRow + (((boff / 16) ^ (tq & C::kSwzMask)) * 16) + boff % 16;
    vs_lane = C::kVSc + 2 * tq * C::kSc + (gid * (D / 8)) / 16;
  }
  auto pv = [&](const uint32_t st, const int t0, const bool tail, const uint32_t pb0,
                const uint32_t pb1) {
    {
      uint32_t vr[2][C::kRegs];
#pragma unroll
      for (int pr = 0; pr < 2; ++pr) {
        const int ta = 2 * tq + 8 * pr;  // tokens ta, ta+1
        uint32_t wa[C::kVWords], wb[C::kVWords];
        const int boff = gid * (C::kRow / 8);
        if constexpr (FMT == kNvfp4 && kLaneOff) {
          // (ta >> 1) & mask == tq & mask for both rows of every pair (ta = 2 tq + 8 pr)
          const uint32_t va = st + v_lane + pr * 8 * C::kRow;
          lds<C::kVWords>(va, wa);
          lds<C::kVWords>(va + C::kRow, wb);
        } else if constexpr (FMT == kNvfp4) {
          const int cc = boff / 16, inner = boff % 16;
          lds<C::kVWords>(st + C::kVData + ta * C::kRow +
                              ((cc ^ ((ta >> 1) & C::kSwzMask)) * 16) + inner, wa);
          lds<C::kVWords>(st + C::kVData + (ta + 1) * C::kRow +
                              ((cc ^ (((ta + 1) >> 1) & C::kSwzMask)) * 16) + inner, wb);
        } else {
          lds<C::kVWords>(st + C::kVData + ta * C::kRow + boff, wa);
          lds<C::kVWords>(st + C::kVData + (ta + 1) * C::kRow + boff, wb);
        }
        if (tail) {
          // Rows past the end hold whatever the page had: zero them (and their scales)
          // so that 0 * garbage cannot make a NaN.
          const bool za = t0 + ta >= t_end, zb = t0 + ta + 1 >= t_end;
#pragma unroll
          for (int w = 0; w < C::kVWords; ++w) {
            wa[w] = za ? 0u : wa[w];
            wb[w] = zb ? 0u : wb[w];
          }
        }
        if constexpr (FMT == kNvfp4) {
          constexpr int kVG = D >= 256 ? 2 : 1;  // scale groups a thread's D/8 dims span
          const int goff = (gid * (D / 8)) / 16;
          uint32_t spair[kVG];
#pragma unroll
          for (int g = 0; g < kVG; ++g) {
            uint32_t sa, sb;
            if constexpr (kLaneOff) {
              const uint32_t vs = st + vs_lane + pr * 8 * C::kSc + g;
              sa = lds_u8(vs);
              sb = lds_u8(vs + C::kSc);
            } else {
              sa = lds_u8(st + C::kVSc + ta * C::kSc + goff + g);
              sb = lds_u8(st + C::kVSc + (ta + 1) * C::kSc + goff + g);
            }
            if (tail) {  // a stale scale byte may be 0x7F (NaN): 0 * NaN would poison O
              sa = t0 + ta >= t_end ? 0u : sa;
              sb = t0 + ta + 1 >= t_end ? 0u : sb;
            }
            // kLaneOff: the two bytes side by side with one PRMT (cvt reads the low 16 bits)
            spair[g] = e4m3x2_to_f16x2(kLaneOff ? prmt(sa, sb, 0x0040) : (sa | (sb << 8)));
          }
#pragma unroll
          for (int w = 0; w < C::kVWords; ++w) {
            const uint32_t sc = spair[(8 * w) / 16];
            if constexpr (kDec == 1) {
              uint32_t ea, oa, eb, ob;
              e2m1_to_e4m3(wa[w], ea, oa);
              e2m1_to_e4m3(wb[w], eb, ob);
              const uint32_t p0 = prmt(ea, eb, 0x5140), p1 = prmt(ea, eb, 0x7362);  // dims 0,2 | 4,6
              const uint32_t p2 = prmt(oa, ob, 0x5140), p3 = prmt(oa, ob, 0x7362);  // dims 1,3 | 5,7
              vr[pr][8 * w + 0] = hmul2(e4m3x2_to_f16x2(p0), sc);
              vr[pr][8 * w + 2] = hmul2(e4m3x2_to_f16x2(p0 >> 16), sc);
              vr[pr][8 * w + 4] = hmul2(e4m3x2_to_f16x2(p1), sc);
              vr[pr][8 * w + 6] = hmul2(e4m3x2_to_f16x2(p1 >> 16), sc);
              vr[pr][8 * w + 1] = hmul2(e4m3x2_to_f16x2(p2), sc);
              vr[pr][8 * w + 3] = hmul2(e4m3x2_to_f16x2(p2 >> 16), sc);
              vr[pr][8 * w + 5] = hmul2(e4m3x2_to_f16x2(p3), sc);
              vr[pr][8 * w + 7] = hmul2(e4m3x2_to_f16x2(p3 >> 16), sc);
              continue;
            }
            const uint32_t x0 = prmt(wa[w], wb[w], 0x5410);  // dims 8w..8w+3
            const uint32_t x1 = prmt(wa[w], wb[w], 0x7632);  // dims 8w+4..8w+7
            if constexpr (kDec == 2) {
              // spread bytes of x0: ev = [a0 a2 b0 b2], od = [a1 a3 b1 b3] (dims of tokens a, b)
              uint32_t ev, od;
              e2m1_spread(x0, ev, od);
              vr[pr][8 * w + 0] = hmul2(hibytes<0, 2>(ev), sc);
              vr[pr][8 * w + 2] = hmul2(hibytes<1, 3>(ev), sc);
              vr[pr][8 * w + 1] = hmul2(hibytes<0, 2>(od), sc);
              vr[pr][8 * w + 3] = hmul2(hibytes<1, 3>(od), sc);
              e2m1_spread(x1, ev, od);
              vr[pr][8 * w + 4] = hmul2(hibytes<0, 2>(ev), sc);
              vr[pr][8 * w + 6] = hmul2(hibytes<1, 3>(ev), sc);
              vr[pr][8 * w + 5] = hmul2(hibytes<0, 2>(od), sc);
              vr[pr][8 * w + 7] = hmul2(hibytes<1, 3>(od), sc);
              continue;
            }
            vr[pr][8 * w + 0] = hmul2(e2m1_pair<0>(x0), sc);
            vr[pr][8 * w + 1] = hmul2(e2m1_pair<1>(x0), sc);
            vr[pr][8 * w + 2] = hmul2(e2m1_pair<2>(x0), sc);
            vr[pr][8 * w + 3] = hmul2(e2m1_pair<3>(x0), sc);
            vr[pr][8 * w + 4] = hmul2(e2m1_pair<0>(x1), sc);
            vr[pr][8 * w + 5] = hmul2(e2m1_pair<1>(x1), sc);
            vr[pr][8 * w + 6] = hmul2(e2m1_pair<2>(x1), sc);
            vr[pr][8 * w + 7] = hmul2(e2m1_pair<3>(x1), sc);
          }
        } else if constexpr (FMT == kFp8) {
#pragma unroll
          for (int w = 0; w < C::kVWords; ++w) {
            const uint32_t y0 = prmt(wa[w], wb[w], 0x5140);  // a0 b0 a1 b1
            const uint32_t y1 = prmt(wa[w], wb[w], 0x7362);  // a2 b2 a3 b3
            vr[pr][4 * w + 0] = e4m3x2_to_f16x2(y0);
            vr[pr][4 * w + 1] = e4m3x2_to_f16x2(y0 >> 16);
            vr[pr][4 * w + 2] = e4m3x2_to_f16x2(y1);
            vr[pr][4 * w + 3] = e4m3x2_to_f16x2(y1 >> 16);
          }
        } else {
#pragma unroll
          for (int w = 0; w < C::kVWords; ++w) {
            vr[pr][2 * w] = prmt(wa[w], wb[w], 0x5410);
            vr[pr][2 * w + 1] = prmt(wa[w], wb[w], 0x7632);
          }
        }
      }
#pragma unroll
      for (int m = 0; m < D / 16; ++m) {
        mma<kBf>(acc[m], vr[0][2 * m], vr[0][2 * m + 1], vr[1][2 * m], vr[1][2 * m + 1], pb0, pb1);
      }
    }
  };

  // One 32-token softmax step over subtiles j (ring slot `sta`) and j+1 (`stb`), j+1
  // possibly past the split's end (has2) and tokens >= t_end masked (tail).
  // Max over the 8 lanes (gid) that hold a query column's scores.
  auto col_max = [](float (&t)[2]) {
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      t[0] = fmaxf(t[0], __shfl_xor_sync(0xffffffffu, t[0], o));
      t[1] = fmaxf(t[1], __shfl_xor_sync(0xffffffffu, t[1], o));
    }
  };
  // O *= alpha (per query column), skipped by the whole warp when no max moved.
  auto rescale_if_moved = [&](const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int m = 0; m < D / 16; ++m) {
        acc[m][0] *= alpha[0];
        acc[m][1] *= alpha[1];
        acc[m][2] *= alpha[0];
        acc[m][3] *= alpha[1];
      }
    }
  };
  auto pair_step = [&](const int j, const uint32_t sta, const uint32_t stb) {
    const bool has2 = j + 1 < n_sub;  // warp-uniform
    const int t0 = t_begin + 16 * j;
    float sa[4], sb[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    qk(sta, sa);
    if (has2) qk(stb, sb);
    float s[8] = {sa[0], sa[1], sa[2], sa[3], sb[0], sb[1], sb[2], sb[3]};
    const bool tail = t0 + 32 > t_end;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      s[i] *= qk_scale;
      if (tail) {
        const int tok = t0 + gid + ((i & 2) ? 8 : 0) + ((i & 4) ? 16 : 0);
        if (tok >= t_end) s[i] = -INFINITY;
      }
    }
    float tmax[2] = {fmaxf(fmaxf(s[0], s[2]), fmaxf(s[4], s[6])),
                     fmaxf(fmaxf(s[1], s[3]), fmaxf(s[5], s[7]))};
    col_max(tmax);
    float alpha[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float mn = fmaxf(mrun[c], tmax[c]);
      alpha[c] = exp2f(mrun[c] - mn);
      mrun[c] = mn;
    }
    float p[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) p[i] = exp2f(s[i] - mrun[i & 1]);
    lrun[0] = lrun[0] * alpha[0] + ((p[0] + p[2]) + (p[4] + p[6]));
    lrun[1] = lrun[1] * alpha[1] + ((p[1] + p[3]) + (p[5] + p[7]));
    rescale_if_moved(alpha);
    pv(sta, t0, t0 + 16 > t_end, movtrans(pack2<kBf>(p[0], p[1])), movtrans(pack2<kBf>(p[2], p[3])));
    if (has2) {
      pv(stb, t0 + 16, t0 + 32 > t_end, movtrans(pack2<kBf>(p[4], p[5])),
         movtrans(pack2<kBf>(p[6], p[7])));
    }
  };

  // kOpt building blocks: QK of a full pair (one basic block), the softmax step with
  // qk_scale folded into one FFMA per score (qk_scale >= 0, so the scaled max is
  // qk_scale * the max), PV of a full pair.
  auto qk_pair = [&](const uint32_t sta, const uint32_t stb, float (&s)[8]) {
    float sa[4], sb[4];
    qk(sta, sa);
    qk(stb, sb);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[i] = sa[i];
      s[4 + i] = sb[i];
    }
  };
  auto softmax_pair = [&](const float (&s)[8], uint32_t (&pb)[4]) {
    float tmax[2] = {fmaxf(fmaxf(s[0], s[2]), fmaxf(s[4], s[6])),
                     fmaxf(fmaxf(s[1], s[3]), fmaxf(s[5], s[7]))};
    if constexpr (kLazyMax) {
      // P with the current max, computed before the vote so that the MUFUs need not wait
      // for it; redone only in the slow path (a score above max + kLazySlack, or the first
      // pair, whose max is the -1e30 start value).
      float p[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) p[i] = ex2_ftz(fmaf(s[i], qk_scale, -mrun[i & 1]));
      const bool up = fmaf(tmax[0], qk_scale, -mrun[0]) > kLazySlack ||
                      fmaf(tmax[1], qk_scale, -mrun[1]) > kLazySlack;
      if (__any_sync(0xffffffffu, up)) {
        col_max(tmax);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float mn = fmaxf(mrun[c], tmax[c] * qk_scale);
          const float alpha = ex2_ftz(mrun[c] - mn);
          mrun[c] = mn;
          lrun[c] *= alpha;
#pragma unroll
          for (int m = 0; m < D / 16; ++m) {
            acc[m][c] *= alpha;
            acc[m][c + 2] *= alpha;
          }
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] = ex2_ftz(fmaf(s[i], qk_scale, -mrun[i & 1]));
      }
      lrun[0] += (p[0] + p[2]) + (p[4] + p[6]);
      lrun[1] += (p[1] + p[3]) + (p[5] + p[7]);
#pragma unroll
      for (int i = 0; i < 4; ++i) pb[i] = movtrans(pack2<kBf>(p[2 * i], p[2 * i + 1]));
    } else {
      col_max(tmax);
      float alpha[2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float mn = fmaxf(mrun[c], tmax[c] * qk_scale);
        alpha[c] = ex2_ftz(mrun[c] - mn);
        mrun[c] = mn;
      }
      float p[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) p[i] = ex2_ftz(fmaf(s[i], qk_scale, -mrun[i & 1]));
      lrun[0] = lrun[0] * alpha[0] + ((p[0] + p[2]) + (p[4] + p[6]));
      lrun[1] = lrun[1] * alpha[1] + ((p[1] + p[3]) + (p[5] + p[7]));
      rescale_if_moved(alpha);
#pragma unroll
      for (int i = 0; i < 4; ++i) pb[i] = movtrans(pack2<kBf>(p[2 * i], p[2 * i + 1]));
    }
  };
  auto pv_pair = [&](const uint32_t sta, const uint32_t stb, const uint32_t (&pb)[4]) {
    pv(sta, 0, false, pb[0], pb[1]);
    pv(stb, 0, false, pb[2], pb[3]);
  };
  auto nxt = [](int x) { return x + 1 == C::kStages ? 0 : x + 1; };
  // Subtiles in full pairs (no token of them is >= t_end).
  const int n_full = n_sub > 0 ? ((t_end - t_begin) >> 5) * 2 : 0;

  if constexpr (kOpt) {
    // Full pairs: no has2 / tail / masking, so both subtiles' QK (and both PVs) are one
    // basic block each. The last, partial pair (at most 2 subtiles) runs pair_step.
    int rs = 0, ws = C::kStages - 2;  // ring slots of subtile j and of j + kStages - 2
    int j = 0;
    for (; j < n_full; j += 2) {
      issue_opt(j + C::kStages - 2, ring_s + ws * C::kStage);
      cp_commit();
      ws = nxt(ws);
      issue_opt(j + C::kStages - 1, ring_s + ws * C::kStage);
      cp_commit();
      ws = nxt(ws);
      cp_wait<C::kStages - 2>();
      __syncwarp();
      if (bad) break;
      const uint32_t sta = ring_s + rs * C::kStage;
      rs = nxt(rs);
      const uint32_t stb = ring_s + rs * C::kStage;
      rs = nxt(rs);
      if constexpr (!kReadOnly) {
        float s[8];
        qk_pair(sta, stb, s);
        uint32_t pb[4];
        softmax_pair(s, pb);
        pv_pair(sta, stb, pb);
      }
      __syncwarp();
    }
    if (j < n_sub && !bad && !kReadOnly) {
      // Nothing is left to issue (at most 2 subtiles remain): wait for all of them.
      cp_wait<0>();
      __syncwarp();
      pair_step(j, ring_s + rs * C::kStage, ring_s + nxt(rs) * C::kStage);
    }
  } else if constexpr (kPair) {
    // 32 tokens (two subtiles, ring slots j and j+1) per softmax step: one max/shuffle,
    // one alpha and one rescale vote per 32 tokens. The ring has kStages = 5 slots and 3
    // subtiles stay in flight: iteration j issues j+3 and j+4 into the slots of j-2, j-1.
    for (int j = 0; j < n_sub; j += 2) {
      if (j + C::kStages - 2 < n_sub) issue(j + C::kStages - 2);
      cp_commit();
      if (j + C::kStages - 1 < n_sub) issue(j + C::kStages - 1);
      cp_commit();
      cp_wait<C::kStages - 2>();
      __syncwarp();
      if (bad) break;
      pair_step(j, ring_s + (j % C::kStages) * C::kStage, ring_s + ((j + 1) % C::kStages) * C::kStage);
      __syncwarp();
    }
  } else {
    for (int j = 0; j < n_sub; ++j) {
      if (j + C::kStages - 1 < n_sub) issue(j + C::kStages - 1);
      cp_commit();
      cp_wait<C::kStages - 1>();
      __syncwarp();
      if (bad) break;
      const uint32_t st = ring_s + (j % C::kStages) * C::kStage;
      const int t0 = t_begin + 16 * j;
      const bool tail = t0 + 16 > t_end;

      float s[4];
      qk(st, s);

      // ---- online softmax over the 16 tokens (rows gid, gid+8) ---------------------------
  #pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[i] *= qk_scale;
        if (tail) {
          const int tok = t0 + gid + (i >= 2 ? 8 : 0);
          if (tok >= t_end) s[i] = -INFINITY;
        }
      }
      float tmax[2] = {fmaxf(s[0], s[2]), fmaxf(s[1], s[3])};
      col_max(tmax);
      float alpha[2];
  #pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float mn = fmaxf(mrun[c], tmax[c]);
        alpha[c] = exp2f(mrun[c] - mn);
        mrun[c] = mn;
      }
      const float p0 = exp2f(s[0] - mrun[0]), p1 = exp2f(s[1] - mrun[1]);
      const float p2 = exp2f(s[2] - mrun[0]), p3 = exp2f(s[3] - mrun[1]);
      lrun[0] = lrun[0] * alpha[0] + (p0 + p2);
      lrun[1] = lrun[1] * alpha[1] + (p1 + p3);
      rescale_if_moved(alpha);
      const uint32_t pb0 = movtrans(pack2<kBf>(p0, p1));  // tokens 2tq, 2tq+1 of query gid
      const uint32_t pb1 = movtrans(pack2<kBf>(p2, p3));  // tokens 2tq+8, 2tq+9

      pv(st, t0, tail, pb0, pb1);
      __syncwarp();
    }
  }
  cp_wait<0>();
  if constexpr (kReadOnly) {  // the tail's copies were issued by the loop; nothing is computed or written
    if (bad && a.error_flag != nullptr && lane == 0) atomicOr(a.error_flag, bad);
  } else {
    // ---- finish: reduce the denominators over the 8 token-row lanes -------------------
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) lrun[c] += __shfl_xor_sync(0xffffffffu, lrun[c], o);
    }
    if (bad && a.error_flag != nullptr && lane == 0) atomicOr(a.error_flag, bad);
    // The merge kernel may start now: it waits (griddepcontrol.wait) until this grid is done
    // and its writes are visible, so this only lets its launch overlap the tail of this grid.
    if (!a.early_trigger) asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

    // CTA merge (ws_parts < num_splits): the CTA's warps hold consecutive splits of one
    // (b, h). Each publishes its running max, denominators and O in its own ring (free now),
    // and warp 0 combines them with weights 2^(m_w - M): one partial per CTA, 4x fewer for
    // the merge kernel to read, and none at all when the CTA covers the whole sequence.
    int part = split, nparts = a.num_splits;
    if (a.ws_parts != a.num_splits) {
      constexpr int kPub = 4 * (D / 16) + 5;  // acc, mrun[2], lrun[2], bad
      static_assert(kPub * 32 * 4 <= C::kSmemPerWarp, "the ring must hold a warp's partial state");
      float* pub = reinterpret_cast<float*>(ring);
      __syncwarp();
#pragma unroll
      for (int m = 0; m < D / 16; ++m) {
#pragma unroll
        for (int i = 0; i < 4; ++i) pub[(4 * m + i) * 32 + lane] = acc[m][i];
      }
      pub[(kPub - 5) * 32 + lane] = mrun[0];
      pub[(kPub - 4) * 32 + lane] = mrun[1];
      pub[(kPub - 3) * 32 + lane] = lrun[0];
      pub[(kPub - 2) * 32 + lane] = lrun[1];
      pub[(kPub - 1) * 32 + lane] = __int_as_float(bad);
      __syncthreads();
      if (warp != 0) return;
      float wt[kDecodeWarps][2];
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float mw[kDecodeWarps], mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w) {
          const float* pw = reinterpret_cast<const float*>(smem + w * C::kSmemPerWarp);
          mw[w] = pw[(kPub - 5 + c) * 32 + lane];
          mx = fmaxf(mx, mw[w]);
        }
        float l = 0.f;
#pragma unroll
        for (int w = 0; w < kDecodeWarps; ++w) {
          const float* pw = reinterpret_cast<const float*>(smem + w * C::kSmemPerWarp);
          wt[w][c] = ex2_ftz(mw[w] - mx);  // 1 for the warp(s) at the max; 0 for an empty split
          l += wt[w][c] * pw[(kPub - 3 + c) * 32 + lane];
        }
        mrun[c] = mx;
        lrun[c] = l;
      }
#pragma unroll
      for (int w = 1; w < kDecodeWarps; ++w) {
        const float* pw = reinterpret_cast<const float*>(smem + w * C::kSmemPerWarp);
        bad |= __float_as_int(pw[(kPub - 1) * 32 + lane]);
      }
#pragma unroll
      for (int m = 0; m < D / 16; ++m) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v = wt[0][i & 1] * acc[m][i];
#pragma unroll
          for (int w = 1; w < kDecodeWarps; ++w) {
            const float* pw = reinterpret_cast<const float*>(smem + w * C::kSmemPerWarp);
            v = fmaf(wt[w][i & 1], pw[(4 * m + i) * 32 + lane], v);
          }
          acc[m][i] = v;
        }
      }
      part = split / kDecodeWarps;
      nparts = a.ws_parts;
    }
    const float nan = __int_as_float(0x7fc00000);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int qi = 2 * tq + c;
      if (qi >= a.group) continue;
      const int hq = h * a.group + qi;
      const bool empty = lrun[c] == 0.f;
      const float inv = empty ? 0.f : v_factor / lrun[c];
      // log2-sum-exp of this split (log2 units of the scaled scores)
      const float l2 = bad ? nan : (empty ? -INFINITY : mrun[c] + __log2f(lrun[c]));
      if (nparts == 1) {
        uint16_t* o = a.out + (static_cast<size_t>(b) * a.num_q_heads + hq) * D + gid * (D / 8);
#pragma unroll
        for (int m = 0; m < D / 16; ++m) {
          const float lo = bad ? nan : acc[m][c] * inv, hi = bad ? nan : acc[m][c + 2] * inv;
          __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
          *reinterpret_cast<__nv_bfloat162*>(o + 2 * m) = v;
        }
        if (a.lse != nullptr && gid == 0) {
          a.lse[static_cast<size_t>(b) * a.num_q_heads + hq] = l2 * 0.6931471805599453f;
        }
      } else {
        const size_t row = (static_cast<size_t>(b) * a.num_q_heads + hq) * nparts + part;
        float* o = a.ws_o + row * D + gid * (D / 8);
#pragma unroll
        for (int m = 0; m < D / 16; ++m) {
          float2 v = make_float2(bad ? nan : acc[m][c] * inv, bad ? nan : acc[m][c + 2] * inv);
          *reinterpret_cast<float2*>(o + 2 * m) = v;
        }
        if (gid == 0) a.ws_lse[row] = l2;
      }
    }
  }
}

// The merged output of (row, d): num / den in bf16, and the row's natural-log lse (once
// per row); NaN for both when a split was refused.
template <int D>
__device__ __forceinline__ void MergeWrite(const DecodeLaunch& a, int row, int d, float mx, float num,
                                           float den, bool nan) {
  float res = den > 0.f ? num / den : 0.f;
  float lse = mx == -INFINITY ? -INFINITY : (mx + __log2f(den)) * 0.6931471805599453f;
  if (nan) res = lse = __int_as_float(0x7fc00000);
  __nv_bfloat16 r = __float2bfloat16_rn(res);
  a.out[static_cast<size_t>(row) * D + d] = *reinterpret_cast<uint16_t*>(&r);
  if (a.lse != nullptr && d == 0) a.lse[row] = lse;
}

// Merges the splits of one (b, hq) and 32 of its head dims: weights 2^(lse_s - max).
// Grid (B * Hq, D / 32); block = 32 dims x P parts (P a power of two <= 32, about the
// split count): thread (d, part) sums splits part, part + P, ..., keeping 8 loads in
// flight; the P partial sums meet in shared memory. Up to 8 splits per thread (256 per
// row), each thread loads its splits' lse values and partial outputs in one round (one
// wait for global memory instead of two). Beyond that, with `smem_w` the weights are
// computed once per split into shared memory, not once per split and thread. (One block
// of D x P threads per row ran 32 blocks at batch 1 and took 6.5-6.9 us at 1 x 128K.)
template <int D>
__global__ void __launch_bounds__(1024) MergeKernel(const DecodeLaunch a, int smem_w) {
  constexpr int kCols = 32;
  __shared__ float red[32][kCols];
  __shared__ float red2[32][kCols];
  extern __shared__ float wsm[];  // [ws_parts] when smem_w
  const int P = static_cast<int>(blockDim.x) / kCols;
  __shared__ float smax[32];
  const int row = blockIdx.x;  // b * Hq + hq
  const int dl = threadIdx.x % kCols, part = threadIdx.x / kCols;
  const int d = blockIdx.y * kCols + dl;
  const int ns = a.ws_parts;
  // Launched with programmatic stream serialization: wait for the decode grid (a no-op
  // when launched without it).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const float* ls = a.ws_lse + static_cast<size_t>(row) * ns;
  const float* o = a.ws_o + static_cast<size_t>(row) * ns * D + d;
  float mx = -INFINITY;
  int nan = 0;
  // The block's max of the split lse values (all threads take part).
  auto block_max = [&] {
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, k));
    nan = __syncthreads_or(nan);
    if ((threadIdx.x & 31) == 0) smax[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = smax[0];
    for (int i = 1; i < static_cast<int>(blockDim.x >> 5); ++i) mx = fmaxf(mx, smax[i]);
  };
  float num = 0.f, den = 0.f;
  if (ns <= 8 * P) {
    // One pass: a thread's splits (at most 8) have their lse and partial outputs loaded
    // together, so the kernel waits for one round of global loads, not two.
    float lv[8], ov[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int s = part + u * P;
      lv[u] = s < ns ? ls[s] : -INFINITY;
      ov[u] = s < ns ? o[static_cast<size_t>(s) * D] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      nan |= isnan(lv[u]);
      mx = fmaxf(mx, lv[u]);
    }
    block_max();
    if (mx != -INFINITY) {
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float w = exp2f(lv[u] - mx);  // 0 for the padding (-inf)
        den += w;
        num += w * ov[u];
      }
    }
  } else {
    for (int s = threadIdx.x; s < ns; s += blockDim.x) {
      const float v = ls[s];
      nan |= isnan(v);
      mx = fmaxf(mx, v);
    }
    block_max();
    if (smem_w) {
      for (int s = threadIdx.x; s < ns; s += blockDim.x) wsm[s] = mx == -INFINITY ? 0.f : exp2f(ls[s] - mx);
      __syncthreads();
      if (mx != -INFINITY) {
        int s = part;
        for (; s + 7 * P < ns; s += 8 * P) {
          float v[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) v[u] = o[static_cast<size_t>(s + u * P) * D];
#pragma unroll
          for (int u = 0; u < 8; ++u) {
            const float w = wsm[s + u * P];
            den += w;
            num += w * v[u];
          }
        }
        for (; s < ns; s += P) {
          const float w = wsm[s];
          den += w;
          num += w * o[static_cast<size_t>(s) * D];
        }
      }
    } else if (mx != -INFINITY) {
#pragma unroll 4
      for (int s = part; s < ns; s += P) {
        const float w = exp2f(ls[s] - mx);
        den += w;
        num += w * o[static_cast<size_t>(s) * D];
      }
    }
  }
  red[part][dl] = num;
  red2[part][dl] = den;
  __syncthreads();
  if (part != 0) return;
  num = den = 0.f;
  for (int p = 0; p < P; ++p) {
    num += red[p][dl];
    den += red2[p][dl];
  }
  MergeWrite<D>(a, row, d, mx, num, den, nan);
}

// The lean merge, for at most kLeanParts partials per row: grid (B * Hq, D / 16), 128
// threads = 16 head dims x 8 parts. Thread (d, p) loads the lse values and partial
// outputs of splits p, p + 8, ... (at most K) in one round and combines them against its
// own max; the 8 parts then meet in shared memory, each rescaled to the row's max. The
// blocks are small (K = 8: 31 registers, ~4 K per block), so with an early trigger they
// fit beside the decode's CTAs and wait there. K = 8 up to 64 partials per row (an H200
// plans 256 splits, 64 partials, for 8 KV heads at batch 1), K = 32 up to kLeanParts.
constexpr int kLeanDims = 16, kLeanP = 8;  // a block: 16 head dims x 8 parts
template <int D, int K>
__global__ void __launch_bounds__(kLeanDims * kLeanP) MergeLeanKernel(const DecodeLaunch a) {
  constexpr int kDl = kLeanDims, kP = kLeanP;
  static_assert(K * kP <= kLeanParts, "K splits per thread");
  __shared__ float sm[kP][kDl], sn[kP][kDl], sd[kP][kDl];
  const int row = blockIdx.x;  // b * Hq + hq
  const int dl = threadIdx.x % kDl, p = threadIdx.x / kDl;
  const int d = blockIdx.y * kDl + dl;
  const int ns = a.ws_parts;
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const float* ls = a.ws_lse + static_cast<size_t>(row) * ns;
  const float* o = a.ws_o + static_cast<size_t>(row) * ns * D + d;
  float lv[K], ov[K];
#pragma unroll
  for (int u = 0; u < K; ++u) {
    const int s = p + u * kP;
    lv[u] = s < ns ? ls[s] : -INFINITY;
    ov[u] = s < ns ? o[static_cast<size_t>(s) * D] : 0.f;
  }
  float m = -INFINITY;
  bool nan = false;
#pragma unroll
  for (int u = 0; u < K; ++u) {
    nan |= isnan(lv[u]);
    m = fmaxf(m, lv[u]);
  }
  float num = 0.f, den = 0.f;
  if (m != -INFINITY) {
#pragma unroll
    for (int u = 0; u < K; ++u) {
      const float w = exp2f(lv[u] - m);  // 0 for the padding and empty splits (-inf)
      den += w;
      num += w * ov[u];
    }
  }
  sm[p][dl] = nan ? __int_as_float(0x7fc00000) : m;
  sn[p][dl] = num;
  sd[p][dl] = den;
  __syncthreads();
  if (p != 0) return;
  float mx = -INFINITY;
#pragma unroll
  for (int q = 0; q < kP; ++q) {
    nan |= isnan(sm[q][dl]);
    mx = fmaxf(mx, sm[q][dl]);
  }
  num = den = 0.f;
  if (mx != -INFINITY) {
#pragma unroll
    for (int q = 0; q < kP; ++q) {
      const float w = exp2f(sm[q][dl] - mx);  // 0 for a part with no split (-inf)
      num += w * sn[q][dl];
      den += w * sd[q][dl];
    }
  }
  MergeWrite<D>(a, row, d, mx, num, den, nan);
}

template <int FMT, int D, int DEC>
cudaError_t Launch(const DecodeLaunch& launch, cudaStream_t stream) {
  using C = Cfg<FMT, D, DEC >= 3 ? 1 : 0>;
  const int smem = C::kSmemPerWarp * kDecodeWarps;
  static bool attr_set = false;  // benign race: setting it twice is harmless
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(DecodeKernel<FMT, D, DEC>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  DecodeLaunch a = launch;
  // A CTA's warps are consecutive splits of one (b, h) when the split count is a multiple
  // of the warps per CTA: the CTA merges them (DecodeKernel's epilogue).
  const int mode = DecodeMergeMode();
  const bool cta_merge = mode == kMergeCta || mode >= kMergeLean;
  a.ws_parts = cta_merge && a.num_splits > 1 && a.num_splits % kDecodeWarps == 0
                   ? a.num_splits / kDecodeWarps
                   : a.num_splits;
  const int total = a.batch * a.num_kv_heads * a.num_splits;
  const int blocks = (total + kDecodeWarps - 1) / kDecodeWarps;
  DecodeKernel<FMT, D, DEC><<<blocks, kDecodeWarps * 32, smem, stream>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || a.ws_parts == 1 || DEC == kReadOnlyVariant) return e;
  // Programmatic dependent launch: the merge grid may be launched while the decode grid's
  // last CTAs finish (or, with the early trigger, while it runs); it waits for them
  // (griddepcontrol.wait) before it reads.
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  if (mode >= kMergeLean && a.ws_parts <= kLeanParts) {
    cudaLaunchConfig_t lc = {};
    lc.gridDim = dim3(static_cast<unsigned>(a.batch * a.num_q_heads), D / kLeanDims);
    lc.blockDim = dim3(kLeanDims * kLeanP);
    lc.stream = stream;
    lc.attrs = attr;
    lc.numAttrs = 1;
    return a.ws_parts <= 8 * kLeanP ? cudaLaunchKernelEx(&lc, MergeLeanKernel<D, 8>, a)
                                    : cudaLaunchKernelEx(&lc, MergeLeanKernel<D, kLeanParts / kLeanP>, a);
  }
  int parts = 1;
  while (parts < a.ws_parts && parts < 32) parts *= 2;
  // split weights in shared memory when they fit the default 48 KB (with the static arrays)
  const int smem_w = a.ws_parts <= 8192 ? 1 : 0;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(a.batch * a.num_q_heads), D / 32);
  cfg.blockDim = dim3(static_cast<unsigned>(32 * parts));
  cfg.dynamicSmemBytes = smem_w ? static_cast<size_t>(a.ws_parts) * 4 : 0;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = mode == kMergePlain ? 0 : 1;
  return cudaLaunchKernelEx(&cfg, MergeKernel<D>, a, smem_w);
}

template <int FMT, int D, int DEC>
int Occupancy() {
  using C = Cfg<FMT, D, DEC >= 3 ? 1 : 0>;
  const int smem = C::kSmemPerWarp * kDecodeWarps;
  cudaFuncSetAttribute(DecodeKernel<FMT, D, DEC>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, DecodeKernel<FMT, D, DEC>, kDecodeWarps * 32,
                                                    smem) != cudaSuccess) {
    return kDecodeWarps;
  }
  return (n > 0 ? n : 1) * kDecodeWarps;  // resident warps per SM
}

}  // namespace

// The one place runtime (format, head_dim, nvfp4 decode variant) become template constants;
// anything else is refused (the host API has already said why).
#define KVT_DECODE_DISPATCH(FN, ...)                                          \
  switch (format * 100000 + head_dim * 100 + (format == kNvfp4 ? variant : 0)) { \
    case 6400: return FN<kNvfp4, 64, 0>(__VA_ARGS__);                         \
    case 12800: return FN<kNvfp4, 128, 0>(__VA_ARGS__);                       \
    case 25600: return FN<kNvfp4, 256, 0>(__VA_ARGS__);                       \
    case 6401: return FN<kNvfp4, 64, 1>(__VA_ARGS__);                         \
    case 12801: return FN<kNvfp4, 128, 1>(__VA_ARGS__);                       \
    case 25601: return FN<kNvfp4, 256, 1>(__VA_ARGS__);                       \
    case 6402: return FN<kNvfp4, 64, 2>(__VA_ARGS__);                         \
    case 12802: return FN<kNvfp4, 128, 2>(__VA_ARGS__);                       \
    case 25602: return FN<kNvfp4, 256, 2>(__VA_ARGS__);                       \
    case 6403: return FN<kNvfp4, 64, 3>(__VA_ARGS__);                         \
    case 12803: return FN<kNvfp4, 128, 3>(__VA_ARGS__);                       \
    case 25603: return FN<kNvfp4, 256, 3>(__VA_ARGS__);                       \
    case 6404: return FN<kNvfp4, 64, 4>(__VA_ARGS__);                         \
    case 12804: return FN<kNvfp4, 128, 4>(__VA_ARGS__);                       \
    case 25604: return FN<kNvfp4, 256, 4>(__VA_ARGS__);                       \
    case 6405: return FN<kNvfp4, 64, 5>(__VA_ARGS__);                         \
    case 12805: return FN<kNvfp4, 128, 5>(__VA_ARGS__);                       \
    case 25605: return FN<kNvfp4, 256, 5>(__VA_ARGS__);                       \
    case 6407: return FN<kNvfp4, 64, 7>(__VA_ARGS__);                         \
    case 12807: return FN<kNvfp4, 128, 7>(__VA_ARGS__);                       \
    case 25607: return FN<kNvfp4, 256, 7>(__VA_ARGS__);                       \
    case 6410: return FN<kNvfp4, 64, 10>(__VA_ARGS__);                        \
    case 12810: return FN<kNvfp4, 128, 10>(__VA_ARGS__);                      \
    case 25610: return FN<kNvfp4, 256, 10>(__VA_ARGS__);                      \
    case 6412: return FN<kNvfp4, 64, 12>(__VA_ARGS__);                        \
    case 12812: return FN<kNvfp4, 128, 12>(__VA_ARGS__);                      \
    case 25612: return FN<kNvfp4, 256, 12>(__VA_ARGS__);                      \
    case 6421: return FN<kNvfp4, 64, 21>(__VA_ARGS__);                        \
    case 12821: return FN<kNvfp4, 128, 21>(__VA_ARGS__);                      \
    case 25621: return FN<kNvfp4, 256, 21>(__VA_ARGS__);                      \
    case 6499: return FN<kNvfp4, 64, kReadOnlyVariant>(__VA_ARGS__);          \
    case 12899: return FN<kNvfp4, 128, kReadOnlyVariant>(__VA_ARGS__);        \
    case 25699: return FN<kNvfp4, 256, kReadOnlyVariant>(__VA_ARGS__);        \
    case 106400: return FN<kFp8, 64, 0>(__VA_ARGS__);                         \
    case 112800: return FN<kFp8, 128, 0>(__VA_ARGS__);                        \
    case 206400: return FN<kBf16, 64, 0>(__VA_ARGS__);                        \
    case 212800: return FN<kBf16, 128, 0>(__VA_ARGS__);                       \
    default: break;                                                           \
  }

cudaError_t LaunchDecode(int format, int head_dim, int variant, const DecodeLaunch& a,
                         cudaStream_t stream) {
  KVT_DECODE_DISPATCH(Launch, a, stream)
  return cudaErrorInvalidValue;
}

int DecodeWarpsPerSm(int format, int head_dim, int variant) {
  KVT_DECODE_DISPATCH(Occupancy)
  return 1;
}

}  // namespace kvtier::kernels::detail
