// HostPool: the pinned host tier's arena. The slots of SlabAllocators
// (tiers/slab_allocator.h: one or more slot size classes sharing slabs by demand) in memfds
// mapped MAP_SHARED and writable here only, and read-only by clients (the daemon passes
// fds with SCM_RIGHTS, the granule and the class sizes in the attach reply; a client
// mmaps them and finds slot s at slot_offset(s) = s * granule). Each memfd is sealed with
// F_SEAL_FUTURE_WRITE once this process has mapped it: no other mapping, reopen or
// write(2) can change a byte, so what the daemon checksums, demotes and serves is what it
// wrote itself (a client's block reaches the arena as a copy from its own staging area,
// daemon/staging.h). Slot sizes and offsets are 4 KiB multiples, so every slot is
// O_DIRECT and DMA aligned.
//
// Parts. Without HostPoolOptions::part_shares the arena is one memfd (the common pool),
// every client of a daemon without tenants maps it. With them (a daemon with [[tenants]]:
// docs/security.md, "Memory isolation") the arena is cut into parts laid back to back:
// part p (of one owner: a tenant with a host share) of its share of the arena, then the
// common pool, the rest. Each part is a memfd of its own, with a SlabAllocator of its own,
// mapped here at its offset in one reservation, so slot ids, slot_offset() and the
// daemon's view are one arena as before. A part's owner's clients get its fd (and no
// other), so they read their own blocks where they lie; the common pool goes to no
// client. Alloc(cls, part) takes from the part first, then from the common pool; a part
// never holds another owner's slot, so a mapping of it shows its owner's blocks only.
//
// Where a GPU exists (CUDA build + device present) each part's mapping is registered
// with cudaHostRegister, so host <-> HBM copies run as DMA at PCIe speed (DESIGN.md
// section 7: 55 GB/s registered vs 7.6 GB/s not); a slot never straddles two parts. The
// NVMe store registers the same mappings with its io_uring as fixed buffers (see
// NvmeStore::Open's fixed regions: one per part), so NVMe <-> host needs no bounce copy.
//
// Slot allocation is O(1) within a slab (SlotAllocator). Thread-safe: alloc/free and the
// slab moves take a small lock; slot_ptr() is lock-free (the mapping never moves).
#pragma once

#include <atomic>
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
  // Classes made at registration (TierManagerOptions::classes_at_registration): the arena is
  // `arena_bytes` in slabs of `slab_bytes` on the granule AutoGranule(arena_bytes), with no
  // class until AddClass makes one; `classes` must be empty, and slot_bytes is the largest
  // block (a class may be up to a slab). Default: false
  bool classes_at_registration = false;
  uint64_t slab_bytes = kDefaultSlabBytes;  // with classes. Default: 64 MiB
  uint64_t arena_bytes = 0;                 // with classes. Default: 0 (refused)
  bool cuda_register = true;  // cudaHostRegister when a GPU exists. Default: true
  bool populate = true;     // fault every page in at creation (MAP_POPULATE). Default: true
  // Owned parts, in order from offset 0: part p holds floor(part_shares[p] * slots) slots
  // (one class) or floor(part_shares[p] * slabs) slabs (classes) in a memfd of its own;
  // the rest is the common pool. Each in [0, 1], their sum at most 1; a part that rounds
  // to nothing has no memfd. Empty: the whole arena is the common pool. Default: empty
  std::vector<double> part_shares;

  Status Validate() const;
};

class HostPool {
 public:
  static StatusOr<std::unique_ptr<HostPool>> Create(const HostPoolOptions& opts);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // The arena's memfd when it is one (no parts); -1 with parts (part_fd).
  int fd() const { return regions_.size() == 1 ? regions_[0].fd : -1; }
  uint8_t* base() const { return base_; }
  uint64_t arena_bytes() const { return arena_bytes_; }
  // The largest slot (of the largest class), the granule (slot s is at s * granule), the
  // ids a slot may have (every slot id is below it) and the classes.
  uint64_t slot_bytes() const { return any().largest(); }
  uint64_t granule() const { return granule_; }
  uint32_t id_space() const { return static_cast<uint32_t>(arena_bytes_ / granule_); }
  // Slabs are numbered over the parts in order (a part of one class is one slab).
  uint64_t slab_bytes() const { return uniform() ? arena_bytes_ : opts_.slab_bytes; }
  uint32_t num_slabs() const { return num_slabs_; }
  int num_classes() const { return classes_.load(std::memory_order_acquire); }
  // Classes made at registration: the class of slots of `bytes` rounded up to the granule
  // (SlabAllocator::AddClass(bytes) in every part: the same index in each), the existing
  // one or a new one. Invalid, and nothing changes, for 0 or more than a slab, or past
  // kMaxArenaClasses. Without classes_at_registration: the class of exactly those bytes,
  // Invalid when there is none.
  StatusOr<int> AddClass(uint64_t bytes);
  uint64_t class_bytes(int cls) const { return any().class_bytes(cls); }
  uint32_t slots_per_slab(int cls) const { return any().slots_per_slab(cls); }
  int ClassFor(uint64_t bytes) const { return any().ClassFor(bytes); }
  // The most slots of class `cls` the arena holds (every slab of it).
  uint32_t most(int cls) const;
  // The most slots the arena holds: all of the smallest class (classes made at
  // registration, none yet: of slot_bytes, the largest block).
  uint32_t slots() const;
  bool cuda_registered() const { return cuda_registered_; }

  // Parts (HostPoolOptions::part_shares): owned parts 0..num_parts()-1, then the common
  // pool, part num_parts(). A part's memfd (-1 for a part of no slot), offset and bytes.
  int num_parts() const { return static_cast<int>(regions_.size()) - 1; }
  int part_fd(int p) const { return regions_[static_cast<size_t>(p)].fd; }
  uint64_t part_offset(int p) const { return regions_[static_cast<size_t>(p)].offset; }
  uint64_t part_bytes(int p) const { return regions_[static_cast<size_t>(p)].bytes; }
  // The part slot (or slab) id lies in; the common pool's index for ids past the arena.
  int PartOfSlot(uint32_t slot) const { return regions_.size() == 1 ? 0 : RegionOf(slot); }
  int PartOfSlab(uint32_t slab) const;

  // Byte offset of a slot in the arena (the memfd and every mapping of it): the one place
  // that says where a slot is (SlabAllocator::Offset).
  uint64_t slot_offset(uint32_t slot) const { return uint64_t{slot} * granule_; }
  uint8_t* slot_ptr(uint32_t slot) const { return base_ + slot_offset(slot); }
  // The size of taken slot `slot` (its slab's class); 0 for an id that is not one.
  uint64_t slot_size(uint32_t slot) const;

  // A slot of class `cls`: from part `part`'s slabs first, then from the common pool's
  // (part < 0 or the common pool's index: the common pool only); nullopt when neither has
  // one without a slab move.
  std::optional<uint32_t> Alloc(int cls = 0, int part = -1);
  // Invalid for a slot out of range or already free; nothing changes then.
  Status Free(uint32_t slot);
  bool IsAllocated(uint32_t slot) const;
  uint32_t used() const;
  uint32_t used(int cls) const;
  // Slots class `cls` could take without a slab move (SlabAllocator::free_count), over the
  // whole arena, or for an alloc of part `part` (its part and the common pool).
  uint32_t free_count(int cls) const;
  uint32_t free_count(int cls, int part) const;
  uint32_t capacity(int cls) const;
  uint64_t used_bytes() const;
  uint32_t free_slabs() const;
  uint32_t slabs(int cls) const;
  // Slab moves (SlabAllocator::BeginMove / CancelMove / TakenSlots / SlabClass), by the
  // arena's slab number; a slab stays in its part.
  StatusOr<std::vector<uint32_t>> BeginMove(uint32_t slab, int to);
  void CancelMove(uint32_t slab);
  std::vector<uint32_t> TakenSlots(uint32_t slab) const;
  int SlabClass(uint32_t slab) const;
  bool Draining(uint32_t slab) const;
  uint32_t SlabOf(uint32_t slot) const;

 private:
  // One part: its memfd, where it lies, and its allocator (ids and slabs local to it).
  struct Region {
    int fd = -1;
    uint64_t offset = 0, bytes = 0;
    uint32_t first_id = 0, ids = 0;  // its slot ids: [first_id, first_id + ids)
    uint32_t first_slab = 0;
    bool cuda = false;  // its mapping is cudaHostRegister'ed
    std::optional<SlabAllocator> alloc;  // none for a part of no slot
  };
  HostPool() = default;
  const SlabAllocator& any() const { return *regions_[live_].alloc; }
  bool uniform() const { return opts_.classes.empty() && !opts_.classes_at_registration; }
  int RegionOf(uint32_t id) const;
  int RegionOfSlab(uint32_t slab) const;
  HostPoolOptions opts_;
  uint8_t* base_ = nullptr;
  uint64_t arena_bytes_ = 0, granule_ = 0;
  uint32_t num_slabs_ = 0;
  size_t live_ = 0;  // a region with an allocator (they share granule and classes)
  // The allocators' classes, published after AddClass made one in every part (readers of
  // the geometry hold no lock; an allocator never moves a class).
  std::atomic<int> classes_{0};
  bool cuda_registered_ = false;
  mutable std::mutex mu_;  // guards the allocators' state (the geometry is fixed at Create)
  std::vector<Region> regions_;  // owned parts, then the common pool
};

}  // namespace kvtier::tiers
