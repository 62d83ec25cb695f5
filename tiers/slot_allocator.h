// SlotAllocator: allocation and release of slot ids 0..n-1 of a fixed-size arena.
//
// Every tier (HBM arena, host memfd arena, NVMe record area) is an array of equal-size
// slots, so one allocator serves all three.
//
// Free ids are bits of a hierarchical bitmap (level 0: one bit per slot; level k+1: one
// bit per non-empty word of level k; the top level is one word), and allocation is
// *next-fit*: the lowest free id at or after a cursor that follows the last allocation,
// wrapping around. Alloc and Free touch one word per level: 3 levels up to 262,144
// slots, 4 up to 16.7 M, so both are O(1) for any arena a machine holds.
//
// Why next-fit instead of a free stack (the first version): consecutive allocations come
// out as ascending neighbours wherever the arena has free room in one piece, which is what
// a restore needs. Blocks promoted together get neighbouring HBM slots, so their copies
// coalesce into a few long DMA copies instead of one per 144 KiB block (on the H200 one
// copy per block reaches ~0.5 of the link, a coalesced run ~0.97); and NVMe records
// written together land next to each other. A stack hands out ids in the order of past
// frees, which after a few eviction rounds is a shuffle. Lowest ids still come out first
// on a fresh arena.
//
// A double free or the release of a never-allocated id is refused (the bit says whether
// it is taken), not absorbed.
//
// Not thread-safe: the owner (HostPool, HbmPool, NvmeStore) holds its own lock.
#pragma once

#include <bit>
#include <cstdint>
#include <optional>
#include <vector>

namespace kvtier::tiers {

class SlotAllocator {
 public:
  explicit SlotAllocator(uint32_t n = 0) { Reset(n); }

  void Reset(uint32_t n) {
    n_ = n;
    levels_.clear();
    uint64_t bits = n;
    do {  // level sizes in bits, down to a top level of at most one word
      levels_.emplace_back((bits + 63) / 64, 0);
      bits = (bits + 63) / 64;
    } while (levels_.back().size() > 1);
    free_ = 0;
    cursor_ = 0;
    for (uint32_t i = 0; i < n; ++i) SetFree(i);
  }

  // Rebuilds the free set from a set of taken ids (warm restart). Out-of-range ids are
  // ignored; the caller validates them first.
  void ResetTaken(uint32_t n, const std::vector<uint32_t>& taken) {
    Reset(n);
    for (uint32_t id : taken) {
      if (id < n && IsFree(id)) SetTaken(id);
    }
  }

  std::optional<uint32_t> Alloc() {
    if (free_ == 0) return std::nullopt;
    int64_t id = Next(0, cursor_);
    if (id < 0) id = Next(0, 0);
    if (id < 0) return std::nullopt;  // unreachable while free_ > 0
    SetTaken(static_cast<uint32_t>(id));
    cursor_ = static_cast<uint32_t>(id) + 1 < n_ ? static_cast<uint32_t>(id) + 1 : 0;
    return static_cast<uint32_t>(id);
  }

  // False (and nothing changes) for an id out of range or not allocated.
  bool Free(uint32_t id) {
    if (id >= n_ || IsFree(id)) return false;
    SetFree(id);
    return true;
  }

  // Takes a given free id (a reload); false (and nothing changes) when it is out of range
  // or taken.
  bool Take(uint32_t id) {
    if (id >= n_ || !IsFree(id)) return false;
    SetTaken(id);
    return true;
  }

  bool IsTaken(uint32_t id) const { return id < n_ && !IsFree(id); }
  uint32_t total() const { return n_; }
  uint32_t free_count() const { return free_; }
  uint32_t used() const { return n_ - free_; }

 private:
  bool IsFree(uint32_t id) const { return (levels_[0][id >> 6] >> (id & 63)) & 1; }

  void SetFree(uint32_t id) {
    ++free_;
    uint64_t i = id;
    for (auto& lv : levels_) {
      const bool was_empty = lv[i >> 6] == 0;
      lv[i >> 6] |= uint64_t{1} << (i & 63);
      if (!was_empty) break;  // the levels above already say this word has a free bit
      i >>= 6;
    }
  }

  void SetTaken(uint32_t id) {
    --free_;
    uint64_t i = id;
    for (auto& lv : levels_) {
      lv[i >> 6] &= ~(uint64_t{1} << (i & 63));
      if (lv[i >> 6] != 0) break;  // the word still has a free bit: the levels above stay
      i >>= 6;
    }
  }

  // Lowest set bit of level `l` with index >= i, or -1.
  int64_t Next(size_t l, uint64_t i) const {
    const auto& lv = levels_[l];
    const uint64_t w = i >> 6;
    if (w >= lv.size()) return -1;
    const uint64_t m = lv[w] & (~uint64_t{0} << (i & 63));
    if (m != 0) return static_cast<int64_t>((w << 6) | static_cast<uint64_t>(std::countr_zero(m)));
    if (l + 1 == levels_.size()) return -1;  // the top level is one word
    const int64_t nw = Next(l + 1, w + 1);   // the next word of this level with a set bit
    if (nw < 0) return -1;
    return (nw << 6) | std::countr_zero(lv[static_cast<size_t>(nw)]);
  }

  uint32_t n_ = 0;
  uint32_t free_ = 0;
  uint32_t cursor_ = 0;
  std::vector<std::vector<uint64_t>> levels_;
};

}  // namespace kvtier::tiers
