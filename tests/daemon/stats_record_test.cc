// daemon/stats_record.h: the tier stats record from the storage engine to the wire and
// back, every field of the one field list (client/include/kvtier/tier_stats.h) carried.
#include <gtest/gtest.h>

#include <cstring>

#include "daemon/stats_record.h"

namespace kvtier::daemon {
namespace {

TEST(StatsRecord, EveryFieldCrossesTheWireBothWays) {
  tiers::TierStats s;
  s.tier = tiers::Tier::kRemote;
  s.present = true;
  int i = 0;
  // A distinct value per field: a field copied into another's place would show.
#define KVT_SET(type, name) s.name = static_cast<type>(1000 + 7 * ++i);
  KVTIER_TIER_STATS_FIELDS(KVT_SET)
#undef KVT_SET
  ASSERT_EQ(i, 20) << "the field list changed: update the wire size in formats/wire.h";
  s.slab_moves = 4242;  // protocol 7, in bytes that were reserved
  const wire::WireTierStats w = ToWire(s);
  EXPECT_EQ(w.slab_moves, 4242u);
  EXPECT_EQ(w.tier, static_cast<uint8_t>(tiers::Tier::kRemote));
  EXPECT_EQ(w.present, 1);
  for (uint8_t r : w.reserved) EXPECT_EQ(r, 0);
#define KVT_CHECK(type, name) EXPECT_EQ(w.name, s.name) << #name;
  KVTIER_TIER_STATS_FIELDS(KVT_CHECK)
#undef KVT_CHECK
  EXPECT_EQ(w.errors, s.errors);
  EXPECT_EQ(w.write_errors, s.write_errors);
  EXPECT_NE(w.errors, w.write_errors);

  const tiers::TierStats back = FromWire(w);
  EXPECT_EQ(back.tier, s.tier);
  EXPECT_EQ(back.present, s.present);
  EXPECT_EQ(back.slab_moves, 4242u);
#define KVT_CHECK(type, name) EXPECT_EQ(back.name, s.name) << #name;
  KVTIER_TIER_STATS_FIELDS(KVT_CHECK)
#undef KVT_CHECK

  tiers::TierStats off;
  off.tier = tiers::Tier::kHbm;
  EXPECT_EQ(ToWire(off).present, 0);
  EXPECT_EQ(FromWire(ToWire(off)).present, false);
}

// TierStats holds exactly the listed fields and slab_moves (no member left off the list,
// and the wire).
TEST(StatsRecord, TierStatsIsTheListedFields) {
  struct Listed {
    tiers::Tier tier;
    bool present;
#define KVT_MEMBER(type, name) type name;
    KVTIER_TIER_STATS_FIELDS(KVT_MEMBER)
#undef KVT_MEMBER
    uint64_t slab_moves;
  };
  EXPECT_EQ(sizeof(tiers::TierStats), sizeof(Listed));
  EXPECT_EQ(sizeof(wire::WireTierStats), 8 + 20 * 8);
}

}  // namespace
}  // namespace kvtier::daemon
