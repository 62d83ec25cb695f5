// SlotAllocator: O(1) allocation and release of slot ids 0..n-1 of a fixed-size arena.
//
// Every tier (HBM arena, host memfd arena, NVMe record area) is an array of equal-size
// slots, so one allocator serves all three. Free ids live on a stack (pop = alloc,
// push = free: O(1) each) and a byte per slot says whether it is taken, so that a double
// free or the release of a never-allocated id is refused instead of corrupting the stack.
// Lowest ids come out first on a fresh arena (keeps a small working set compact).
//
// Not thread-safe: the owner (HostPool, HbmPool, NvmeStore) holds its own lock.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace kvtier::tiers {

class SlotAllocator {
 public:
  explicit SlotAllocator(uint32_t n = 0) { Reset(n); }

  void Reset(uint32_t n) {
    taken_.assign(n, 0);
    free_.clear();
    free_.reserve(n);
    for (uint32_t i = n; i > 0; --i) free_.push_back(i - 1);
  }

  // Rebuilds the free stack from a set of taken ids (warm restart). Out-of-range ids are
  // ignored; the caller validates them first.
  void ResetTaken(uint32_t n, const std::vector<uint32_t>& taken) {
    taken_.assign(n, 0);
    for (uint32_t id : taken) {
      if (id < n) taken_[id] = 1;
    }
    free_.clear();
    for (uint32_t i = n; i > 0; --i) {
      if (!taken_[i - 1]) free_.push_back(i - 1);
    }
  }

  std::optional<uint32_t> Alloc() {
    if (free_.empty()) return std::nullopt;
    uint32_t id = free_.back();
    free_.pop_back();
    taken_[id] = 1;
    return id;
  }

  // False (and nothing changes) for an id out of range or not allocated.
  bool Free(uint32_t id) {
    if (id >= taken_.size() || !taken_[id]) return false;
    taken_[id] = 0;
    free_.push_back(id);
    return true;
  }

  bool IsTaken(uint32_t id) const { return id < taken_.size() && taken_[id]; }
  uint32_t total() const { return static_cast<uint32_t>(taken_.size()); }
  uint32_t free_count() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t used() const { return total() - free_count(); }

 private:
  std::vector<uint8_t> taken_;
  std::vector<uint32_t> free_;
};

}  // namespace kvtier::tiers
