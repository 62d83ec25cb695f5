// Host -> HBM gather copy kernel (gather.cu): used by HbmPool::CopyBatch for promotions
// when the host pool is mapped into the device's address space.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace kvtier::tiers::detail {

// Where a block's bytes go in the arena: byte `off` of the block-major bytes (page
// off / page, byte off % page of it) at dst_off + (off / page) * pitch + off % page. A
// block-major slot is one page of the whole block (page >= bytes, pitch unused); a slot of
// a layer-major slab (tiers/slab_allocator.h AddClass) has the contract's page bytes and
// the slab's layer stride (slots per slab x page).
struct SlotSpan {
  uint64_t dst_off;  // bytes from the arena's base to the block's page 0
  uint64_t pitch;    // bytes between the pages of consecutive layers
  uint32_t page;     // page bytes (block-major: UINT32_MAX)
  uint32_t bytes;    // the block's bytes
};

struct GatherItem {
  const uint8_t* src;  // device-accessible address of the host slot (UVA)
  SlotSpan span;
};

// Items per launch: the arguments travel as kernel parameters (up to 32 KB since CUDA
// 12.1 on Volta and later), so no descriptor buffer has to outlive the launch.
inline constexpr uint32_t kMaxGatherItems = 768;

struct GatherArgs {
  uint8_t* dst_base = nullptr;  // the arena's base
  uint32_t n = 0;
  uint32_t chunks_per_item = 1;  // ceil(max bytes / GatherChunkBytes())
  GatherItem items[kMaxGatherItems];
};

uint32_t GatherChunkBytes();
cudaError_t LaunchGather(const GatherArgs& a, cudaStream_t stream);

}  // namespace kvtier::tiers::detail
