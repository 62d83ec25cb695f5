// Small helpers the Session's files share (daemon/session.cc, session_acquire.cc,
// session_alloc.cc, session_commit.cc). Internal to daemon/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "formats/status.h"
#include "formats/wire.h"
#include "tiers/tier_manager.h"

namespace kvtier::daemon {

// One number per (tier, slot): the key of a lease's index of its slots.
inline uint64_t SlotKey(const tiers::SlotRef& s) {
  return (static_cast<uint64_t>(s.tier) << 32) | s.slot;
}

// Writes an error's text at the start of the out region (when there is room).
inline void SetError(wire::CompletionEntry* c, const Status& s, uint8_t* out, uint32_t out_len) {
  c->status = static_cast<int32_t>(s.code());
  c->count = 0;
  c->out_bytes = 0;
  const std::string& m = s.message();
  const size_t n = std::min<size_t>({m.size(), out_len, 65535});
  if (out != nullptr && n > 0) {
    std::memcpy(out, m.data(), n);
    c->msg_len = static_cast<uint16_t>(n);
  }
}

// A copy of `count` records out of a request (its bytes may be the client's shared memory,
// read exactly once here).
template <typename T>
std::vector<T> CopyArray(const uint8_t* src, uint32_t count) {
  std::vector<T> v(count);
  if (count > 0) std::memcpy(v.data(), src, sizeof(T) * count);
  return v;
}

// A set of slots (SlotKey), for finding the slots an acquire names again as its steps
// arrive: open addressing with linear probing, grown at half full, O(1) a slot.
class SlotSet {
 public:
  // True when `key` was not in the set (it is now).
  bool Insert(uint64_t key) {
    if (2 * (n_ + 1) > table_.size()) Grow();
    const uint64_t stored = key + 1;  // 0 marks an empty entry
    for (size_t i = Home(stored);; i = (i + 1) & (table_.size() - 1)) {
      if (table_[i] == stored) return false;
      if (table_[i] == 0) {
        table_[i] = stored;
        ++n_;
        return true;
      }
    }
  }

 private:
  size_t Home(uint64_t stored) const {
    return static_cast<size_t>((stored * 0x9E3779B97F4A7C15ull) >> (64 - bits_));
  }
  void Grow() {
    std::vector<uint64_t> old = std::move(table_);
    bits_ = old.empty() ? 6 : bits_ + 1;
    table_.assign(size_t{1} << bits_, 0);
    for (const uint64_t stored : old) {
      if (stored == 0) continue;
      size_t i = Home(stored);
      while (table_[i] != 0) i = (i + 1) & (table_.size() - 1);
      table_[i] = stored;
    }
  }

  std::vector<uint64_t> table_;  // stored keys (key + 1), 0 empty; a power of two long
  size_t n_ = 0;
  int bits_ = 0;
};

}  // namespace kvtier::daemon
