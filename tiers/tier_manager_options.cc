// Settings of the storage engine: TierName and the Validate() of the option structs.
#include <algorithm>

#include "tiers/remote/cluster_client.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/tier_manager.h"

namespace kvtier::tiers {

const char* TierName(Tier t) {
  switch (t) {
    case Tier::kHbm: return "hbm";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
    case Tier::kRemote: return "remote";
    case Tier::kNone: return "none";
  }
  return "?";
}

Status TierOptions::Validate(const char* tier_name) const {
  if (!(low_watermark > 0.0 && low_watermark <= high_watermark && high_watermark <= 1.0)) {
    return Status::Invalid(std::string(tier_name) + ": watermarks must satisfy 0 < low (" +
                           std::to_string(low_watermark) + ") <= high (" +
                           std::to_string(high_watermark) + ") <= 1");
  }
  if (static_cast<size_t>(policy) >= kPolicyNames.size()) {
    return Status::Invalid(std::string(tier_name) + ": unknown eviction policy");
  }
  if (std::string why = policy_options.Check(); !why.empty()) {
    return Status::Invalid(std::string(tier_name) + ": policy: " + why);
  }
  if (on_evict != OnEvict::kDemote && on_evict != OnEvict::kDrop) {
    return Status::Invalid(std::string(tier_name) + ": unknown on_evict");
  }
  return Status::Ok();
}

Status TierManagerOptions::Validate() const {
  if (slot_bytes == 0 || slot_bytes % 4096) {
    return Status::Invalid("slot_bytes " + std::to_string(slot_bytes) + " is not a positive multiple of 4096");
  }
  KVTIER_RETURN_IF_ERROR(hbm.Validate("hbm"));
  KVTIER_RETURN_IF_ERROR(host.Validate("host"));
  KVTIER_RETURN_IF_ERROR(nvme.tier.Validate("nvme"));
  if (hbm_copy_streams < 1 || hbm_copy_streams > HbmPoolOptions::kMaxStreams) {
    return Status::Invalid("hbm copy streams " + std::to_string(hbm_copy_streams) + " not in [1, " +
                           std::to_string(HbmPoolOptions::kMaxStreams) + "]");
  }
  if (classes_at_registration) {
    if (!slot_classes.empty()) {
      return Status::Invalid("slot classes are listed and made at registration: one or the other");
    }
  }
  if (!slot_classes.empty()) {
    if (*std::max_element(slot_classes.begin(), slot_classes.end()) != slot_bytes) {
      return Status::Invalid("slot classes: the largest must be slot_bytes (" + std::to_string(slot_bytes) +
                             "), the slot of HBM and NVMe");
    }
    auto a = SlabAllocator::Make("host tier", host.capacity_bytes, slab_bytes, slot_classes);
    if (!a.ok()) return a.status();
  }
  if (host.capacity_bytes < slot_bytes && !classes_at_registration) {
    return Status::Invalid("host tier: capacity " + std::to_string(host.capacity_bytes) +
                           " bytes holds no slot of " + std::to_string(slot_bytes));
  }
  if (host.capacity_bytes / slot_bytes > UINT32_MAX || hbm.capacity_bytes / slot_bytes > UINT32_MAX) {
    return Status::Invalid("more than 2^32 slots in a tier");
  }
  if (hbm.capacity_bytes > 0 && hbm.capacity_bytes < slot_bytes && !classes_at_registration) {
    return Status::Invalid("hbm tier: capacity holds no slot");
  }
  if (cuda_device < 0) return Status::Invalid("cuda_device is negative");
  double sum[3] = {0, 0, 0};
  for (size_t g = 0; g < groups.size(); ++g) {
    for (int t = 0; t < 3; ++t) {
      const double s = groups[g].share[t];
      if (!(s >= 0.0 && s <= 1.0) || (g == 0 && s != 0.0)) {
        return Status::Invalid("quota group " + std::to_string(g) + ": share " + std::to_string(s) +
                               (g == 0 ? " (group 0 has none)" : " not in [0, 1]"));
      }
      sum[t] += s;
      if (sum[t] > 1.0 + 1e-9) return Status::Invalid("quota groups: the shares of one tier add up to over 1");
    }
  }
  if (nvme.tier.capacity_bytes > 0) {
    if (nvme.dir.empty()) return Status::Invalid("nvme tier: empty dir");
    if (nvme.admission != Admission::kAlways && nvme.admission != Admission::kSecondHit &&
        nvme.admission != Admission::kReuse) {
      return Status::Invalid("nvme tier: unknown admission");
    }
    if (!(nvme.daily_write_budget_per_client > 0.0 && nvme.daily_write_budget_per_client <= 1.0)) {
      return Status::Invalid("nvme tier: daily_write_budget_per_client " +
                             std::to_string(nvme.daily_write_budget_per_client) + " not in (0, 1]");
    }
    if (nvme.queue_depth == 0 || nvme.queue_depth > 4096) {
      return Status::Invalid("nvme tier: queue_depth not in [1, 4096]");
    }
    if (!classes_at_registration &&
        (nvme.slab_bytes == 0 || nvme.slab_bytes % 4096 != 0 || nvme.slab_bytes < slot_bytes + 4096)) {
      return Status::Invalid("nvme tier: slab_bytes " + std::to_string(nvme.slab_bytes) +
                             " is not a 4096 multiple that holds a record of slot_bytes + 4096 (" +
                             std::to_string(slot_bytes + 4096) + ")");
    }
  }
  if (mover_batch == 0) return Status::Invalid("mover_batch is 0");
  if (!(host_to_hbm_gbps > 0) || !(nvme_read_gbps > 0)) return Status::Invalid("bandwidths must be > 0");
  if (remote.enabled()) {
    remote::ClusterOptions co;
    co.nodes = remote.nodes;
    co.connect_timeout_ms = remote.connect_timeout_ms;
    co.command_timeout_ms = remote.command_timeout_ms;
    co.pool_size = remote.pool_size;
    co.tls = remote.tls;
    Status s = co.Validate();
    if (!s.ok()) return Status::Invalid("remote tier: " + s.message());
    s = remote::CheckKeyPart(remote.key_prefix, "key_prefix");
    if (!s.ok()) return Status::Invalid("remote tier: " + s.message());
    if (!remote.user.empty() && remote.password_file.empty()) {
      return Status::Invalid("remote tier: a user needs a password_file");
    }
    if (remote.batch == 0 || remote.batch > 1024) return Status::Invalid("remote tier: batch not in [1, 1024]");
    if (!(remote.read_gbps > 0)) return Status::Invalid("remote tier: read_gbps must be > 0");
  }
  return Status::Ok();
}
}  // namespace kvtier::tiers
