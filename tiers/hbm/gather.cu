// Host -> HBM gather copy: one kernel launch moves a whole batch of blocks from pinned
// host slots (mapped into the device's address space) into HBM slots.
//
// Why a kernel and not the copy engines: a KV block of a small model is ~150 KB (8 layers
// x 16 tokens of NVFP4), and the DMA engines pay a per-copy setup that is as long as the
// transfer itself: on the H200, cudaMemcpyAsync per block reached 0.33 of one large
// cudaMemcpy and cudaMemcpyBatchAsync 0.49 (docs/tiers.md). SM loads over PCIe have no
// per-block cost; with enough loads in flight they reach the link's bandwidth.
#include "tiers/hbm/gather.h"

#include <cuda_runtime.h>

namespace kvtier::tiers::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;                                    // 16-byte loads in flight per thread
constexpr uint32_t kChunk = kThreads * kUnroll * 16;          // bytes per CTA (32 KiB)

__global__ void __launch_bounds__(kThreads) GatherKernel(const __grid_constant__ GatherArgs a) {
  const uint32_t item = blockIdx.x / a.chunks_per_item;
  const uint32_t chunk = blockIdx.x % a.chunks_per_item;
  if (item >= a.n) return;
  const GatherItem it = a.items[item];
  const uint32_t bytes = it.span.bytes;
  const uint64_t begin = uint64_t{chunk} * kChunk;
  if (begin >= bytes) return;
  const uint64_t end = begin + kChunk < bytes ? begin + kChunk : bytes;
  const uint8_t* src = it.src;
  uint8_t* dst = a.dst_base + it.span.dst_off;
  // Byte off of the block lands at dst + (off / page) * pitch + off % page: a 16-byte
  // chunk never straddles two pages (pages are multiples of 16).
  auto at = [&](uint64_t off) -> uint8_t* {
    const uint32_t l = static_cast<uint32_t>(off) / it.span.page;
    return dst + uint64_t{l} * it.span.pitch + (off - uint64_t{l} * it.span.page);
  };
  const uint64_t vec_end = begin + ((end - begin) & ~uint64_t{15});
  uint4 v[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint64_t off = begin + (static_cast<uint64_t>(u) * kThreads + threadIdx.x) * 16;
    if (off < vec_end) v[u] = *reinterpret_cast<const uint4*>(src + off);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint64_t off = begin + (static_cast<uint64_t>(u) * kThreads + threadIdx.x) * 16;
    if (off < vec_end) *reinterpret_cast<uint4*>(at(off)) = v[u];
  }
  for (uint64_t off = vec_end + threadIdx.x; off < end; off += kThreads) *at(off) = src[off];
}

}  // namespace

uint32_t GatherChunkBytes() { return kChunk; }

cudaError_t LaunchGather(const GatherArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  const uint32_t blocks = a.n * a.chunks_per_item;
  GatherKernel<<<blocks, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kvtier::tiers::detail
