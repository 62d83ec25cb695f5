// SlabAllocator: slots of several sizes (slot size classes) in one arena, the arena's bytes
// going to whichever class needs them (the slab allocator of CacheLib and memcached).
//
// Why classes. A block of a Llama-3-8B contract at 16-token NVFP4 blocks is 576 KiB, one
// of an 80-layer model 1440 KiB. With one slot size per daemon the first fills 40% of its
// slot. With classes each contract's blocks take slots of the smallest class that holds
// them, so two models of different block sizes share one arena and each pays at most the
// gap between its block and its class, plus the tail of a slab.
//
// Slabs. The arena is cut into slabs of `slab_bytes` (64 MiB by default). A slab is free
// (in the pool) or belongs to one class and holds floor(slab_bytes / class bytes) slots of
// it, back to back from the slab's start; the rest of the slab is the class's waste (64 MiB
// holds 113 slots of 576 KiB, 448 KiB or 0.68% left over, and 45 of 1440 KiB, 736 KiB or
// 1.12%). A class that needs a slot takes one from a slab of its own with room, else a
// free slab from the pool (lowest first). A slab whose last slot is freed goes back to the
// pool, so bytes follow demand without any fixed share.
//
// Moves. When a class needs a slot and neither its slabs nor the pool have one, its owner
// (the TierManager) either evicts a block of the class, or moves a slab from another class
// to it: BeginMove(slab, cls) stops allocation from the slab and returns its taken slots;
// the owner evicts their blocks, and the Free of the last one hands the slab to `cls`
// (not to the pool). The rule for when to move (which class is starved) is the owner's:
// this class is only the bookkeeping.
//
// Slot ids. A slot id is its offset in the arena divided by the granule:
//   offset(id) = id * granule
// The granule is the greatest common divisor of slab_bytes and every class size, so every
// slot starts on one; it is a 4 KiB multiple, since sizes are (O_DIRECT and DMA alignment).
// An arena whose classes are made later (MakeOnGranule, AddClass(bytes)) takes its granule
// at start instead (AutoGranule: from the arena's size alone), and every class is a
// multiple of it.
// 64 MiB slabs of 576 KiB and 1440 KiB slots have a 32 KiB granule. The mapping never
// changes at run time: a client needs the granule (attach reply) and its contract's class
// size, never the slab table. Tables indexed by slot id have id_space() = arena / granule
// entries; only the ids of slot starts are used.
//
// One class in one slab of the whole arena is the arena of equal slots it replaces: the
// granule is the slot size, slot ids are 0..n-1, and allocation is the SlotAllocator's
// next-fit.
//
// Not thread-safe: the owner (HostPool) holds its lock.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "formats/status.h"
#include "tiers/slot_allocator.h"

namespace kvtier::tiers {

inline constexpr size_t kMaxSlotClasses = 4;
// Classes of an arena at most, those added by AddClass included (block-major classes made
// as contracts register, and the HBM tier's (size, page bytes) classes, one per geometry
// of the contracts it holds).
inline constexpr size_t kMaxArenaClasses = 64;
inline constexpr uint64_t kDefaultSlabBytes = 64ull << 20;

// Classes made at registration (TierManagerOptions::classes_at_registration): the
// granule is fixed when the arena is made, from its size alone, so that it never depends
// on which contracts come later, and every class is a block's bytes rounded up to it.
//
// The granule is 4 KiB x 2^k, the smallest such that the arena has at most
// kMaxGranuleIds slot ids (tables indexed by slot id cost ~24 B an id in every tier, ~29 B
// more in HBM), and at most kMaxGranule: 4 KiB up to a 16 GiB arena, 32 KiB for 100 GiB,
// 64 KiB above 128 GiB. A block pays at most a granule less 1 byte of rounding: 648 KiB
// (36 layers of 16-token NVFP4 blocks) takes 704 KiB at 64 KiB, 8.6%.
inline constexpr uint64_t kMinGranule = 4096;
inline constexpr uint64_t kMaxGranule = 64ull << 10;
inline constexpr uint64_t kMaxGranuleIds = 4ull << 20;
uint64_t AutoGranule(uint64_t arena_bytes);
// The largest block a contract may have by default (tiers.slot_bytes in "auto" mode names
// this limit): every slab holds one.
inline constexpr uint64_t kDefaultMaxBlockBytes = 64ull << 20;
// The slab size of an arena whose classes are made at registration, for slots of at most
// `max_block` bytes (NVMe: the largest record, 4 KiB more): a slab must hold the largest
// slot, and the tail a slab leaves (less than one slot) is a smaller share of a larger
// slab. So: 4 x max_block when the arena holds 16 such slabs (256 MiB slabs from a 4 GiB
// arena at the default 64 MiB limit), else 2 x max_block when it holds 4 of those, else
// max_block; an arena smaller than max_block is one slab of itself (and its blocks are
// limited to it). Always a multiple of `granule` (max_block is rounded up to it, the arena
// down). At 2 x max_block or more, every block of 576 KiB to 20 MiB loses at most 6.7% to
// its slab's tail (3 slots of 20 MiB in 64 MiB), with the 64 KiB granule's rounding at most
// 8.8%, and NVMe records (4 KiB more than the block) at most 6.7% (docs/tiers.md "Slot
// arenas"). At max_block itself an NVMe slab of 64 MiB + 4 KiB holds 7 records of 8 MiB +
// 4 KiB (14% over), so a small NVMe tier pays more.
uint64_t AutoSlabBytes(uint64_t arena_bytes, uint64_t max_block, uint64_t granule);

class SlabAllocator {
 public:
  SlabAllocator() = default;
  // `arena_bytes` cut into slabs of `slab_bytes` (a 4 KiB multiple; the arena's tail past
  // the last whole slab is not used) shared by classes of the given sizes (4 KiB multiples,
  // distinct, 1 to kMaxSlotClasses, any order; each at most slab_bytes). Invalid, naming
  // `what`, otherwise, or when the arena holds no slab.
  static StatusOr<SlabAllocator> Make(const std::string& what, uint64_t arena_bytes, uint64_t slab_bytes,
                                      std::vector<uint64_t> class_bytes);
  // An arena whose classes are made later (AddClass(bytes)), on a granule fixed now:
  // `granule` a power-of-two multiple of 4 KiB dividing `slab_bytes`; `class_bytes` (may be
  // empty) are made at once, each a multiple of the granule no larger than a slab, at most
  // kMaxArenaClasses. Invalid, naming `what`, otherwise.
  static StatusOr<SlabAllocator> MakeOnGranule(const std::string& what, uint64_t arena_bytes, uint64_t slab_bytes,
                                               uint64_t granule, std::vector<uint64_t> class_bytes = {});

  // Geometry (fixed at Make).
  uint64_t granule() const { return granule_; }
  uint64_t slab_bytes() const { return slab_bytes_; }
  uint32_t num_slabs() const { return static_cast<uint32_t>(slabs_.size()); }
  uint64_t arena_bytes() const { return uint64_t{num_slabs()} * slab_bytes_; }  // bytes in slabs
  uint32_t id_space() const { return static_cast<uint32_t>(arena_bytes() / granule_); }
  size_t num_classes() const { return classes_.size(); }
  // Make's classes are ordered smallest first: class 0 is the smallest. AddClass appends.
  uint64_t class_bytes(int c) const { return classes_[static_cast<size_t>(c)].bytes; }
  // The largest block-major class (Make's or AddClass(bytes)'s); 0 when there is none.
  uint64_t largest() const;
  uint32_t slots_per_slab(int c) const { return classes_[static_cast<size_t>(c)].per_slab; }
  // The smallest block-major class (Make's or AddClass(bytes)'s) whose slots hold `bytes`;
  // -1 when none does.
  int ClassFor(uint64_t bytes) const;
  // The block-major class of exactly `bytes`; -1 when there is none.
  int ClassOfBytes(uint64_t bytes) const;
  // Block-major classes made at registration: the class of `bytes` (a positive multiple of
  // the granule, at most slab_bytes), the existing one or one appended (class indexes never
  // change, the granule never changes). Invalid, and nothing changes, for other sizes or
  // when the arena holds kMaxArenaClasses classes already (the message says so).
  StatusOr<int> AddClass(uint64_t bytes);
  // Layer-major classes (the HBM tier, docs/tiers.md "Layer-major HBM"): a class of slots of
  // `bytes` whose slabs store their slots' pages of `page_bytes` layer after layer (page l
  // of slot j of a slab at l * per_slab * page_bytes + j * page_bytes). Two geometries
  // never share a slab, since their pages would overlap, so a class is a (bytes,
  // page_bytes) pair: the existing one is returned, or one is appended (class indexes
  // never change). bytes must be the size of a block-major class (so the granule stays),
  // page_bytes a positive multiple of 16 no larger than bytes. Invalid past
  // kMaxArenaClasses.
  StatusOr<int> AddClass(uint64_t bytes, uint64_t page_bytes);
  // The page bytes of class c's layer-major slabs; 0 for Make's (block-major) classes.
  uint64_t page_bytes(int c) const { return classes_[static_cast<size_t>(c)].page_bytes; }
  // The offset of the page `layer` of slot `id` (taken or not, of class c's geometry),
  // for a class with page bytes: slab start + layer * per_slab * page_bytes + j * page_bytes.
  uint64_t PageOffset(uint32_t id, int c, uint32_t layer) const;
  // The one place that says where slot `id` is.
  uint64_t Offset(uint32_t id) const { return uint64_t{id} * granule_; }
  uint32_t SlabOf(uint32_t id) const { return static_cast<uint32_t>(Offset(id) / slab_bytes_); }
  // The id of slot `i` of slab `slab` (which must belong to a class).
  uint32_t SlotId(uint32_t slab, uint32_t i) const;

  // State.
  // The class slab `slab` belongs to (while a move drains it: still its old class); -1 free.
  int SlabClass(uint32_t slab) const { return slabs_[slab].cls; }
  bool Draining(uint32_t slab) const { return slabs_[slab].move_to != kNoMove; }
  // The class of slot `id` when it is a taken slot; -1 otherwise.
  int ClassOfSlot(uint32_t id) const;
  bool IsTaken(uint32_t id) const { return ClassOfSlot(id) >= 0; }
  // A slot of class c: from the class's lowest slab with room (within it next-fit, so slots
  // taken together are neighbours), else from the lowest free slab; nullopt
  // when neither exists (or c is out of range).
  std::optional<uint32_t> Alloc(int c);
  // False (and nothing changes) for an id that is not a taken slot. A slab left empty goes
  // to the pool, or to the class a move drains it for.
  bool Free(uint32_t id);
  // Marks slot `id` of class c taken, as a reload from an index does (the NVMe store at
  // open): a free slab becomes one of class c. Invalid, and nothing changes, for a class
  // out of range, an id that is not a slot start of class c, a slab of another class or a
  // draining one, or a slot already taken.
  Status Restore(uint32_t id, int c);
  // Starts moving `slab` (of a class other than `to`, not already draining) to class `to`:
  // nothing more is allocated from it, and the Free of its last taken slot hands it to
  // `to`. Returns the taken slots (their blocks are the owner's to evict). An empty slab
  // moves at once (and the list is empty). Invalid for a free or draining slab, or one of
  // class `to`.
  StatusOr<std::vector<uint32_t>> BeginMove(uint32_t slab, int to);
  // Stops a move: the slab stays with its class (slots freed meanwhile are free in it).
  void CancelMove(uint32_t slab);
  std::vector<uint32_t> TakenSlots(uint32_t slab) const;

  // Counts.
  uint32_t free_slabs() const { return static_cast<uint32_t>(pool_.size()); }
  uint32_t slabs(int c) const { return classes_[static_cast<size_t>(c)].slabs; }
  uint32_t used(int c) const { return classes_[static_cast<size_t>(c)].used; }
  // Slots class c could take now without a move: the free slots of its slabs (not those of
  // a draining slab) and those of every free slab.
  uint32_t free_count(int c) const;
  // used(c) + free_count(c): what class c holds and could hold without a move.
  uint32_t capacity(int c) const { return used(c) + free_count(c); }
  uint32_t used() const;
  uint64_t used_bytes() const;

 private:
  static constexpr int kNoMove = -2;
  struct Class {
    uint64_t bytes = 0;
    uint64_t page_bytes = 0;  // layer-major (AddClass); 0: block-major
    uint32_t per_slab = 0;
    uint32_t slabs = 0;       // slabs of the class, draining ones included
    uint32_t used = 0;        // taken slots
    uint32_t open_free = 0;   // free slots in its slabs that are open (not draining)
    std::set<uint32_t> open;  // its slabs that are not draining and have a free slot
  };
  struct Slab {
    int cls = -1;               // -1: free
    int move_to = kNoMove;      // a draining slab: the class it goes to (-1: the pool)
    SlotAllocator slots;        // the slab's slots, 0..per_slab-1, while it has a class
  };
  void Assign(uint32_t slab, int c);  // a free (or just emptied) slab to class c
  void Release(uint32_t slab);        // an empty slab back to the pool
  // An emptied slab that was moving: to class `to`, or back to the pool (to < 0).
  void HandOver(uint32_t slab, int to) { to < 0 ? Release(slab) : Assign(slab, to); }
  // The index within its slab of slot `id`, or -1 when id is not a slot start there.
  int64_t IndexOf(uint32_t id) const;

  uint64_t granule_ = 0;
  uint64_t slab_bytes_ = 0;
  std::vector<Class> classes_;  // Make's smallest first, then AddClass's
  std::vector<Slab> slabs_;
  std::set<uint32_t> pool_;     // free slabs
};

}  // namespace kvtier::tiers
