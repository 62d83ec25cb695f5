// The tier stats record between the storage engine and the wire: one function each way,
// both generated from the record's field list (formats/tier_stats_fields.h), so a
// field added there travels without another line here.
#pragma once

#include <algorithm>
#include <cstdint>

#include "formats/wire.h"
#include "tiers/tier_manager.h"

namespace kvtier::daemon {

inline wire::WireTierStats ToWire(const tiers::TierStats& s) {
  wire::WireTierStats w{};
  w.tier = static_cast<uint8_t>(s.tier);
  w.present = s.present ? 1 : 0;
  w.slab_moves = static_cast<uint32_t>(std::min<uint64_t>(s.slab_moves, UINT32_MAX));
#define KVTIER_TIER_STATS_COPY_(type, name) w.name = s.name;
  KVTIER_TIER_STATS_FIELDS(KVTIER_TIER_STATS_COPY_)
#undef KVTIER_TIER_STATS_COPY_
  return w;
}

inline tiers::TierStats FromWire(const wire::WireTierStats& w) {
  tiers::TierStats s;
  s.tier = static_cast<tiers::Tier>(w.tier);
  s.present = w.present != 0;
  s.slab_moves = w.slab_moves;
#define KVTIER_TIER_STATS_COPY_(type, name) s.name = w.name;
  KVTIER_TIER_STATS_FIELDS(KVTIER_TIER_STATS_COPY_)
#undef KVTIER_TIER_STATS_COPY_
  return s;
}

}  // namespace kvtier::daemon
