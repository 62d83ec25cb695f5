// Host -> HBM gather copy kernel (gather.cu): used by HbmPool::CopyBatch for promotions
// when the host pool is mapped into the device's address space.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace kvtier::tiers::detail {

struct GatherItem {
  const uint8_t* src;  // device-accessible address of the host slot (UVA)
  uint32_t dst_slot;   // HBM slot
  uint32_t bytes;
};

// Items per launch: the arguments travel as kernel parameters (up to 32 KB since CUDA
// 12.1 on Volta and later), so no descriptor buffer has to outlive the launch.
inline constexpr uint32_t kMaxGatherItems = 1536;

struct GatherArgs {
  uint8_t* dst_base = nullptr;  // HBM slot 0
  uint64_t stride = 0;          // HBM slot s at dst_base + s * stride (the pool's granule)
  uint32_t n = 0;
  uint32_t chunks_per_item = 1;  // ceil(max bytes / GatherChunkBytes())
  GatherItem items[kMaxGatherItems];
};

uint32_t GatherChunkBytes();
cudaError_t LaunchGather(const GatherArgs& a, cudaStream_t stream);

}  // namespace kvtier::tiers::detail
