// The block hash on the GPU (hash.cu): one launch hashes a batch of HBM slots with the
// function of block_hash.h and writes each slot's hash to host-mapped memory. Used by
// HbmPool::HashSlots (commits) and by HbmPool::CopyBatch after a promotion's copies.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "tiers/hbm/gather.h"

namespace kvtier::tiers::detail {

struct HashItem {
  uint32_t slot;  // HBM slot (indexes the scratch and the output)
  uint32_t pad;
  SlotSpan span;  // where its bytes lie (gather.h): hashed in block-major order
};

// Items per launch: the arguments travel as kernel parameters (up to 32 KB since CUDA
// 12.1 on Volta and later), like GatherArgs.
inline constexpr uint32_t kMaxHashItems = 960;

struct HashArgs {
  const uint8_t* base = nullptr;        // the arena's base
  uint64_t seed = 0;                    // block_hash.h
  unsigned long long* sums = nullptr;   // [slot ids] device scratch: 0 before and after a launch
  unsigned int* counts = nullptr;       // [slot ids] device scratch: 0 before and after a launch
  unsigned long long* out = nullptr;    // [slot ids] host-mapped: the hash of each item's slot
  uint32_t n = 0;                       // items; their slots are distinct
  uint32_t chunks_per_item = 1;         // ceil(max bytes / HashChunkBytes())
  HashItem items[kMaxHashItems];
};

uint32_t HashChunkBytes();
cudaError_t LaunchHash(const HashArgs& a, cudaStream_t stream);

}  // namespace kvtier::tiers::detail
