// HostPool: the pinned host tier's arena. One memfd of `slots * slot_bytes` bytes,
// mapped MAP_SHARED and writable here only, and through host_arena_fd() read-only by every
// attached client (the daemon passes the fd with SCM_RIGHTS; a client mmaps it at any
// address and finds slot s at slot_offset(s)). The memfd is sealed with
// F_SEAL_FUTURE_WRITE once this process has mapped it: no other mapping, reopen or
// write(2) can change a byte, so what the daemon checksums, demotes and serves is what it
// wrote itself (a client's block reaches the arena as a copy from its own staging area,
// daemon/staging.h). Slot bytes are a 4 KiB multiple, so every slot is O_DIRECT and DMA
// aligned.
//
// Where a GPU exists (CUDA build + device present) the mapping is registered with
// cudaHostRegister, so host <-> HBM copies run as DMA at PCIe speed (DESIGN.md section 7:
// 55 GB/s registered vs 7.6 GB/s not). The NVMe store registers the same mapping with
// its io_uring as fixed buffers (see NvmeStore::Open's fixed regions), so NVMe <-> host
// needs no bounce copy.
//
// Slot allocation is O(1) (SlotAllocator). Thread-safe: alloc/free take a small lock;
// slot_ptr() is lock-free (the mapping never moves).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

#include "formats/status.h"
#include "tiers/slot_allocator.h"

namespace kvtier::tiers {

struct HostPoolOptions {
  uint64_t slot_bytes = 0;  // bytes per slot; a positive multiple of 4096. Default: 0 (refused)
  uint32_t slots = 0;       // number of slots; > 0. Default: 0 (refused)
  bool cuda_register = true;  // cudaHostRegister when a GPU exists. Default: true
  bool populate = true;     // fault every page in at creation (MAP_POPULATE). Default: true

  Status Validate() const;
};

class HostPool {
 public:
  static StatusOr<std::unique_ptr<HostPool>> Create(const HostPoolOptions& opts);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  int fd() const { return fd_; }
  uint8_t* base() const { return base_; }
  uint64_t arena_bytes() const { return arena_bytes_; }
  uint64_t slot_bytes() const { return opts_.slot_bytes; }
  uint32_t slots() const { return opts_.slots; }
  bool cuda_registered() const { return cuda_registered_; }

  // Byte offset of a slot in the arena (the memfd and every mapping of it).
  uint64_t slot_offset(uint32_t slot) const { return uint64_t{slot} * opts_.slot_bytes; }
  uint8_t* slot_ptr(uint32_t slot) const { return base_ + slot_offset(slot); }

  // nullopt when every slot is taken.
  std::optional<uint32_t> Alloc();
  // Invalid for a slot out of range or already free; nothing changes then.
  Status Free(uint32_t slot);
  bool IsAllocated(uint32_t slot) const;
  uint32_t used() const;
  uint32_t free_count() const;

 private:
  HostPool() = default;
  HostPoolOptions opts_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t arena_bytes_ = 0;
  bool cuda_registered_ = false;
  mutable std::mutex mu_;  // guards alloc_
  SlotAllocator alloc_;
};

}  // namespace kvtier::tiers
