/* One tier's statistics, as the C ABI hands them out (kvtier_stats) and Python reads them
 * (kvtier.TierStats).
 *
 * The counters come from one field list, KVTIER_TIER_STATS_FIELDS(X) as X(type, name)
 * (kvtier/tier_stats_fields.h, installed beside this header; its source is
 * formats/tier_stats_fields.h, which the daemon and the wire take it from too). The
 * struct is generated from the list, in this order, after the tier and present bytes.
 * A new field goes at the end of the list (the offsets of the others do not move) and
 * bumps the wire protocol and the ABI version.
 * slab_moves took bytes that were reserved (always 0) in protocol 7: no offset moved.
 * Self-contained C (stdint only): included by kvtier.h.
 */
#ifndef KVTIER_TIER_STATS_H_
#define KVTIER_TIER_STATS_H_

#include <stdint.h>

#include "kvtier/tier_stats_fields.h"

#define KVTIER_TIER_STATS_DECLARE_(type, name) type name;

typedef struct kvtier_tier_stats {
  uint8_t tier;        /* kvtier_tier */
  uint8_t present;     /* 1: the tier is configured and running */
  uint8_t reserved[2]; /* 0 */
  uint32_t slab_moves; /* slabs moved between slot classes (tiers/slab_allocator.h); 0
                          from a daemon of protocol 6 or older */
  KVTIER_TIER_STATS_FIELDS(KVTIER_TIER_STATS_DECLARE_)
} kvtier_tier_stats;

#undef KVTIER_TIER_STATS_DECLARE_

#endif /* KVTIER_TIER_STATS_H_ */
