// The fused paged decode attention kernel over NVFP4, FP8 or BF16 pages (one query token
// per sequence), for sm_90 with mma.sync tensor-core instructions. Included by
// decode_launch.cu, the one translation unit that instantiates and launches it; the
// design and its measurements are in docs/kernels.md. Internal to kernels/.
//
// Work: one warp per (sequence b, KV head h, split s); a split is a run of `chunk` tokens
// (a multiple of 16). The warp streams its tokens 16 at a time (a "subtile", never
// crossing a page since T is a multiple of 16) through a private shared-memory ring
// filled by cp.async (Cfg::kStages subtiles deep), so many bytes are in flight per SM
// without holding them in registers.
//
// Per subtile, in registers:
//   S^T[16 tokens x 8 queries] = K[16 x D] . Q^T   (m16n8k16, K is the A operand,
//                                                   the GQA group's queries are N)
//   online softmax on S (fp32, exp2), P^T moved to B-operand layout by movmatrix
//   O^T[D x 8] += V^T[D x 16] . P^T                (V^T is the A operand)
// Queries beyond the group size are zero columns and are not written.
//
// Two paths, chosen by the page format:
//   NVFP4, the pair path: the online softmax runs over 32 tokens (two subtiles) per step;
//     the QK product is two independent HMMA chains; full pairs run without branches
//     (the last, partial pair runs the general step once); the block table is read two
//     subtiles ahead and an entry is checked by one 32-bit compare; every copy and
//     shared-memory address is a per-lane offset computed once; the running max is lazy
//     (it moves only when a score passes it by kLazySlack).
//   FP8 and BF16, the subtile path: one subtile per softmax step, a plain cp.async issue.
// With READ_ONLY (NVFP4 only) the kernel is the page-read probe (kvt_decode_read_probe):
// the pair path's copies over the same bytes, no arithmetic, no output.
//
// Splits: each warp ends with (running max, denominators, O) of its split. When the split
// count is a multiple of the 4 warps per CTA, the CTA's warps hold consecutive splits of
// one (b, h) and warp 0 merges them (one partial per CTA, or the output itself when the
// CTA covers the sequence); the merge kernel (decode_merge.cu), launched with PDL,
// combines the rest.
//
// NVFP4 values are decoded in registers from whole 32-bit words straight to fp16 *without*
// the exponent-bias multiply: a word is spread into clean fp16 high bytes (e2m1_spread) and
// each half2 is one PRMT, holding e2m1 * 2^-14 (subnormal for 0.5). Multiplying by the
// E4M3 block scale (converted exactly by cvt.f16x2.e4m3x2) is then exact in fp16 (the
// product's lowest bit is >= 2^-24, the fp16 subnormal step), and the 2^14 and the
// per-layer scales are folded into the fp32 score scale and the output. The order of
// head_dim inside a thread's registers is permuted to match whole loaded words; Q is
// loaded in the same permuted order (a dot product does not care).
#pragma once

#include <type_traits>

#include "kernels/decode_device.cuh"

namespace kvtier::kernels::detail {
namespace {

template <int FMT, int D, bool READ_ONLY = false>
__global__ void __launch_bounds__(kDecodeWarps * 32, D >= 256 ? 2 : 4)
    DecodeKernel(const DecodeLaunch a) {
  static_assert(!READ_ONLY || FMT == kNvfp4, "the page-read probe reads NVFP4 pages");
  // The pair path (NVFP4) or the subtile path (FP8, BF16); see the top of this file.
  constexpr bool kPairs = FMT == kNvfp4;
  constexpr bool kReadOnly = READ_ONLY;
  using C = Cfg<FMT, D>;
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
  const uint8_t* pool = a.pool;
  const uint32_t head_rows = static_cast<uint32_t>(h * a.block_tokens);
  // The subtile path's issue (FP8, BF16: no scales).
  auto issue_subtile = [&](int j) {
    static_assert(kPairs || C::kSc == 0, "the subtile path copies pages without block scales");
    const int t0 = t_begin + 16 * j;
    // One uniform load per subtile (cached); checked before any byte of the page is read.
    const int32_t slot = __ldg(bt + (t0 >> a.log2_block_tokens));
    bool in_slab = true;
    const uint64_t page_off = a.map.Page(static_cast<uint32_t>(slot), in_slab);
    if (slot < 0 || static_cast<uint64_t>(slot) >= a.num_slots || !in_slab) bad |= kErrSlotRange;
    if (bad) return;  // never touch memory through a refused entry
    const uint8_t* page = pool + page_off;
    const uint32_t row0 = head_rows + static_cast<uint32_t>(t0 & (a.block_tokens - 1));
    const uint8_t* kd = page + a.k_data + row0 * C::kRow;
    const uint8_t* vd = page + a.v_data + row0 * C::kRow;
    const uint32_t st = ring_s + (j % C::kStages) * C::kStage;
    // K and V data: kRow chunks each (16 rows x kRow bytes), lane-strided; the region of
    // every copy is known at compile time.
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
  };

  // The pair path's issue: the same copies plus the block scales, with the per-lane parts
  // of every address (region offsets, lane chunk, V swizzle, which side's scales) computed
  // once, 32-bit offsets from one 64-bit page pointer, the ring slot passed in (no %
  // kStages), and the scale copies and the refusal as predicates instead of branches.
  constexpr int kDataIt = C::kRow / 32;  // 16-byte data chunks per lane and side
  uint32_t o_gk = 0, o_gv = 0, o_gs = 0, o_ds = 0;
  uint32_t o_dv[kDataIt];
  bool o_ps = false;
  if constexpr (kPairs) {
    static_assert(2 * C::kSc <= 32, "scale chunks must fit one lane pass");
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
  // The block-table entry of subtile jj (0 past the split's end); the index by an unsigned
  // shift (no sign extension).
  auto bt_entry = [&](int jj) -> int32_t {
    return jj < n_sub ? __ldg(bt + (static_cast<uint32_t>(t_begin + 16 * jj) >> a.log2_block_tokens)) : 0;
  };
  // The pair path reads the entry of each subtile two issues ahead (its load does not
  // stall the cp.async issue): the entries of the next two subtiles to issue.
  int32_t pf0 = 0, pf1 = 0;
  if constexpr (kPairs) {
    pf0 = bt_entry(0);
    pf1 = bt_entry(1);
  }
  // Subtiles are issued in order j = 0, 1, 2, ... The entry is checked by one 32-bit
  // compare (num_slots32; a negative entry is >= 2^31 as uint32), and the page address
  // is taken from the entry as loaded: a refused entry's copies are predicated off.
  auto issue_pair = [&](int j, uint32_t st) {
    const int t0 = t_begin + 16 * j;
    const bool want = j < n_sub;
    const int32_t slot = pf0;
    pf0 = pf1;
    pf1 = bt_entry(j + 2);
    bool ok = static_cast<uint32_t>(slot) < a.num_slots32;
    const uint64_t page_off = a.map.Page(static_cast<uint32_t>(slot), ok);
    if (!ok) bad |= kErrSlotRange;
    const bool go = want && !bad;  // never touch memory through a refused entry
    const uint8_t* page = pool + page_off;
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

#pragma unroll
  for (int j = 0; j < C::kStages - (kPairs ? 2 : 1); ++j) {
    if constexpr (kPairs) {
      issue_pair(j, ring_s + j * C::kStage);
    } else {
      if (j < n_sub) issue_subtile(j);
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
      qv[i][e] = gid < a.group ? bf16_to_float(qrow[KDim<FMT>(i, e)]) : 0.f;
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
  // The pair path folds qk_scale into the exp2 argument, which needs qk_scale >= 0 (the
  // max of the scaled scores is then the scaled max): a negative softmax scale negates Q.
  if constexpr (kPairs) {
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
  // The pair path's lazy max: how far (log2 units) a score may pass the running max before the max moves;
  // P <= 2^kLazySlack = 256 stays far inside fp16.
  constexpr float kLazySlack = 8.f;
  // Undo the power of two of the raw NVFP4 decode (2^-14).
  const float fmt_k = FMT == kNvfp4 ? 16384.f : 1.f;
  const float qk_scale = a.softmax_scale * kLog2e * a.k_scale_f * fmt_k / qmul;
  const float v_factor = a.v_scale_f * fmt_k;

  float acc[D / 16][4];
#pragma unroll
  for (int m = 0; m < D / 16; ++m) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.f;
  float mrun[2] = {-1e30f, -1e30f};  // running max (log2 units) of query cols 2tq, 2tq+1
  float lrun[2] = {0.f, 0.f};        // this thread's partial denominators

  // The pair path's per-lane K data / K scale offsets (row gid; row gid+8 is an immediate
  // away).
  const uint32_t k_lane = kPairs ? C::kKData + gid * C::kRow + tq * (C::kRow / 4) : 0;
  const uint32_t ks_lane = kPairs ? C::kKSc + gid * C::kSc + tq * (D / 64) : 0;
  // ---- K rows gid and gid+8 of the subtile at `st` -> A fragments; S^T = K . Q^T -----
  auto qk = [&](const uint32_t st, float (&s)[4]) {
    s[0] = s[1] = s[2] = s[3] = 0.f;
    {
      uint32_t kr[2][C::kRegs];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = gid + 8 * r;
        uint32_t w[C::kKWords];
        if constexpr (kPairs) {
          lds<C::kKWords>(st + k_lane + r * 8 * C::kRow, w);
        } else {
          lds<C::kKWords>(st + C::kKData + row * C::kRow + tq * (C::kRow / 4), w);
        }
        if constexpr (FMT == kNvfp4) {
          constexpr int kG = D / 64;  // scale groups per thread-row
          const uint32_t sa = st + ks_lane + r * 8 * C::kSc;
          uint32_t sfb[kG];
          // kG >= 2: sfb[g] holds the pair of groups (g & ~1, g | 1), and the multiply
          // broadcasts the half it needs (hmul2_bcast).
          if constexpr (kG == 1) {
            const uint32_t x = lds_u8(sa);
            sfb[0] = e4m3x2_to_f16x2(x | (x << 8));
          } else if constexpr (kG == 2) {
            sfb[0] = sfb[1] = e4m3x2_to_f16x2(lds_u16(sa));
          } else {
            static_assert(kG == 4);
            uint32_t x[1];
            lds<1>(sa, x);
            sfb[0] = sfb[1] = e4m3x2_to_f16x2(x[0]);
            sfb[2] = sfb[3] = e4m3x2_to_f16x2(x[0] >> 16);
          }
#pragma unroll
          for (int wi = 0; wi < C::kKWords; ++wi) {
            const uint32_t sc = sfb[wi / 2];
            if constexpr (kG >= 2) {
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
            } else {
              uint32_t ev, od;
              e2m1_spread(w[wi], ev, od);
              kr[r][4 * wi + 0] = hmul2(hibytes<0, 1>(ev), sc);  // nibbles 0, 2
              kr[r][4 * wi + 1] = hmul2(hibytes<2, 3>(ev), sc);  // 4, 6
              kr[r][4 * wi + 2] = hmul2(hibytes<0, 1>(od), sc);  // 1, 3
              kr[r][4 * wi + 3] = hmul2(hibytes<2, 3>(od), sc);  // 5, 7
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
      if constexpr (kPairs) {
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
  uint32_t v_lane = 0, vs_lane = 0;  // the pair path's per-lane V data / V scale offsets
  if constexpr (kPairs) {
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
        if constexpr (kPairs) {
          // (ta >> 1) & mask == tq & mask for both rows of every pair (ta = 2 tq + 8 pr)
          const uint32_t va = st + v_lane + pr * 8 * C::kRow;
          lds<C::kVWords>(va, wa);
          lds<C::kVWords>(va + C::kRow, wb);
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
          uint32_t spair[kVG];
#pragma unroll
          for (int g = 0; g < kVG; ++g) {
            const uint32_t vs = st + vs_lane + pr * 8 * C::kSc + g;
            uint32_t sa = lds_u8(vs);
            uint32_t sb = lds_u8(vs + C::kSc);
            if (tail) {  // a stale scale byte may be 0x7F (NaN): 0 * NaN would poison O
              sa = t0 + ta >= t_end ? 0u : sa;
              sb = t0 + ta + 1 >= t_end ? 0u : sb;
            }
            // the two bytes side by side with one PRMT (cvt reads the low 16 bits)
            spair[g] = e4m3x2_to_f16x2(prmt(sa, sb, 0x0040));
          }
#pragma unroll
          for (int w = 0; w < C::kVWords; ++w) {
            const uint32_t sc = spair[(8 * w) / 16];
            const uint32_t x0 = prmt(wa[w], wb[w], 0x5410);  // dims 8w..8w+3
            const uint32_t x1 = prmt(wa[w], wb[w], 0x7632);  // dims 8w+4..8w+7
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
  // One 32-token softmax step over subtiles j (ring slot `sta`) and j+1 (`stb`), j+1
  // possibly past the split's end (has2) and tokens >= t_end masked (tail): the pair
  // path's last, partial pair.
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

  // The pair path's building blocks: QK of a full pair (one basic block), the softmax
  // step with qk_scale folded into one FFMA per score (qk_scale >= 0, so the scaled max
  // is qk_scale * the max), PV of a full pair.
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
    {
      // The lazy running max: it stays while no score passes it by more than kLazySlack
      // (log2 units): one vote instead of the 3-round shuffle max, the alpha exp2s and
      // the rescale vote. Every lane keeps the same max (it only moves in the
      // warp-uniform slow path, after the full reduction), and P <= 2^kLazySlack fits
      // fp16. O and l are exact for any reference max.
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
    }
  };
  auto pv_pair = [&](const uint32_t sta, const uint32_t stb, const uint32_t (&pb)[4]) {
    pv(sta, 0, false, pb[0], pb[1]);
    pv(stb, 0, false, pb[2], pb[3]);
  };
  auto nxt = [](int x) { return x + 1 == C::kStages ? 0 : x + 1; };
  // Subtiles in full pairs (no token of them is >= t_end).
  const int n_full = n_sub > 0 ? ((t_end - t_begin) >> 5) * 2 : 0;

  if constexpr (kPairs) {
    // Full pairs: no has2 / tail / masking, so both subtiles' QK (and both PVs) are one
    // basic block each. The last, partial pair (at most 2 subtiles) runs pair_step.
    int rs = 0, ws = C::kStages - 2;  // ring slots of subtile j and of j + kStages - 2
    int j = 0;
    for (; j < n_full; j += 2) {
      issue_pair(j + C::kStages - 2, ring_s + ws * C::kStage);
      cp_commit();
      ws = nxt(ws);
      issue_pair(j + C::kStages - 1, ring_s + ws * C::kStage);
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
  } else {
    // The subtile path: one online-softmax step per subtile.
    for (int j = 0; j < n_sub; ++j) {
      if (j + C::kStages - 1 < n_sub) issue_subtile(j + C::kStages - 1);
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

}  // namespace
}  // namespace kvtier::kernels::detail
