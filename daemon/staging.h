// StagingArea: one client's private, writable host slots.
//
// The host arena maps read-only in every client (tiers/host/host_pool.h), so a client
// writes a block it is about to commit here instead: one memfd per attached client, of
// `slots` slots of the arena's largest slot size (tiers.slot_bytes: a staging slot holds a
// block of any slot class), mapped writable by that client and by the
// daemon, by no one else. An alloc lease on the host tier reserves, for each of its slots,
// an arena slot (invisible until committed, as before) and a staging slot; the client
// sees the staging slot's id. Commit copies the block's bytes (the contract's block size,
// not the whole slot) from the staging slot into the arena slot, and only then makes the
// arena slot visible: every later reader (acquires, the NVMe checksum at demotion, the
// remote tier) sees bytes no client can change.
//
// Ids: the client maps its staging memfd right after its read-only mapping of the arena,
// so staging slot i has host slot id `first_id + i * stride`, with first_id = arena bytes
// / granule and stride = slot_bytes / granule (host slot s is at s * granule:
// tiers/slab_allocator.h), and host slot s of either kind is at the same place in one
// window (kvtier_host_slot). With one slot class the granule is the slot: stride 1. A staging slot is free again once its slot is committed or its
// lease released.
//
// With [[tenants]] a client maps no arena but its tenant's part of it (Session, private
// reads; tiers/host/host_pool.h, "Parts"): a host acquire copies each block it returns
// from outside that part into a staging slot of the lease, and the client reads that
// copy; the slot is free again at release.
//
// Memory, per client: the memfd is sparse; a page costs memory once written, and a freed
// slot keeps its pages for the client's next allocs (most recently freed first: no fault
// per block). The slot count is `tiers.host.staging_slots_per_client`, by default the
// client's `daemon.max_tier_share_per_client` of the host tier's slots of the smallest
// class. Each slot in use belongs to a lease whose host slot counts its class's bytes
// against that share (Session), so the pages one client's slots in use hold are at most
// its share of the host tier's bytes.
//
// Memory, in total (StagingBudget): every area of the daemon charges one budget,
// `tiers.host.staging_bytes_total` (default: the host tier's bytes), for the pages of its
// slots in use and of its freed slots that keep theirs. An Alloc charges what its slots
// will newly hold (the bytes the caller will write, in pages, past what each slot already
// holds); past the budget it first takes back the pages of freed slots of every area
// (a hole punched in the memfd: the slot is cold again), and only then refuses (Retry).
// So the pages the daemon's copies and the clients' leases hold are at most the budget,
// however many clients attach; what a client writes into slots it does not hold is its
// own memory, within its area, and goes at the next take-back.
//
// Thread-safe: Alloc/Free take a small lock (the budget's take-back takes each area's in
// turn, never two at once); slot_ptr() is lock-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "formats/status.h"

namespace kvtier::daemon {

class StagingArea;

// The daemon's total of staging memory (above). One per daemon, shared by every area.
class StagingBudget {
 public:
  // limit_bytes: the most bytes every area's slots may hold at once; 0: no limit.
  explicit StagingBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}
  StagingBudget(const StagingBudget&) = delete;
  StagingBudget& operator=(const StagingBudget&) = delete;

  uint64_t limit() const { return limit_; }
  // Bytes the areas' slots hold now (charged), and the take-backs so far (in slots).
  uint64_t charged() const { return charged_.load(std::memory_order_relaxed); }
  uint64_t taken_back() const { return taken_back_.load(std::memory_order_relaxed); }

 private:
  friend class StagingArea;
  bool TryCharge(uint64_t bytes);
  void Uncharge(uint64_t bytes) { charged_.fetch_sub(bytes, std::memory_order_relaxed); }
  // Punches out the freed slots of the areas, least recently attached first, until
  // `bytes` more fit or every freed slot is cold. Called with no area's lock held.
  void TakeBack(uint64_t bytes);
  void Register(StagingArea* a);
  void Unregister(StagingArea* a);

  const uint64_t limit_;
  std::atomic<uint64_t> charged_{0};
  std::atomic<uint64_t> taken_back_{0};
  std::mutex mu_;  // guards areas_; taken before an area's lock, never under it
  std::vector<StagingArea*> areas_;
};

class StagingArea {
 public:
  // budget: the daemon's total (null: none).
  static StatusOr<std::unique_ptr<StagingArea>> Create(const std::string& name, uint32_t slots,
                                                       uint64_t slot_bytes, uint32_t first_id,
                                                       uint32_t stride = 1,
                                                       std::shared_ptr<StagingBudget> budget = nullptr);
  StagingArea(const StagingArea&) = delete;
  StagingArea& operator=(const StagingArea&) = delete;

  int fd() const { return fd_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t slots() const { return slots_; }
  uint32_t first_id() const { return first_id_; }
  // The client's id of staging slot i, and back (false for an id outside the area).
  uint32_t id_of(uint32_t i) const { return first_id_ + i * stride_; }
  bool index_of(uint32_t id, uint32_t* i) const {
    if (id < first_id_ || (id - first_id_) % stride_ != 0 || (id - first_id_) / stride_ >= slots_) return false;
    *i = (id - first_id_) / stride_;
    return true;
  }
  uint64_t slot_offset(uint32_t i) const { return uint64_t{i} * slot_bytes_; }
  uint8_t* slot_ptr(uint32_t i) const { return base_ + slot_offset(i); }

  // n staging slots into *out, for `bytes_each` bytes each (what the caller or the client
  // writes into each: a block; at most slot_bytes), and Ok; nothing taken otherwise:
  // Rejected when fewer than n are free in the area, Retry when the daemon's total
  // (StagingBudget) cannot hold them even after taking back freed slots' pages.
  Status Alloc(uint32_t n, uint64_t bytes_each, std::vector<uint32_t>* out);
  void Free(uint32_t i);
  void Free(std::span<const uint32_t> slots);  // under one lock; ids outside the area are skipped
  uint32_t used() const;
  // Bytes this area's slots hold against the budget (in use and freed-but-warm).
  uint64_t charged() const;
  ~StagingArea();

 private:
  friend class StagingBudget;
  StagingArea() = default;
  // Punches out freed slots' pages until `want` bytes were released; returns the bytes.
  uint64_t TakeBackFree(uint64_t want);
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0, slot_bytes_ = 0;
  uint32_t slots_ = 0, first_id_ = 0, stride_ = 1;
  std::shared_ptr<StagingBudget> budget_;
  mutable std::mutex mu_;        // guards free_, taken_, held_ and charged_
  // Free slots as a stack: the most recently freed comes out first, so a client that
  // stores a few blocks at a time keeps writing the same pages (no fault, no zeroing)
  // and the area's resident memory stays near what the client holds at once.
  std::vector<uint32_t> free_;
  std::vector<uint8_t> taken_;
  std::vector<uint64_t> held_;   // per slot: the bytes charged for it (its pages in use)
  uint64_t charged_ = 0;         // sum of held_
};

}  // namespace kvtier::daemon
