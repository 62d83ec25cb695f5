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

}  // namespace kvtier::daemon
