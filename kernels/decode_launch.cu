// Host side of the paged decode: instantiates DecodeKernel (decode_kernel.cuh) for every
// supported (format, head_dim), launches it and then the split merge (decode_merge.cu),
// and reports its occupancy for the split planner (api.cu).
#include <cuda_runtime.h>

#include "kernels/decode_kernel.cuh"
#include "kernels/internal.h"

namespace kvtier::kernels::detail {
namespace {

template <int FMT, int D, bool READ_ONLY>
cudaError_t Launch(const DecodeLaunch& launch, cudaStream_t stream) {
  using C = Cfg<FMT, D>;
  const int smem = C::kSmemPerWarp * kDecodeWarps;
  static bool attr_set = false;  // benign race: setting it twice is harmless
  if (!attr_set) {
    cudaError_t e = cudaFuncSetAttribute(DecodeKernel<FMT, D, READ_ONLY>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  DecodeLaunch a = launch;
  // A CTA's warps are consecutive splits of one (b, h) when the split count is a multiple
  // of the warps per CTA: the CTA merges them (DecodeKernel's epilogue).
  a.ws_parts = a.num_splits > 1 && a.num_splits % kDecodeWarps == 0 ? a.num_splits / kDecodeWarps
                                                                    : a.num_splits;
  const int total = a.batch * a.num_kv_heads * a.num_splits;
  const int blocks = (total + kDecodeWarps - 1) / kDecodeWarps;
  DecodeKernel<FMT, D, READ_ONLY><<<blocks, kDecodeWarps * 32, smem, stream>>>(a);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || a.ws_parts == 1 || READ_ONLY) return e;
  return LaunchDecodeMerge(D, a, stream);
}

template <int FMT, int D, bool READ_ONLY>
int Occupancy() {
  using C = Cfg<FMT, D>;
  const int smem = C::kSmemPerWarp * kDecodeWarps;
  cudaFuncSetAttribute(DecodeKernel<FMT, D, READ_ONLY>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, DecodeKernel<FMT, D, READ_ONLY>,
                                                    kDecodeWarps * 32, smem) != cudaSuccess) {
    return kDecodeWarps;
  }
  return (n > 0 ? n : 1) * kDecodeWarps;  // resident warps per SM
}

}  // namespace

// The one place runtime (format, head_dim) become template constants; anything else is
// refused (the host API has already said why). The page-read probe reads NVFP4 pages only.
#define KVT_DECODE_DISPATCH(FN, ...)                                     \
  switch (format * 1000 + head_dim) {                                    \
    case 64: return FN<kNvfp4, 64, READ_ONLY>(__VA_ARGS__);              \
    case 128: return FN<kNvfp4, 128, READ_ONLY>(__VA_ARGS__);            \
    case 256: return FN<kNvfp4, 256, READ_ONLY>(__VA_ARGS__);            \
    default: break;                                                      \
  }                                                                      \
  if constexpr (!READ_ONLY) {                                            \
    switch (format * 1000 + head_dim) {                                  \
      case 1064: return FN<kFp8, 64, false>(__VA_ARGS__);                \
      case 1128: return FN<kFp8, 128, false>(__VA_ARGS__);               \
      case 2064: return FN<kBf16, 64, false>(__VA_ARGS__);               \
      case 2128: return FN<kBf16, 128, false>(__VA_ARGS__);              \
      default: break;                                                    \
    }                                                                    \
  }

namespace {
template <bool READ_ONLY>
cudaError_t LaunchAny(int format, int head_dim, const DecodeLaunch& a, cudaStream_t stream) {
  KVT_DECODE_DISPATCH(Launch, a, stream)
  return cudaErrorInvalidValue;
}
template <bool READ_ONLY>
int OccupancyAny(int format, int head_dim) {
  KVT_DECODE_DISPATCH(Occupancy)
  return 1;
}
}  // namespace

cudaError_t LaunchDecode(int format, int head_dim, const DecodeLaunch& a, cudaStream_t stream) {
  return LaunchAny<false>(format, head_dim, a, stream);
}

cudaError_t LaunchDecodeReadProbe(int head_dim, const DecodeLaunch& a, cudaStream_t stream) {
  return LaunchAny<true>(kNvfp4, head_dim, a, stream);
}

int DecodeWarpsPerSm(int format, int head_dim) { return OccupancyAny<false>(format, head_dim); }

}  // namespace kvtier::kernels::detail
