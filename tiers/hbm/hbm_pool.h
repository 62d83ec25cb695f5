// HbmPool: the HBM tier's arena. One cudaMalloc on one device, exported once by CUDA IPC
// (cudaIpcGetMemHandle) so every attached engine maps the same arena, holding the slots
// of a SlabAllocator (tiers/slab_allocator.h: one or more slot size classes sharing the
// arena's slabs by demand, as in the host tier). HBM slot ids are the block-table entries
// the decode kernels take: slot s starts at base + s * granule whatever its class (the
// kernels' kvt_pool.slot_bytes is that stride; with one class the granule is slot_bytes).
//
// Copies between this arena and pinned host memory run as cudaMemcpyAsync on the pool's
// own two non-blocking streams (one per direction, so promotions and demotions overlap).
// Completion is reported through a callback run by cudaLaunchHostFunc on a CUDA-owned
// thread: the callback must not call CUDA (the TierManager's only queues a completion).
//
// Every block that enters the arena is hashed on the GPU (block_hash.h): at commit
// (HashSlots) and after a promotion's copies (CopyBatch to the device). SlotHash gives the
// value back to whoever checks a copy of the slot on its way down: CUDA IPC maps the arena
// read-write for every GPU client, so a change made after the hash is detected there, not
// prevented.
//
// Only built into a useful form with CUDA (KVTIER_HAVE_CUDA); elsewhere Create() answers
// Unsupported and the TierManager runs without an HBM tier.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include "formats/status.h"
#include "tiers/slab_allocator.h"

namespace kvtier::tiers {

// How CopyBatch moves host -> HBM batches. kAuto: neighbouring slots are coalesced into
// runs first; runs of 1 MiB or more on average go to the copy engines (a loop of
// cudaMemcpyAsync for up to 64 runs, else cudaMemcpyBatchAsync), shorter runs to the gather
// kernel (hbm/gather.cu), which has no per-copy setup. The others force one method
// (benchmarks). HBM -> host never uses the kernel.
enum class HbmCopy : uint8_t { kAuto = 0, kKernel = 1, kBatch = 2, kLoop = 3 };
// "auto", "kernel", "batch", "loop" (the config's tiers.hbm.copy values).
const char* HbmCopyName(HbmCopy c);
StatusOr<HbmCopy> ParseHbmCopy(std::string_view name);

struct HbmPoolOptions {
  static constexpr int kMaxStreams = 8;
  int device = 0;           // CUDA device ordinal. Default: 0
  uint64_t slot_bytes = 0;  // bytes per slot, 4096 multiple. Default: 0 (refused)
  uint32_t slots = 0;       // number of slots. Default: 0 (refused)
  // Several slot classes (4 KiB multiples): the arena is `arena_bytes` cut into slabs of
  // `slab_bytes`, each slab holding slots of one class, and slot_bytes / slots are
  // ignored. Empty: one class, `slots` slots of `slot_bytes` (slot s at s * slot_bytes).
  // Default: empty
  std::vector<uint64_t> classes;
  // Classes made at registration (HostPoolOptions::classes_at_registration): the arena is
  // `arena_bytes` in slabs of `slab_bytes` on the granule AutoGranule(arena_bytes), with no
  // class until AddClass(bytes) makes one; `classes` must be empty. Default: false
  bool classes_at_registration = false;
  uint64_t slab_bytes = kDefaultSlabBytes;  // with classes. Default: 64 MiB
  uint64_t arena_bytes = 0;                 // with classes. Default: 0 (refused)
  HbmCopy copy = HbmCopy::kAuto;  // host -> HBM copy method. Default: kAuto
  // Streams per direction for the copy-engine paths, [1, kMaxStreams]: a batch's runs are
  // split over them so that the DMA setup of one copy overlaps the transfer of another.
  // Default: 1
  int streams = 1;
  bool trace_copies = false;  // one log line per copy batch (timeline). Default: false

  Status Validate() const;
};

class HbmPool {
 public:
  using CopyDone = std::function<void(Status)>;

  // Unsupported without CUDA or without a device; IoError when cudaMalloc fails.
  static StatusOr<std::unique_ptr<HbmPool>> Create(const HbmPoolOptions& opts);
  ~HbmPool();
  HbmPool(const HbmPool&) = delete;
  HbmPool& operator=(const HbmPool&) = delete;

  int device() const { return opts_.device; }
  uint8_t* base() const { return base_; }  // device pointer
  // The largest slot, the granule (slot s at base + s * granule), the ids a slot may have
  // (every slot id is below it) and the classes, as HostPool's.
  uint64_t slot_bytes() const { return alloc_.largest(); }
  uint64_t granule() const { return alloc_.granule(); }
  uint32_t id_space() const { return alloc_.id_space(); }
  uint64_t slab_bytes() const { return alloc_.slab_bytes(); }
  uint32_t num_slabs() const { return alloc_.num_slabs(); }
  int num_classes() const { return num_classes_.load(std::memory_order_acquire); }
  uint64_t class_bytes(int cls) const { return alloc_.class_bytes(cls); }
  uint32_t slots_per_slab(int cls) const { return alloc_.slots_per_slab(cls); }
  int ClassFor(uint64_t bytes) const { return alloc_.ClassFor(bytes); }
  // The most slots of class `cls` the arena holds (every slab of it), and of the smallest.
  uint32_t most(int cls) const { return alloc_.num_slabs() * alloc_.slots_per_slab(cls); }
  // Classes made at registration, none yet: the slots of slot_bytes (the largest block).
  uint32_t slots() const {
    if (!opts_.classes_at_registration) return most(0);
    int smallest = -1;
    for (int c = 0; c < num_classes(); ++c) {
      if (page_bytes(c) == 0 && (smallest < 0 || class_bytes(c) < class_bytes(smallest))) smallest = c;
    }
    return smallest >= 0 ? most(smallest)
                         : alloc_.num_slabs() * static_cast<uint32_t>(alloc_.slab_bytes() / opts_.slot_bytes);
  }
  // Classes made at registration: the block-major class of slots of `bytes` rounded up to
  // the granule (SlabAllocator::AddClass(bytes)), the existing one or a new one; Invalid,
  // and nothing changes, for 0 or more than a slab, or past kMaxArenaClasses.
  StatusOr<int> AddClass(uint64_t bytes);
  uint64_t arena_bytes() const { return alloc_.arena_bytes(); }
  // The one place that says where HBM slot `slot` is (SlabAllocator::Offset).
  uint64_t slot_offset(uint32_t slot) const { return alloc_.Offset(slot); }
  uint8_t* slot_ptr(uint32_t slot) const { return base_ + slot_offset(slot); }
  // Whether `bytes` from slot `slot` on lie inside the arena (the copy and hash bounds).
  bool InArena(uint32_t slot, uint64_t bytes) const {
    return slot < id_space() && bytes <= arena_bytes() - slot_offset(slot);
  }

  // ---- Layer-major classes (docs/tiers.md "Layer-major HBM").
  // The class of slots of `bytes` (one of the arena's sizes) whose slabs store pages of
  // `page_bytes` layer after layer: page l of slot j of a slab at
  //   slab start + l * slots_per_slab * page_bytes + j * page_bytes
  // (SlabAllocator::AddClass: an existing one or a new one; Invalid past
  // kMaxArenaClasses). Every copy in or out of such a slot, and its hash, moves between
  // the block-major bytes of the host (page after page) and these pages.
  StatusOr<int> AddClass(uint64_t bytes, uint64_t page_bytes);
  uint64_t page_bytes(int cls) const { return alloc_.page_bytes(cls); }
  // Where slot `slot`'s `bytes` lie: at `off` from base() contiguous (page == 0), or page
  // after page (byte k at off + (k / page) * pitch + k % page). Invalid when they would
  // pass the arena's end or the slot's slab.
  struct SlotSpan {
    uint64_t off = 0;
    uint64_t pitch = 0;
    uint64_t page = 0;
  };
  StatusOr<SlotSpan> SpanOf(uint32_t slot, uint64_t bytes) const;

  // 64-byte cudaIpcMemHandle_t of the arena.
  Status IpcHandle(uint8_t out[64]) const;

  // A slot of class `cls`; nullopt when neither its slabs nor the pool have one.
  std::optional<uint32_t> Alloc(int cls = 0);
  Status Free(uint32_t slot);
  uint32_t used() const;
  uint32_t free_count() const;  // of class 0
  uint32_t used(int cls) const;
  uint32_t free_count(int cls) const;  // SlabAllocator::free_count
  uint32_t capacity(int cls) const;
  uint64_t used_bytes() const;
  uint32_t slabs(int cls) const;
  // Slab moves (SlabAllocator::BeginMove / CancelMove / TakenSlots / SlabClass).
  StatusOr<std::vector<uint32_t>> BeginMove(uint32_t slab, int to);
  std::vector<uint32_t> TakenSlots(uint32_t slab) const;
  int SlabClass(uint32_t slab) const;
  bool Draining(uint32_t slab) const;
  uint32_t SlabOf(uint32_t slot) const { return alloc_.SlabOf(slot); }

  // Asynchronous copies of `bytes` (<= slot_bytes) between slot and pinned host memory.
  // On a launch error `done` is not called and the error is returned.
  Status CopyToDevice(uint32_t slot, const void* host_src, uint64_t bytes, CopyDone done);
  Status CopyToHost(uint32_t slot, void* host_dst, uint64_t bytes, CopyDone done);
  // A batch of copies in one direction, issued back to back with a single completion:
  // done(status) runs once, after the last copy, on a separate callback stream (so that a
  // slow callback never holds up the next batch's copies). One host callback per block
  // would stall the stream between copies (each callback blocks the stream until it
  // returns), which costs most of the PCIe bandwidth for 1-2 MB blocks.
  struct CopyItem {
    uint32_t slot;
    void* host;
    uint64_t bytes;
  };
  // On the copy-engine paths (cudaMemcpyBatchAsync, the loop; D2H always), adjacent slots
  // whose host buffers are adjacent too are copied as one copy (CoalesceCopies): each copy
  // on a stream costs a few microseconds of DMA setup, ~13% of the link for 1.4 MiB blocks
  // (H200, loop: 0.86 of one cudaMemcpy one copy per block, 0.91-0.97 coalesced). The
  // gather kernel (the default H2D path) takes the items as they are.
  Status CopyBatch(const std::vector<CopyItem>& items, bool to_device, CopyDone done);
  // One copy of a coalesced batch: `bytes` from host to slot `slot` onwards (or back).
  struct CopyRun {
    uint32_t slot;
    void* host;
    uint64_t bytes;
  };
  // Sorts `items` by slot and merges runs: item k+1 joins item k's run when its slot
  // starts where k's bytes end (slot * granule) and its host buffer starts where k's ends
  // (so the merged copy moves no byte that the separate copies would not: k fills its
  // slot), unless k+1's host buffer starts at one of `host_breaks` (sorted). Pure; no CUDA.
  static std::vector<CopyRun> CoalesceCopies(std::vector<CopyItem> items, uint64_t granule,
                                             const std::vector<uintptr_t>& host_breaks = {});
  // Host addresses where a copy must start afresh: the starts of host memory registered
  // with CUDA separately (the host tier's parts, HostPool::part_offset), which one copy
  // may not span. Set once, before the first copy.
  void SetHostBreaks(std::vector<uintptr_t> breaks);
  // Synchronous variants (operator paths: Flush).
  Status CopyToHostSync(uint32_t slot, void* host_dst, uint64_t bytes);
  Status CopyToDeviceSync(uint32_t slot, const void* host_src, uint64_t bytes);

  // ---- The block hash (block_hash.h).
  struct HashItem {
    uint32_t slot;
    uint64_t bytes;  // <= slot_bytes
  };
  // Queues the hash of each item's slot (distinct slots) on the pool's hash stream and
  // returns at once (one kernel launch per 2,048 items). Every copy out of the arena
  // issued afterwards (CopyBatch, CopyToHost, CopyToHostSync) waits on the GPU for the
  // hashes queued before it, so SlotHash is ready in that copy's completion. CopyBatch to
  // the device hashes its slots itself, after the copies. On an error no item counts as
  // hashed.
  Status HashSlots(const std::vector<HashItem>& items);
  // The hash taken when the slot's block entered HBM; nullopt when none was taken since
  // the slot was last allocated. Read it in the completion of a copy out of the slot (or
  // after a synchronous one).
  std::optional<uint64_t> SlotHash(uint32_t slot) const;
  // The hash's seed: random per pool, never sent to a client (block_hash.h says why).
  uint64_t hash_seed() const { return hash_seed_; }

 private:
  HbmPool() = default;
  HbmPoolOptions opts_;
  uint8_t* base_ = nullptr;
  void* h2d_ = nullptr;  // cudaStream_t
  void* d2h_ = nullptr;  // cudaStream_t
  // Extra streams per direction for the copy-engine paths (HbmPoolOptions::streams),
  // joined back into h2d_/d2h_ by events before the completion. fan_[d][0] is unused (the
  // direction's own stream).
  static constexpr int kMaxStreams = HbmPoolOptions::kMaxStreams;
  int streams_ = 1;
  void* fan_[2][kMaxStreams] = {};       // cudaStream_t
  void* fan_done_[2][kMaxStreams] = {};  // cudaEvent_t
  // Completions run on their own stream per direction, after an event of the copy stream:
  // a host function blocks its stream until it returns (and the TierManager's callback
  // takes a lock the mover may hold for a whole group's bookkeeping), so on the copy
  // stream each completion left PCIe idle between groups (H200: a 2,048-block restore
  // in groups of 128 moved 40 GB/s of a link that gives 55).
  void* cb_stream_[2] = {};  // cudaStream_t
  void* cb_event_[2] = {};   // cudaEvent_t
  bool trace_ = false;                   // HbmPoolOptions::trace_copies
  std::mutex fan_mu_;                    // the events above are recorded and waited in pairs
  mutable std::mutex mu_;  // guards alloc_'s state (its geometry is fixed at Create)
  std::vector<uintptr_t> host_breaks_;  // SetHostBreaks, sorted
  SlabAllocator alloc_;
  std::atomic<int> num_classes_{0};  // alloc_.num_classes(), read without mu_
  int64_t max_pitch_ = 0;             // cudaDevAttrMaxPitch: a 2D copy's pitch at most
  // The copy of `bytes` between host memory and the span, on stream `s` (a cudaStream_t):
  // one cudaMemcpyAsync (contiguous) or one cudaMemcpy2DAsync per block (a page per row).
  Status CopySpan(const SlotSpan& sp, void* host, uint64_t bytes, bool to_device, void* s) const;
  // HbmPoolOptions::copy, as the copy paths test it.
  std::atomic<bool> gather_kernel_{true};   // the kernel may be used (host pointers usable)
  std::atomic<bool> gather_always_{false};  // HbmCopy::kKernel
  std::atomic<bool> loop_only_{false};      // HbmCopy::kLoop
  std::atomic<bool> batch_always_{false};   // HbmCopy::kBatch
  std::atomic<bool> batch_api_{true};
  // The block hash. hash_mu_ orders the launches on hash_stream_ with the records of
  // hash_done_ (after every launch) and the waits of the copies out of the arena on it.
  uint64_t hash_seed_ = 0;
  std::mutex hash_mu_;
  void* hash_stream_ = nullptr;  // cudaStream_t
  void* hash_in_ = nullptr;      // cudaEvent_t: a promotion's copies done (CopyBatch)
  void* hash_done_ = nullptr;    // cudaEvent_t: every hash queued so far
  // Indexed by slot id: id_space() entries.
  unsigned long long* hash_sums_ = nullptr;  // [ids] device scratch (hash.h)
  unsigned int* hash_counts_ = nullptr;      // [ids] device scratch
  unsigned long long* hash_host_ = nullptr;  // [ids] pinned, mapped: the hash per slot
  unsigned long long* hash_host_dev_ = nullptr;  // hash_host_ as the device sees it
  // [ids] 1 while hash_host_[slot] holds the hash of the slot's block (set at launch,
  // cleared by Free).
  std::unique_ptr<std::atomic<uint8_t>[]> hashed_;
  // Launches the hashes of `items` on hash_stream_ (after the work queued on
  // `after_stream` so far, if not null) and records hash_done_. Holds hash_mu_.
  Status QueueHashLocked(const std::vector<HashItem>& items, void* after_stream);
  // Makes `stream` (a cudaStream_t) wait for every hash queued so far.
  Status WaitHashes(void* stream);
};

}  // namespace kvtier::tiers
