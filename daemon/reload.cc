// The config's tier settings as the TierManager's options, and the reload of the config
// (SIGHUP, kvtierctl config reload): the eviction and admission settings change, what
// needs a restart is reported and kept.
#include <spdlog/spdlog.h>

#include "daemon/server_impl.h"
#include "tiers/policy/policy.h"

namespace kvtier::daemon {

namespace {

tiers::TierOptions TierOf(const config::TierConfig& t, const tiers::PolicyOptions& knobs) {
  tiers::TierOptions o;
  o.capacity_bytes = t.capacity_bytes;
  // config::Config::Validate checked the name against the same table; an unknown one
  // cannot reach this point, and would fail TierOptions::Validate rather than become lru.
  o.policy = static_cast<tiers::PolicyKind>(tiers::kPolicyNames.size());
  (void)tiers::ParsePolicy(t.policy, &o.policy);
  o.policy_options = knobs;
  o.high_watermark = t.high_watermark;
  o.low_watermark = t.low_watermark;
  o.on_evict = t.on_evict == "drop" ? tiers::OnEvict::kDrop : tiers::OnEvict::kDemote;
  return o;
}

spdlog::level::level_enum LevelOf(const std::string& s) { return spdlog::level::from_str(s); }

}  // namespace

tiers::TierManagerOptions ToTierManagerOptions(const config::Config& c) {
  tiers::TierManagerOptions o;
  o.slot_bytes = c.tiers.slot_bytes;
  o.slot_classes = c.tiers.SlotClasses();  // "auto" resolved
  o.slab_bytes = c.tiers.SlabBytes();
  o.classes_at_registration = c.tiers.slot_classes_per_contract;  // slot_bytes: the largest block
  o.hbm = TierOf(c.tiers.hbm, c.tiers.policy);
  o.cuda_device = c.tiers.cuda_device;
  // Config::Validate checked the name: ParseHbmCopy cannot fail here.
  const auto copy = tiers::ParseHbmCopy(c.tiers.hbm_copy);
  o.hbm_copy = copy.ok() ? *copy : tiers::HbmCopy::kAuto;
  o.hbm_copy_streams = static_cast<int>(c.tiers.hbm_copy_streams);
  o.trace_copies = c.daemon.trace_copies;
  o.on_conflict = c.tiers.on_conflict == "replace"         ? tiers::OnConflict::kReplace
                  : c.tiers.on_conflict == "drop-disputed" ? tiers::OnConflict::kDropDisputed
                                                           : tiers::OnConflict::kKeepFirst;
  o.host = TierOf(c.tiers.host, c.tiers.policy);
  o.nvme.tier = TierOf(c.tiers.nvme.tier, c.tiers.policy);
  o.nvme.tier.on_evict = tiers::OnEvict::kDrop;
  o.nvme.dir = c.tiers.nvme.dir.empty() ? "" : Abs(c.tiers.nvme.dir);
  // Config::Validate checked the name: always, second-hit or reuse.
  o.nvme.admission = c.tiers.nvme.admission == "second-hit" ? tiers::Admission::kSecondHit
                     : c.tiers.nvme.admission == "reuse"    ? tiers::Admission::kReuse
                                                            : tiers::Admission::kAlways;
  o.nvme.daily_write_budget_bytes = c.tiers.nvme.daily_write_budget_bytes;
  o.nvme.daily_write_budget_per_client = c.tiers.nvme.daily_write_budget_per_client;
  o.nvme.queue_depth = c.tiers.nvme.queue_depth;
  o.nvme.verify_on_restart = c.tiers.nvme.verify_on_restart;
  o.nvme.slab_bytes = c.tiers.nvme.slab_bytes;
  o.remote.nodes = c.tiers.remote.nodes;
  o.remote.connect_timeout_ms = c.tiers.remote.connect_timeout_ms;
  o.remote.command_timeout_ms = c.tiers.remote.command_timeout_ms;
  o.remote.pool_size = c.tiers.remote.pool_size;
  o.remote.compress = c.tiers.remote.compress;
  o.remote.user = c.tiers.remote.user;
  o.remote.password_file = c.tiers.remote.password_file.empty() ? "" : Abs(c.tiers.remote.password_file);
  o.remote.tls.enabled = c.tiers.remote.tls;
  o.remote.tls.ca_file = c.tiers.remote.tls_ca_file.empty() ? "" : Abs(c.tiers.remote.tls_ca_file);
  o.remote.tls.cert_file = c.tiers.remote.tls_cert_file.empty() ? "" : Abs(c.tiers.remote.tls_cert_file);
  o.remote.tls.key_file = c.tiers.remote.tls_key_file.empty() ? "" : Abs(c.tiers.remote.tls_key_file);
  o.remote.tls.server_name = c.tiers.remote.tls_server_name;
  o.remote.tls.verify = c.tiers.remote.tls_verify;
  o.remote.key_prefix = c.tiers.remote.key_prefix;
  o.remote.write = c.tiers.remote.write == "write-through" ? remote::RemoteWrite::kWriteThrough
                   : c.tiers.remote.write == "off"         ? remote::RemoteWrite::kOff
                                                           : remote::RemoteWrite::kOnDemote;
  // Quota groups with tenants (Tenants::group_of): the implicit tenant, each [[tenants]]
  // table in order, the shared namespace. The implicit tenant and the shared namespace
  // have no share.
  if (!c.tenants.empty()) {
    o.groups.resize(c.tenants.size() + 2);
    for (size_t i = 0; i < c.tenants.size(); ++i) {
      o.groups[i + 1].share[0] = c.tenants[i].hbm_share;
      o.groups[i + 1].share[1] = c.tenants[i].host_share;
      o.groups[i + 1].share[2] = c.tenants[i].nvme_share;
    }
    // Each tenant's host share a part of its own, which its clients map (Session).
    o.host_parts = c.tiers.host_tenant_parts;
  }
  return o;
}

Status Daemon::Impl::Reload(std::string* summary) {
  std::lock_guard<std::mutex> rl(reload_mu_);
  // Any client may ask for reloads in a loop: the lines of one reload go out together, at
  // most one reload's per interval.
  uint64_t held = 0;
  const bool log = reload_log_.Allow(&held);
  if (log && held > 0) spdlog::info("SIGHUP: {} reloads not logged since the last one", held);
  if (opts_.config_path.empty()) {
    if (log) spdlog::warn("SIGHUP: no config file to reload");
    return Status::Unsupported("the daemon was started without a config file: nothing to reload");
  }
  auto nc = config::LoadFile(opts_.config_path, opts_.overrides);
  if (!nc.ok()) {
    if (log) spdlog::error("SIGHUP: config error, nothing changed: {}", nc.status().message());
    metrics_.reload_failures.fetch_add(1);
    return Status::Invalid("config error, nothing changed: " + nc.status().message());
  }
  const config::Config& o = opts_.config;
  const config::Config& n = *nc;
  std::string notes;
  auto ignored = [&notes, log](const char* key) {
    if (log) spdlog::warn("SIGHUP: {} changed; it needs a restart and is ignored", key);
    notes += std::string(notes.empty() ? "" : "; ") + key + " changed: needs a restart, ignored";
  };
  if (n.tiers.slot_bytes != o.tiers.slot_bytes) ignored("tiers.slot_bytes");
  if (n.tiers.SlotClasses() != o.tiers.SlotClasses() ||
      n.tiers.slot_classes_per_contract != o.tiers.slot_classes_per_contract) {
    ignored("tiers.slot_classes");
  }
  if (n.tiers.SlabBytes() != o.tiers.SlabBytes()) ignored("tiers.slab_bytes");
  if (n.tiers.hbm.capacity_bytes != o.tiers.hbm.capacity_bytes) ignored("tiers.hbm.capacity");
  if (n.tiers.host.capacity_bytes != o.tiers.host.capacity_bytes) ignored("tiers.host.capacity");
  if (n.tiers.nvme.tier.capacity_bytes != o.tiers.nvme.tier.capacity_bytes) ignored("tiers.nvme.capacity");
  if (n.tiers.nvme.dir != o.tiers.nvme.dir) ignored("tiers.nvme.dir");
  if (n.tiers.nvme.slab_bytes != o.tiers.nvme.slab_bytes) ignored("tiers.nvme.slab_bytes");
  if (n.tiers.cuda_device != o.tiers.cuda_device) ignored("tiers.hbm.cuda_device");
  if (n.daemon.socket != o.daemon.socket) ignored("daemon.socket");
  {
    const auto& a = n.security;
    const auto& b = o.security;
    if (a.socket_owner != b.socket_owner || a.socket_group != b.socket_group || a.socket_mode != b.socket_mode ||
        a.attach_uids != b.attach_uids || a.attach_gids != b.attach_gids || a.admin_uids != b.admin_uids ||
        a.admin_gids != b.admin_gids || a.unmatched != b.unmatched) {
      ignored("security");
    }
    bool tenants_changed = n.tenants.size() != o.tenants.size();
    for (size_t i = 0; !tenants_changed && i < n.tenants.size(); ++i) {
      const auto& x = n.tenants[i];
      const auto& y = o.tenants[i];
      tenants_changed = x.name != y.name || x.uids != y.uids || x.gids != y.gids || x.hbm_share != y.hbm_share ||
                        x.host_share != y.host_share || x.nvme_share != y.nvme_share || x.admin != y.admin;
    }
    if (tenants_changed) ignored("tenants");
  }
  if (n.daemon.metrics_port != o.daemon.metrics_port || n.daemon.metrics_address != o.daemon.metrics_address) {
    ignored("daemon.metrics_port/metrics_address");
  }
  if (n.daemon.ring_entries != o.daemon.ring_entries || n.daemon.ring_data_bytes != o.daemon.ring_data_bytes) {
    ignored("daemon.ring_entries/ring_data_bytes");
  }
  // Keep what cannot change; take the eviction and admission settings.
  config::Config merged = o;
  auto take = [](config::TierConfig& dst, const config::TierConfig& src) {
    dst.policy = src.policy;
    dst.high_watermark = src.high_watermark;
    dst.low_watermark = src.low_watermark;
    dst.on_evict = src.on_evict;
  };
  take(merged.tiers.hbm, n.tiers.hbm);
  take(merged.tiers.host, n.tiers.host);
  take(merged.tiers.nvme.tier, n.tiers.nvme.tier);
  merged.tiers.policy = n.tiers.policy;
  merged.tiers.nvme.admission = n.tiers.nvme.admission;
  merged.tiers.nvme.daily_write_budget_bytes = n.tiers.nvme.daily_write_budget_bytes;
  merged.tiers.nvme.daily_write_budget_per_client = n.tiers.nvme.daily_write_budget_per_client;
  merged.daemon.log_level = n.daemon.log_level;
  merged.tiers.on_conflict = n.tiers.on_conflict;
  merged.tiers.host_staging_slots_per_client = n.tiers.host_staging_slots_per_client;  // new clients
  Status s = tm_->Reconfigure(ToTierManagerOptions(merged));
  if (!s.ok()) {
    if (log) spdlog::error("SIGHUP: tiers refused the new settings, nothing changed: {}", s.ToString());
    metrics_.reload_failures.fetch_add(1);
    return Status::Rejected("tiers refused the new settings, nothing changed: " + s.ToString());
  }
  spdlog::set_level(LevelOf(merged.daemon.log_level));
  // Only the fields a reload takes: the io thread reads the others at the same time.
  take(opts_.config.tiers.hbm, n.tiers.hbm);
  take(opts_.config.tiers.host, n.tiers.host);
  take(opts_.config.tiers.nvme.tier, n.tiers.nvme.tier);
  opts_.config.tiers.policy = merged.tiers.policy;
  opts_.config.tiers.nvme.admission = merged.tiers.nvme.admission;
  opts_.config.tiers.nvme.daily_write_budget_bytes = merged.tiers.nvme.daily_write_budget_bytes;
  opts_.config.tiers.nvme.daily_write_budget_per_client = merged.tiers.nvme.daily_write_budget_per_client;
  opts_.config.daemon.log_level = merged.daemon.log_level;
  // The counter moves after the log line, so whoever sees the reload counted also finds its line.
  if (log) {
    spdlog::info("SIGHUP: reloaded eviction/admission settings from {} (host policy {}, watermarks {}/{}; nvme admission {})",
               opts_.config_path, merged.tiers.host.policy, merged.tiers.host.low_watermark,
               merged.tiers.host.high_watermark, merged.tiers.nvme.admission);
  }
  metrics_.reloads.fetch_add(1);
  if (summary) {
    *summary = "reloaded eviction/admission settings from " + opts_.config_path;
    if (!notes.empty()) *summary += " (" + notes + ")";
  }
  return Status::Ok();
}

}  // namespace kvtier::daemon
