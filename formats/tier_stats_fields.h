/* The field list of one tier's statistics: the single definition of the counters that
 * kvtierd keeps (tiers::TierStats), sends to clients (formats/wire.h WireTierStats,
 * Op::kStats), the C ABI hands out (kvtier_tier_stats, client/include/kvtier/tier_stats.h)
 * and Python reads (kvtier.TierStats).
 *
 * Every counter is listed once, as X(type, name); each record is generated from the list,
 * in this order, after the tier and present bytes and slab_moves. A new field goes at the
 * end of the list (the offsets of the others do not move) and bumps the wire protocol
 * (formats/wire.h kProtocolVersion) and the ABI version.
 *
 * Self-contained C (stdint only), on the lowest floor so that every layer takes it from
 * here: the build copies it beside the generated public headers and `cmake --install`
 * ships it as include/kvtier/tier_stats_fields.h, which the public tier_stats.h includes.
 */
#ifndef KVTIER_TIER_STATS_FIELDS_H_
#define KVTIER_TIER_STATS_FIELDS_H_

#include <stdint.h>

/* clang-format off */
#define KVTIER_TIER_STATS_FIELDS(X)                                                        \
  X(uint64_t, capacity_bytes)     /* bytes of the tier (0: off) */                         \
  X(uint64_t, used_bytes)         /* bytes of the slots in use */                          \
  X(uint64_t, slots_total)        /* slots of the tier */                                  \
  X(uint64_t, slots_used)         /* slots in use (committed or leased) */                 \
  X(uint64_t, blocks)             /* committed blocks the tier holds */                    \
  X(uint64_t, pinned)             /* blocks pinned by leases */                            \
  X(uint64_t, hits)               /* lookups the tier answered */                          \
  X(uint64_t, misses)             /* lookups that ended at the tier */                     \
  X(uint64_t, promotions_in)      /* blocks copied into the tier from a slower one */      \
  X(uint64_t, demotions_out)      /* blocks copied from the tier to a slower one */        \
  X(uint64_t, bytes_read)         /* bytes read from the tier's device */                  \
  X(uint64_t, bytes_written)      /* bytes written to the tier's device */                 \
  X(uint64_t, checksum_failures)  /* blocks that failed a checksum: served as misses */    \
  X(uint64_t, evictions_demoted)  /* evictions that moved the block down */                \
  X(uint64_t, evictions_dropped)  /* evictions that dropped the block */                   \
  X(uint64_t, admission_rejects)  /* blocks the admission policy refused */                \
  X(double, read_gbps)            /* measured (or configured) read bandwidth, GB/s */      \
  X(double, write_gbps)           /* measured (or configured) write bandwidth, GB/s */     \
  X(uint64_t, errors)             /* remote tier: answers lost to a down or slow node */   \
  X(uint64_t, write_errors)       /* remote tier: writes dropped or failed */
/* clang-format on */

#endif /* KVTIER_TIER_STATS_FIELDS_H_ */
