// The block hash of block_hash.h over HBM slots: each CTA sums the terms of one 32 KiB
// chunk of one slot, adds its sum to the slot's scratch sum atomically, and the last CTA of
// the slot to finish (counted in the slot's scratch counter) applies Finish, writes the hash
// to host-mapped memory and zeroes the scratch for the next launch. Reading HBM at its own
// bandwidth, a batch costs microseconds beside the copies or commits it follows.
#include "tiers/hbm/hash.h"

#include <cuda_runtime.h>

#include "tiers/hbm/block_hash.h"

namespace kvtier::tiers::detail {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;                                                 // lanes per thread
constexpr uint32_t kChunk = kThreads * kUnroll * blockhash::kLaneBytes;   // bytes per CTA (32 KiB)

__global__ void __launch_bounds__(kThreads) HashKernel(const __grid_constant__ HashArgs a) {
  const uint32_t item = blockIdx.x / a.chunks_per_item;
  const uint32_t chunk = blockIdx.x % a.chunks_per_item;
  if (item >= a.n) return;
  const HashItem it = a.items[item];
  const uint32_t bytes = it.span.bytes;
  const uint32_t chunks = bytes == 0 ? 1 : (bytes + kChunk - 1) / kChunk;
  if (chunk >= chunks) return;  // not counted: the slot waits for `chunks` CTAs
  const uint8_t* src = a.base + it.span.dst_off;
  // Byte off of the block-major bytes is at src + (off / page) * pitch + off % page (a
  // layer-major slot, gather.h): the terms are those of the block-major bytes, so the hash
  // equals the CPU's of the same block. Lanes never straddle pages (multiples of 16).
  auto at = [&](uint64_t off) -> const uint8_t* {
    const uint32_t l = static_cast<uint32_t>(off) / it.span.page;
    return src + uint64_t{l} * it.span.pitch + (off - uint64_t{l} * it.span.page);
  };
  const uint64_t lane0 = uint64_t{chunk} * (kChunk / blockhash::kLaneBytes);
  uint64_t acc = 0;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const uint64_t j = lane0 + static_cast<uint64_t>(u) * kThreads + threadIdx.x;
    const uint64_t off = j * blockhash::kLaneBytes;
    if (off + blockhash::kLaneBytes <= bytes) {
      const uint4 v = *reinterpret_cast<const uint4*>(at(off));
      const uint64_t lo = (uint64_t{v.y} << 32) | v.x, hi = (uint64_t{v.w} << 32) | v.z;
      acc += blockhash::Term(lo, hi, j, a.seed);
    } else if (off < bytes) {  // the last, partial lane: zero-padded
      uint64_t w[2] = {0, 0};
      const uint8_t* p = at(off);
      for (uint64_t k = off; k < bytes; ++k) w[(k - off) / 8] |= uint64_t{p[k - off]} << (8 * ((k - off) % 8));
      acc += blockhash::Term(w[0], w[1], j, a.seed);
    }
  }
  for (int d = 16; d > 0; d /= 2) acc += __shfl_down_sync(0xffffffffu, acc, d);
  __shared__ uint64_t warp_sum[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x != 0) return;
  uint64_t total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sum[w];
  atomicAdd(&a.sums[it.slot], static_cast<unsigned long long>(total));
  __threadfence();
  if (atomicAdd(&a.counts[it.slot], 1u) + 1 == chunks) {
    const uint64_t sum = atomicExch(&a.sums[it.slot], 0ull);
    atomicExch(&a.counts[it.slot], 0u);
    a.out[it.slot] = blockhash::Finish(sum, bytes, a.seed);
    __threadfence_system();
  }
}

}  // namespace

uint32_t HashChunkBytes() { return kChunk; }

cudaError_t LaunchHash(const HashArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  HashKernel<<<a.n * a.chunks_per_item, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace kvtier::tiers::detail
