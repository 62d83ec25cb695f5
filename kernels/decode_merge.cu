// The split merge of the paged decode: combines the per-split partial results (normalized
// O and log2-sum-exp, in the workspace) of each (b, hq) row into the output. Launched by
// decode_launch.cu after the decode grid, with programmatic dependent launch (PDL): the
// merge grid may start while the decode's last CTAs run and waits for them in
// griddepcontrol.wait before it reads.
//   MergeLeanKernel  at most kLeanParts partials per row: small blocks, one round of
//                    loads.
//   MergeKernel      any count: blocks of 32 dims x P parts.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/internal.h"

namespace kvtier::kernels::detail {
namespace {

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

template <int D>
cudaError_t LaunchMerge(const DecodeLaunch& a, cudaStream_t stream) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  if (a.ws_parts <= kLeanParts) {
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
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, MergeKernel<D>, a, smem_w);
}

}  // namespace

cudaError_t LaunchDecodeMerge(int head_dim, const DecodeLaunch& a, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return LaunchMerge<64>(a, stream);
    case 128: return LaunchMerge<128>(a, stream);
    case 256: return LaunchMerge<256>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kvtier::kernels::detail
