#include "daemon/metrics.h"

#include <cstdio>

#include "daemon/access.h"
#include "kvtier/version.h"

namespace kvtier::daemon {
namespace {
#ifdef KVTIER_HAVE_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif
}  // namespace

void Histogram::Observe(uint64_t nanos) {
  const double s = static_cast<double>(nanos) * 1e-9;
  size_t i = 0;
  while (i < kBounds.size() && s > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(nanos, std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& labels,
                       std::string* out) const {
  char buf[512];
  uint64_t cum = 0;
  for (size_t i = 0; i <= kBounds.size(); ++i) {
    cum += buckets_[i].load(std::memory_order_relaxed);
    if (i < kBounds.size()) {
      std::snprintf(buf, sizeof buf, "%s_bucket{%s,le=\"%g\"} %llu\n", name.c_str(), labels.c_str(),
                    kBounds[i], static_cast<unsigned long long>(cum));
    } else {
      std::snprintf(buf, sizeof buf, "%s_bucket{%s,le=\"+Inf\"} %llu\n", name.c_str(),
                    labels.c_str(), static_cast<unsigned long long>(cum));
    }
    *out += buf;
  }
  std::snprintf(buf, sizeof buf, "%s_sum{%s} %.9f\n%s_count{%s} %llu\n", name.c_str(),
                labels.c_str(), static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) * 1e-9,
                name.c_str(), labels.c_str(),
                static_cast<unsigned long long>(count_.load(std::memory_order_relaxed)));
  *out += buf;
}

void Metrics::ObserveRequest(uint16_t op, Transport t, uint64_t nanos, bool ok) {
  if (op > wire::kMaxOp) op = 0;
  request_latency[op][static_cast<int>(t)].Observe(nanos);
  if (!ok) request_failed[op][static_cast<int>(t)].fetch_add(1, std::memory_order_relaxed);
}

namespace {

void Family(std::string* out, const char* name, const char* type, const char* help) {
  *out += "# HELP ";
  *out += name;
  *out += " ";
  *out += help;
  *out += "\n# TYPE ";
  *out += name;
  *out += " ";
  *out += type;
  *out += "\n";
}

void Line(std::string* out, const std::string& name, const std::string& labels, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  *out += name;
  if (!labels.empty()) *out += "{" + labels + "}";
  *out += " ";
  *out += buf;
  *out += "\n";
}

}  // namespace

std::string Metrics::Render(const std::vector<tiers::TierStats>& tiers) const {
  std::string o;
  o.reserve(16384);
  struct TierMetric {
    const char* name;
    const char* type;
    const char* help;
    uint64_t tiers::TierStats::*field;
  };
  static const TierMetric kTierMetrics[] = {
      {"kvtier_tier_capacity_bytes", "gauge", "Configured capacity of the tier.",
       &tiers::TierStats::capacity_bytes},
      {"kvtier_tier_used_bytes", "gauge", "Bytes of the tier in use.", &tiers::TierStats::used_bytes},
      {"kvtier_tier_slots", "gauge", "Slots in the tier.", &tiers::TierStats::slots_total},
      {"kvtier_tier_slots_used", "gauge", "Slots in use.", &tiers::TierStats::slots_used},
      {"kvtier_tier_blocks", "gauge", "Committed blocks held by the tier.", &tiers::TierStats::blocks},
      {"kvtier_tier_pinned_blocks", "gauge", "Blocks pinned by leases.", &tiers::TierStats::pinned},
      {"kvtier_tier_hits_total", "counter", "Lookups answered by the tier.", &tiers::TierStats::hits},
      {"kvtier_tier_misses_total", "counter", "Lookups the tier could not answer.",
       &tiers::TierStats::misses},
      {"kvtier_tier_promotions_total", "counter", "Blocks promoted into the tier.",
       &tiers::TierStats::promotions_in},
      {"kvtier_tier_demotions_total", "counter", "Blocks demoted out of the tier.",
       &tiers::TierStats::demotions_out},
      {"kvtier_tier_bytes_read_total", "counter", "Bytes moved out of the tier.",
       &tiers::TierStats::bytes_read},
      {"kvtier_tier_bytes_written_total", "counter", "Bytes moved into the tier.",
       &tiers::TierStats::bytes_written},
      {"kvtier_tier_checksum_failures_total", "counter",
       "Blocks whose checksum failed (served as misses).", &tiers::TierStats::checksum_failures},
      {"kvtier_tier_admission_rejects_total", "counter", "Blocks refused by admission.",
       &tiers::TierStats::admission_rejects},
      {"kvtier_tier_errors_total", "counter",
       "Remote tier: answers lost to a down or slow node (served as misses).", &tiers::TierStats::errors},
      {"kvtier_tier_write_errors_total", "counter",
       "Remote tier: block writes that failed or were dropped by a full queue.",
       &tiers::TierStats::write_errors},
  };
  for (const auto& m : kTierMetrics) {
    Family(&o, m.name, m.type, m.help);
    for (const auto& t : tiers) {
      if (!t.present) continue;
      Line(&o, m.name, std::string("tier=\"") + tiers::TierName(t.tier) + "\"",
           static_cast<double>(t.*(m.field)));
    }
  }
  Family(&o, "kvtier_tier_slab_moves_total", "counter",
         "Slabs moved from one slot class to another (their blocks evicted first).");
  for (const auto& t : tiers) {
    if (!t.present || t.tier == tiers::Tier::kRemote) continue;
    Line(&o, "kvtier_tier_slab_moves_total", std::string("tier=\"") + tiers::TierName(t.tier) + "\"",
         static_cast<double>(t.slab_moves));
  }
  Family(&o, "kvtier_tier_evictions_total", "counter", "Blocks evicted from the tier, by reason.");
  for (const auto& t : tiers) {
    if (!t.present) continue;
    const std::string tl = std::string("tier=\"") + tiers::TierName(t.tier) + "\"";
    Line(&o, "kvtier_tier_evictions_total", tl + ",reason=\"demoted\"",
         static_cast<double>(t.evictions_demoted));
    Line(&o, "kvtier_tier_evictions_total", tl + ",reason=\"dropped\"",
         static_cast<double>(t.evictions_dropped));
  }
  Family(&o, "kvtier_tier_bandwidth_gbps", "gauge", "Measured tier bandwidth (GB/s).");
  for (const auto& t : tiers) {
    if (!t.present) continue;
    const std::string tl = std::string("tier=\"") + tiers::TierName(t.tier) + "\"";
    Line(&o, "kvtier_tier_bandwidth_gbps", tl + ",dir=\"read\"", t.read_gbps);
    Line(&o, "kvtier_tier_bandwidth_gbps", tl + ",dir=\"write\"", t.write_gbps);
  }

  Family(&o, "kvtier_request_duration_seconds", "histogram",
         "Time from reading a request to publishing its completion.");
  static const char* kTransport[2] = {"ring", "socket"};
  for (uint16_t op = 1; op <= wire::kMaxOp; ++op) {
    for (int t = 0; t < 2; ++t) {
      if (request_latency[op][t].count() == 0) continue;
      request_latency[op][t].Render("kvtier_request_duration_seconds",
                                    std::string("op=\"") + wire::OpName(op) + "\",transport=\"" +
                                        kTransport[t] + "\"",
                                    &o);
    }
  }
  Family(&o, "kvtier_requests_failed_total", "counter", "Requests answered with an error status.");
  for (uint16_t op = 1; op <= wire::kMaxOp; ++op) {
    for (int t = 0; t < 2; ++t) {
      const uint64_t v = request_failed[op][t].load(std::memory_order_relaxed);
      if (v == 0) continue;
      Line(&o, "kvtier_requests_failed_total",
           std::string("op=\"") + wire::OpName(op) + "\",transport=\"" + kTransport[t] + "\"",
           static_cast<double>(v));
    }
  }
  Family(&o, "kvtier_requests_malformed_total", "counter",
         "Requests refused by validation (bad field, region, op or version).");
  Line(&o, "kvtier_requests_malformed_total", "", static_cast<double>(requests_malformed.load()));
  Family(&o, "kvtier_bulk_requests_total", "counter",
         "Acquires and releases of more than 1024 blocks whose steps past the first 1024 ran on a thread of higher "
         "nice value (daemon.bulk_nice).");
  Line(&o, "kvtier_bulk_requests_total", "", static_cast<double>(bulk_requests.load()));
  Family(&o, "kvtier_bulk_takeovers_total", "counter",
         "Of them, those whose request thread ran the rest itself: the bulk thread got under an eighth of a core.");
  Line(&o, "kvtier_bulk_takeovers_total", "", static_cast<double>(bulk_takeovers.load()));
  Family(&o, "kvtier_clients", "gauge", "Clients attached now (a client that went away counts until its leases are released).");
  Line(&o, "kvtier_clients", "", static_cast<double>(clients.load()));
  Family(&o, "kvtier_clients_attached_total", "counter", "Successful attaches.");
  Line(&o, "kvtier_clients_attached_total", "", static_cast<double>(clients_attached.load()));
  Family(&o, "kvtier_attach_refused_total", "counter", "Attaches refused (version, limits).");
  Line(&o, "kvtier_attach_refused_total", "", static_cast<double>(attach_refused.load()));
  Family(&o, "kvtier_access_denied_total", "counter",
         "Attaches and admin requests refused by the peer's credentials ([security], [[tenants]]).");
  Line(&o, "kvtier_access_denied_total", "", static_cast<double>(access_denied.load()));
  Family(&o, "kvtier_clients_disconnected_total", "counter", "Client disconnects, by reason.");
  Line(&o, "kvtier_clients_disconnected_total", "reason=\"closed\"",
       static_cast<double>(disconnect_closed.load()));
  Line(&o, "kvtier_clients_disconnected_total", "reason=\"misbehaved\"",
       static_cast<double>(disconnect_misbehaved.load()));
  Family(&o, "kvtier_leases", "gauge", "Open leases of all clients.");
  Line(&o, "kvtier_leases", "", static_cast<double>(leases.load()));
  Family(&o, "kvtier_leased_slots", "gauge", "Slots held by open leases.");
  Line(&o, "kvtier_leased_slots", "", static_cast<double>(leased_slots.load()));
  // Build information: always 1; the labels carry the version (kvtier/version.h).
  Family(&o, "kvtier_build_info", "gauge", "Version of this kvtierd; the value is always 1.");
  Line(&o, "kvtier_build_info",
       std::string("version=\"") + KVTIER_VERSION_STRING + "\",protocol=\"" +
           std::to_string(wire::kProtocolVersion) + "\",cuda=\"" + (kBuiltWithCuda ? "yes" : "no") + "\"",
       1);
  Family(&o, "kvtier_commit_conflicts_total", "counter",
         "Commits of a key already cached with different bytes (tiers.on_conflict decided).");
  Line(&o, "kvtier_commit_conflicts_total", "", static_cast<double>(commit_conflicts.load()));
  Family(&o, "kvtier_commit_cached_total", "counter", "Commits of a key already cached, by its bytes.");
  Line(&o, "kvtier_commit_cached_total", "bytes=\"same\"", static_cast<double>(commit_cached_same.load()));
  Line(&o, "kvtier_commit_cached_total", "bytes=\"different\"", static_cast<double>(commit_conflicts.load()));
  Line(&o, "kvtier_commit_cached_total", "bytes=\"unchecked\"",
       static_cast<double>(commit_cached_unchecked.load()));
  Family(&o, "kvtier_config_reloads_total", "counter", "SIGHUP reloads, by result.");
  Line(&o, "kvtier_config_reloads_total", "result=\"ok\"", static_cast<double>(reloads.load()));
  Line(&o, "kvtier_config_reloads_total", "result=\"failed\"",
       static_cast<double>(reload_failures.load()));
  Family(&o, "kvtier_contract_file_corrupt_records_total", "counter",
         "Corrupt records of contracts.kvc skipped at start (the records around them kept).");
  Line(&o, "kvtier_contract_file_corrupt_records_total", "", static_cast<double>(contract_records_corrupt.load()));
  return o;
}

void Metrics::RenderClientBudget(uint64_t rejects, std::string* out) {
  Family(out, "kvtier_nvme_client_budget_rejects_total", "counter",
         "Demotions to NVMe refused: the committing client had spent its share of the daily write budget.");
  Line(out, "kvtier_nvme_client_budget_rejects_total", "", static_cast<double>(rejects));
}

void Metrics::RenderTenants(const std::vector<TenantRow>& rows, std::string* out) {
  if (rows.empty()) return;
  std::string& o = *out;
  static const char* kTier[3] = {"hbm", "host", "nvme"};
  struct PerTier {
    const char* name;
    const char* type;
    const char* help;
    const uint64_t (TenantRow::*field)[3];
  };
  static const PerTier kPerTier[] = {
      {"kvtier_tenant_blocks", "gauge", "Blocks of the tenant the tier holds.", &TenantRow::blocks},
      {"kvtier_tenant_quota_slots", "gauge", "The tenant's share of the tier, in slots.", &TenantRow::quota_slots},
      {"kvtier_tenant_evictions_total", "counter", "Copies of the tenant's blocks evicted from the tier.",
       &TenantRow::evictions},
  };
  for (const auto& m : kPerTier) {
    Family(&o, m.name, m.type, m.help);
    for (const auto& r : rows) {
      for (int t = 0; t < 3; ++t) {
        Line(&o, m.name, "tenant=\"" + r.name + "\",tier=\"" + kTier[t] + "\"", static_cast<double>((r.*(m.field))[t]));
      }
    }
  }
  struct Scalar {
    const char* name;
    const char* help;
    uint64_t TenantRow::*field;
  };
  static const Scalar kScalar[] = {
      {"kvtier_tenant_lookup_keys_total", "Keys the tenant's clients looked up.", &TenantRow::lookup_keys},
      {"kvtier_tenant_lookup_hits_total", "Blocks the tenant's lookups found.", &TenantRow::lookup_hits},
      {"kvtier_tenant_committed_total", "Blocks the tenant's clients committed.", &TenantRow::committed},
      {"kvtier_tenant_access_denied_total", "Admin requests of the tenant's clients refused.",
       &TenantRow::access_denied},
  };
  for (const auto& m : kScalar) {
    Family(&o, m.name, "counter", m.help);
    for (const auto& r : rows) Line(&o, m.name, "tenant=\"" + r.name + "\"", static_cast<double>(r.*(m.field)));
  }
}

TenantRow MakeTenantRow(Tenants& tenants, uint32_t t, const std::vector<tiers::GroupStats>& groups) {
  TenantRow r;
  r.name = t == kSharedOwner ? "shared" : tenants.access().tenant_name(t);
  const uint32_t g = tenants.group_of(t);
  if (g < groups.size()) {
    for (int k = 0; k < 3; ++k) {
      r.blocks[k] = groups[g].blocks[k];
      r.quota_slots[k] = groups[g].quota[k];
      r.evictions[k] = groups[g].evictions[k];
    }
  }
  TenantCounters& tc = tenants.counters(t);
  r.lookup_keys = tc.lookup_keys.load(std::memory_order_relaxed);
  r.lookup_hits = tc.lookup_hits.load(std::memory_order_relaxed);
  r.committed = tc.committed.load(std::memory_order_relaxed);
  r.access_denied = tc.access_denied.load(std::memory_order_relaxed);
  return r;
}

}  // namespace kvtier::daemon
