// Daemon metrics: counters and latency histograms, rendered as Prometheus text.
//
// Everything here is lock-free (relaxed atomics): request threads of every client update
// it on the hot path. Tier figures are not copied here; Render() takes a fresh
// TierManager::Stats() snapshot each time /metrics is scraped.
//
// Exposed families (all prefixed kvtier_):
//   tier_capacity_bytes, tier_used_bytes, tier_slots, tier_slots_used, tier_blocks,
//   tier_pinned_blocks, tier_hits_total, tier_misses_total, tier_promotions_total,
//   tier_demotions_total, tier_bytes_read_total, tier_bytes_written_total,
//   tier_checksum_failures_total, tier_evictions_total{reason=demoted|dropped},
//   tier_admission_rejects_total                                   {tier="hbm|host|nvme"}
//   request_duration_seconds (histogram)                {op="lookup|...",transport="ring|socket"}
//   requests_failed_total{op,transport}, requests_malformed_total, bulk_requests_total,
//   bulk_takeovers_total, clients, clients_attached_total,
//   clients_disconnected_total{reason}, access_denied_total, leases, leased_slots,
//   build_info{version,protocol,cuda} (always 1), contract_file_corrupt_records_total,
//   nvme_client_budget_rejects_total (demotions refused: the committing client had spent
//   its share of the daily NVMe write budget)
// With [[tenants]] and daemon.metrics_tenants = true (RenderTenants; off by default: any
// local user reads the port), per tenant ("default", each table, "shared"):
//   tenant_blocks, tenant_quota_slots, tenant_evictions_total      {tenant,tier="hbm|host|nvme"}
//   tenant_lookup_keys_total, tenant_lookup_hits_total, tenant_committed_total,
//   tenant_access_denied_total                                     {tenant}
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "formats/wire.h"
#include "tiers/tier_manager.h"

namespace kvtier::daemon {

// Fixed-bucket latency histogram (upper bounds in seconds, 1 us .. 5 s).
class Histogram {
 public:
  static constexpr std::array<double, 20> kBounds = {
      1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3,
      2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1,  0.2,  0.5,  1.0,  5.0};
  void Observe(uint64_t nanos);
  // Appends the _bucket/_sum/_count lines for `name{labels,le=...}`.
  void Render(const std::string& name, const std::string& labels, std::string* out) const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};  // last: +Inf
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_nanos_{0};
};

enum class Transport : uint8_t { kRing = 0, kSocket = 1 };

// One tenant's figures for /metrics (the fields of wire::AdminTenantStats).
struct TenantRow {
  std::string name;
  uint64_t blocks[3] = {0, 0, 0}, quota_slots[3] = {0, 0, 0}, evictions[3] = {0, 0, 0};
  uint64_t lookup_keys = 0, lookup_hits = 0, committed = 0, access_denied = 0;
};

class Tenants;
// Tenant t's row (kSharedOwner: the shared namespace) from its quota group's stats
// (TierManager::GroupStatsAll) and its counters: /metrics and the tenant-stats admin op.
TenantRow MakeTenantRow(Tenants& tenants, uint32_t t, const std::vector<tiers::GroupStats>& groups);

struct Metrics {
  std::array<std::array<Histogram, 2>, wire::kMaxOp + 1> request_latency;  // [op][transport]
  std::array<std::array<std::atomic<uint64_t>, 2>, wire::kMaxOp + 1> request_failed{};
  std::atomic<uint64_t> requests_malformed{0};
  // Big acquires and releases handed to a session's bulk thread (daemon/bulk_runner.h), and
  // those whose own thread took over from a starved bulk thread.
  std::atomic<uint64_t> bulk_requests{0};
  std::atomic<uint64_t> bulk_takeovers{0};
  std::atomic<int64_t> clients{0};
  std::atomic<uint64_t> clients_attached{0};
  std::atomic<uint64_t> attach_refused{0};
  std::atomic<uint64_t> access_denied{0};  // attaches and admin requests refused by [security]
  std::atomic<uint64_t> disconnect_closed{0};      // socket closed (exit or crash)
  std::atomic<uint64_t> disconnect_misbehaved{0};  // too many bad requests, broken ring
  std::atomic<int64_t> leases{0};
  std::atomic<int64_t> leased_slots{0};
  std::atomic<uint64_t> reloads{0};
  std::atomic<uint64_t> reload_failures{0};
  // Commits of a key already cached, by what the bytes were (same, different, unchecked).
  std::atomic<uint64_t> commit_cached_same{0};
  std::atomic<uint64_t> commit_conflicts{0};
  std::atomic<uint64_t> commit_cached_unchecked{0};
  std::atomic<uint64_t> contract_records_corrupt{0};  // contracts.kvc records skipped at start

  void ObserveRequest(uint16_t op, Transport t, uint64_t nanos, bool ok);

  // Prometheus text exposition (version 0.0.4).
  std::string Render(const std::vector<tiers::TierStats>& tiers) const;
  // Appends nvme_client_budget_rejects_total (TierManager::ClientBudgetRejects).
  static void RenderClientBudget(uint64_t rejects, std::string* out);
  // Appends the per-tenant families (none for no rows).
  static void RenderTenants(const std::vector<TenantRow>& rows, std::string* out);
};

}  // namespace kvtier::daemon
