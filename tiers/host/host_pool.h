// HostPool: the pinned host tier's arena. One memfd holding the slots of a SlabAllocator
// (tiers/slab_allocator.h: one or more slot size classes sharing the arena's slabs by
// demand), mapped MAP_SHARED and writable here only, and through host_arena_fd() read-only
// by every attached client (the daemon passes the fd with SCM_RIGHTS, the granule and the
// class sizes in the attach reply; a client mmaps it at any address and finds slot s at
// slot_offset(s) = s * granule). The memfd is sealed with F_SEAL_FUTURE_WRITE once this
// process has mapped it: no other mapping, reopen or write(2) can change a byte, so what
// the daemon checksums, demotes and serves is what it wrote itself (a client's block
// reaches the arena as a copy from its own staging area, daemon/staging.h). Slot sizes and
// offsets are 4 KiB multiples, so every slot is O_DIRECT and DMA aligned.
//
// Where a GPU exists (CUDA build + device present) the mapping is registered with
// cudaHostRegister, so host <-> HBM copies run as DMA at PCIe speed (DESIGN.md section 7:
// 55 GB/s registered vs 7.6 GB/s not). The NVMe store registers the same mapping with
// its io_uring as fixed buffers (see NvmeStore::Open's fixed regions), so NVMe <-> host
// needs no bounce copy.
//
// Slot allocation is O(1) within a slab (SlotAllocator). Thread-safe: alloc/free and the
// slab moves take a small lock; slot_ptr() is lock-free (the mapping never moves).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "formats/status.h"
#include "tiers/slab_allocator.h"

namespace kvtier::tiers {

struct HostPoolOptions {
  uint64_t slot_bytes = 0;  // bytes per slot; a positive multiple of 4096. Default: 0 (refused)
  uint32_t slots = 0;       // number of slots; > 0. Default: 0 (refused)
  // Several slot classes (4 KiB multiples): the arena is `arena_bytes` cut into slabs of
  // `slab_bytes`, each slab holding slots of one class (tiers/slab_allocator.h), and
  // slot_bytes / slots are ignored. Empty: one class, `slots` slots of `slot_bytes` in one
  // slab (slot s at s * slot_bytes). Default: empty
  std::vector<uint64_t> classes;
  uint64_t slab_bytes = kDefaultSlabBytes;  // with classes. Default: 64 MiB
  uint64_t arena_bytes = 0;                 // with classes. Default: 0 (refused)
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
  // The largest slot (of the largest class), the granule (slot s is at s * granule), the
  // ids a slot may have (every slot id is below it) and the classes.
  uint64_t slot_bytes() const { return alloc_.largest(); }
  uint64_t granule() const { return alloc_.granule(); }
  uint32_t id_space() const { return alloc_.id_space(); }
  uint64_t slab_bytes() const { return alloc_.slab_bytes(); }
  uint32_t num_slabs() const { return alloc_.num_slabs(); }
  int num_classes() const { return static_cast<int>(alloc_.num_classes()); }
  uint64_t class_bytes(int cls) const { return alloc_.class_bytes(cls); }
  uint32_t slots_per_slab(int cls) const { return alloc_.slots_per_slab(cls); }
  int ClassFor(uint64_t bytes) const { return alloc_.ClassFor(bytes); }
  // The most slots the arena holds: all of the smallest class.
  uint32_t slots() const { return alloc_.num_slabs() * alloc_.slots_per_slab(0); }
  bool cuda_registered() const { return cuda_registered_; }

  // Byte offset of a slot in the arena (the memfd and every mapping of it): the one place
  // that says where a slot is (SlabAllocator::Offset).
  uint64_t slot_offset(uint32_t slot) const { return alloc_.Offset(slot); }
  uint8_t* slot_ptr(uint32_t slot) const { return base_ + slot_offset(slot); }
  // The size of taken slot `slot` (its slab's class); 0 for an id that is not one.
  uint64_t slot_size(uint32_t slot) const;

  // A slot of class `cls`; nullopt when neither its slabs nor the pool have one.
  std::optional<uint32_t> Alloc(int cls = 0);
  // Invalid for a slot out of range or already free; nothing changes then.
  Status Free(uint32_t slot);
  bool IsAllocated(uint32_t slot) const;
  uint32_t used() const;
  uint32_t used(int cls) const;
  // Slots class `cls` could take without a slab move (SlabAllocator::free_count).
  uint32_t free_count(int cls) const;
  uint32_t capacity(int cls) const;
  uint64_t used_bytes() const;
  uint32_t free_slabs() const;
  uint32_t slabs(int cls) const;
  // Slab moves (SlabAllocator::BeginMove / CancelMove / TakenSlots / SlabClass).
  StatusOr<std::vector<uint32_t>> BeginMove(uint32_t slab, int to);
  void CancelMove(uint32_t slab);
  std::vector<uint32_t> TakenSlots(uint32_t slab) const;
  int SlabClass(uint32_t slab) const;
  bool Draining(uint32_t slab) const;
  uint32_t SlabOf(uint32_t slot) const { return alloc_.SlabOf(slot); }

 private:
  HostPool() = default;
  HostPoolOptions opts_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t arena_bytes_ = 0;
  bool cuda_registered_ = false;
  mutable std::mutex mu_;  // guards alloc_'s state (its geometry is fixed at Create)
  SlabAllocator alloc_;
};

}  // namespace kvtier::tiers
