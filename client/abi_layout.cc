// kvtier_abi_layout: offsetof/sizeof of every public record, as this library was built,
// for bindings that mirror the records (client/python/kvtier checks its ctypes structs
// against it at load instead of trusting a hand copy).
#include <cstddef>

#include "kvtier/kvtier.h"

#define KVT_FIELD(rec, f) \
  {#rec, #f, static_cast<uint32_t>(offsetof(rec, f)), static_cast<uint32_t>(sizeof(static_cast<rec*>(nullptr)->f))}
#define KVT_RECORD(rec) {#rec, "", 0, static_cast<uint32_t>(sizeof(rec))}
#define KVT_STATS_FIELD(type, name) KVT_FIELD(kvtier_tier_stats, name),

namespace {

const kvtier_abi_field kLayout[] = {
    KVT_RECORD(kvtier_key),
    KVT_FIELD(kvtier_key, hi),
    KVT_FIELD(kvtier_key, lo),
    KVT_RECORD(kvtier_slot),
    KVT_FIELD(kvtier_slot, tier),
    KVT_FIELD(kvtier_slot, from_tier),
    KVT_FIELD(kvtier_slot, reserved),
    KVT_FIELD(kvtier_slot, slot),
    KVT_RECORD(kvtier_connect_options),
    KVT_FIELD(kvtier_connect_options, name),
    KVT_FIELD(kvtier_connect_options, has_gpu),
    KVT_FIELD(kvtier_connect_options, timeout_ms),
    KVT_FIELD(kvtier_connect_options, spin_us),
    KVT_RECORD(kvtier_contract_desc),
    KVT_FIELD(kvtier_contract_desc, model_id),
    KVT_FIELD(kvtier_contract_desc, model_revision),
    KVT_FIELD(kvtier_contract_desc, tokenizer_revision),
    KVT_FIELD(kvtier_contract_desc, num_layers),
    KVT_FIELD(kvtier_contract_desc, num_kv_heads),
    KVT_FIELD(kvtier_contract_desc, head_dim),
    KVT_FIELD(kvtier_contract_desc, block_tokens),
    KVT_FIELD(kvtier_contract_desc, tp_rank),
    KVT_FIELD(kvtier_contract_desc, tp_size),
    KVT_FIELD(kvtier_contract_desc, kv_format),
    KVT_FIELD(kvtier_contract_desc, scale_rule),
    KVT_FIELD(kvtier_contract_desc, v_scale_swizzle),
    KVT_FIELD(kvtier_contract_desc, reserved),
    KVT_FIELD(kvtier_contract_desc, k_scales),
    KVT_FIELD(kvtier_contract_desc, v_scales),
    KVT_RECORD(kvtier_lookup_result),
    KVT_FIELD(kvtier_lookup_result, hit_blocks),
    KVT_FIELD(kvtier_lookup_result, est_seconds_to_hbm),
    KVT_RECORD(kvtier_commit_item),
    KVT_FIELD(kvtier_commit_item, slot),
    KVT_FIELD(kvtier_commit_item, key),
    KVT_FIELD(kvtier_commit_item, parent),
    KVT_RECORD(kvtier_commit_result),
    KVT_FIELD(kvtier_commit_result, committed),
    KVT_FIELD(kvtier_commit_result, stored),
    KVT_FIELD(kvtier_commit_result, same_bytes),
    KVT_FIELD(kvtier_commit_result, different_bytes),
    KVT_FIELD(kvtier_commit_result, unchecked),
    KVT_FIELD(kvtier_commit_result, replaced),
    KVT_FIELD(kvtier_commit_result, disputed),
    KVT_RECORD(kvtier_tier_stats),
    KVT_FIELD(kvtier_tier_stats, tier),
    KVT_FIELD(kvtier_tier_stats, present),
    KVT_FIELD(kvtier_tier_stats, reserved),
    KVT_FIELD(kvtier_tier_stats, slab_moves),
    KVTIER_TIER_STATS_FIELDS(KVT_STATS_FIELD)
};

}  // namespace

extern "C" const kvtier_abi_field* kvtier_abi_layout(size_t* n) {
  if (n != nullptr) *n = sizeof(kLayout) / sizeof(kLayout[0]);
  return kLayout;
}
