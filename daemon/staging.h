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
// Memory: the memfd is sparse; a page costs memory once the client writes it, and the
// pages stay until the client detaches (reused by its next allocs, most recently freed
// first: no fault per block).
// The slot count is the per-client cap `tiers.host.staging_slots_per_client`.
//
// Thread-safe: Alloc/Free take a small lock; slot_ptr() is lock-free.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "formats/status.h"

namespace kvtier::daemon {

class StagingArea {
 public:
  static StatusOr<std::unique_ptr<StagingArea>> Create(const std::string& name, uint32_t slots,
                                                       uint64_t slot_bytes, uint32_t first_id,
                                                       uint32_t stride = 1);
  ~StagingArea();
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

  // n staging slots into *out, or false (nothing taken) when fewer than n are free.
  bool Alloc(uint32_t n, std::vector<uint32_t>* out);
  void Free(uint32_t i);
  void Free(std::span<const uint32_t> slots);  // under one lock; ids outside the area are skipped
  uint32_t used() const;

 private:
  StagingArea() = default;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0, slot_bytes_ = 0;
  uint32_t slots_ = 0, first_id_ = 0, stride_ = 1;
  mutable std::mutex mu_;        // guards free_ and taken_
  // Free slots as a stack: the most recently freed comes out first, so a client that
  // stores a few blocks at a time keeps writing the same pages (no fault, no zeroing)
  // and the area's resident memory stays near what the client holds at once.
  std::vector<uint32_t> free_;
  std::vector<uint8_t> taken_;
};

}  // namespace kvtier::daemon
