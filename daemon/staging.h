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
// Units and ids: the area is an array of units, the host tier's granule each, and a
// staging slot is a run of units: as many as its contract's host slot takes (a host class
// of the contract's block; slot_bytes with slot classes fixed at start). Slots are taken
// first-fit (the lowest run that holds one) and a freed run joins its free neighbours, so
// contracts of any slot size share one area. The client maps its staging memfd right
// after its read-only mapping of the arena, so the staging slot at unit i has host slot id
// `first_id + i`, with first_id = arena bytes / granule (host slot s is at s * granule:
// tiers/slab_allocator.h), and host slot s of either kind is at the same place in one
// window (kvtier_host_slot). With one slot class the granule is the slot: every slot is
// one unit. A staging slot is free again once its slot is committed or its lease released.
//
// Size: with slot classes fixed at start, `slots` slots of slot_bytes (the largest class:
// a staging slot of any class fits one). With classes made per contract (slot_bytes then
// the largest block, 64 MiB by default) that would be terabytes of address space, so the
// area is the client's share of the host tier's bytes (what its leases may hold) plus
// one largest slot, and `slots` only caps how many slots it holds at once.
//
// With [[tenants]] a client maps no arena but its tenant's part of it (Session, private
// reads; tiers/host/host_pool.h, "Parts"): a host acquire copies each block it returns
// from outside that part into a staging slot of the lease, and the client reads that
// copy; the slot is free again at release.
//
// Memory, per client: the memfd is sparse; a page costs memory once written, and a freed
// slot keeps its pages for the client's next allocs (first-fit reaches the freed runs
// below the area's high mark first: no fault per block). The slot count is `tiers.host.staging_slots_per_client`, by default the
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
#include <map>
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
  // `units` units of `unit_bytes` (the host granule, a 4 KiB multiple), at most `slots`
  // slots taken at once; the client's id of unit i is first_id + i. budget: the daemon's
  // total (null: none).
  static StatusOr<std::unique_ptr<StagingArea>> Create(const std::string& name, uint32_t units,
                                                       uint64_t unit_bytes, uint32_t slots, uint32_t first_id,
                                                       std::shared_ptr<StagingBudget> budget = nullptr);
  StagingArea(const StagingArea&) = delete;
  StagingArea& operator=(const StagingArea&) = delete;

  int fd() const { return fd_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t units() const { return units_; }
  uint64_t unit_bytes() const { return unit_bytes_; }
  // The most slots taken at once.
  uint32_t slots() const { return slots_; }
  uint32_t first_id() const { return first_id_; }
  // The client's id of the staging slot that starts at unit i.
  uint32_t id_of(uint32_t i) const { return first_id_ + i; }
  uint64_t slot_offset(uint32_t i) const { return uint64_t{i} * unit_bytes_; }
  uint8_t* slot_ptr(uint32_t i) const { return base_ + slot_offset(i); }

  // n staging slots of `slot_bytes` each (a multiple of unit_bytes: the contract's host
  // slot) into *out (their first units), for `bytes_each` bytes each (what the caller or
  // the client writes into each: a block; at most slot_bytes), and Ok; nothing taken
  // otherwise: Invalid for a slot size the area cannot hold, Rejected when the area has
  // fewer than n free runs of that size (or n more would pass `slots`), Retry when the
  // daemon's total (StagingBudget) cannot hold them even after taking back freed slots'
  // pages.
  Status Alloc(uint32_t n, uint64_t bytes_each, uint64_t slot_bytes, std::vector<uint32_t>* out);
  void Free(uint32_t i);
  void Free(std::span<const uint32_t> slots);  // under one lock; ids outside the area are skipped
  uint32_t used() const;         // slots taken
  uint64_t used_bytes() const;   // bytes of the slots taken
  // Bytes this area's slots hold against the budget (in use and freed-but-warm).
  uint64_t charged() const;
  ~StagingArea();

 private:
  friend class StagingBudget;
  StagingArea() = default;
  void FreeLocked(uint32_t i);
  // Punches out freed units' pages until `want` bytes were released; returns the bytes.
  uint64_t TakeBackFree(uint64_t want);
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0, unit_bytes_ = 0;
  uint32_t units_ = 0, slots_ = 0, first_id_ = 0;
  std::shared_ptr<StagingBudget> budget_;
  mutable std::mutex mu_;        // guards free_, taken_, held_, used_bytes_ and charged_
  std::map<uint32_t, uint32_t> free_;   // free runs: first unit -> units
  std::map<uint32_t, uint32_t> taken_;  // taken slots: first unit -> units
  // Per unit: the pages charged for it (written by a slot that held it, kept after a free
  // until taken back).
  std::vector<uint32_t> held_;
  uint64_t used_bytes_ = 0;
  uint64_t charged_ = 0;         // sum of held_
};

}  // namespace kvtier::daemon
