#include "config/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <sstream>

#include <toml++/toml.h>

namespace kvtier::config {

namespace {

// ---- Schema -----------------------------------------------------------------------------

using Apply = std::function<Status(const toml::node&, const std::string& key, Config&)>;

struct Entry {
  std::string key;
  Apply apply;
};

Status TypeError(const std::string& key, const char* want) {
  return Status::Invalid(key + ": expected " + want);
}

template <typename Get>
Apply StringField(Get get) {
  return [get](const toml::node& n, const std::string& key, Config& c) -> Status {
    auto v = n.value<std::string>();
    if (!v || !n.is_string()) return TypeError(key, "a string");
    *get(c) = *v;
    return Status::Ok();
  };
}

template <typename Get>
Apply SizeField(Get get) {
  return [get](const toml::node& n, const std::string& key, Config& c) -> Status {
    if (n.is_integer()) {
      const int64_t v = *n.value<int64_t>();
      if (v < 0) return Status::Invalid(key + ": size " + std::to_string(v) + " is negative");
      *get(c) = static_cast<uint64_t>(v);
      return Status::Ok();
    }
    if (!n.is_string()) return TypeError(key, "a size such as \"4GiB\"");
    auto s = ParseSize(*n.value<std::string>());
    if (!s.ok()) return Status::Invalid(key + ": " + s.status().message());
    *get(c) = *s;
    return Status::Ok();
  };
}

template <typename T, typename Get>
Apply IntField(Get get, int64_t lo, int64_t hi) {
  return [get, lo, hi](const toml::node& n, const std::string& key, Config& c) -> Status {
    if (!n.is_integer()) return TypeError(key, "an integer");
    const int64_t v = *n.value<int64_t>();
    if (v < lo || v > hi) {
      return Status::Invalid(key + ": " + std::to_string(v) + " not in [" + std::to_string(lo) +
                             ", " + std::to_string(hi) + "]");
    }
    *get(c) = static_cast<T>(v);
    return Status::Ok();
  };
}

template <typename Get>
Apply DoubleField(Get get) {
  return [get](const toml::node& n, const std::string& key, Config& c) -> Status {
    if (!n.is_floating_point() && !n.is_integer()) return TypeError(key, "a number");
    const double v = *n.value<double>();
    if (!std::isfinite(v)) return Status::Invalid(key + ": not a finite number");
    *get(c) = v;
    return Status::Ok();
  };
}

template <typename Get>
Apply BoolField(Get get) {
  return [get](const toml::node& n, const std::string& key, Config& c) -> Status {
    if (!n.is_boolean()) return TypeError(key, "true or false");
    *get(c) = *n.value<bool>();
    return Status::Ok();
  };
}

// An array of strings, or one string of comma-separated items (handy for --set).
template <typename Get>
Apply StringListField(Get get) {
  return [get](const toml::node& n, const std::string& key, Config& c) -> Status {
    std::vector<std::string> out;
    if (n.is_string()) {
      std::stringstream ss(*n.value<std::string>());
      std::string item;
      while (std::getline(ss, item, ',')) {
        if (!item.empty()) out.push_back(item);
      }
    } else if (n.is_array()) {
      for (const auto& e : *n.as_array()) {
        if (!e.is_string()) return TypeError(key, "an array of strings");
        out.push_back(*e.value<std::string>());
      }
    } else {
      return TypeError(key, "an array of strings such as [\"127.0.0.1:7000\"]");
    }
    *get(c) = std::move(out);
    return Status::Ok();
  };
}

// An array of ids (uids, gids): integers in [0, 4294967294] (4294967295 is the kernel's
// "no id").
Status ParseIds(const toml::node& n, const std::string& key, std::vector<uint32_t>* out) {
  if (!n.is_array()) return TypeError(key, "an array of integers such as [1000, 1001]");
  std::vector<uint32_t> ids;
  for (const auto& e : *n.as_array()) {
    if (!e.is_integer()) return TypeError(key, "an array of integers such as [1000, 1001]");
    const int64_t v = *e.value<int64_t>();
    if (v < 0 || v > 4294967294LL) return Status::Invalid(key + ": id " + std::to_string(v) + " not in [0, 4294967294]");
    ids.push_back(static_cast<uint32_t>(v));
  }
  *out = std::move(ids);
  return Status::Ok();
}

template <typename Get>
Apply IdListField(Get get) {
  return [get](const toml::node& n, const std::string& key, Config& c) -> Status {
    return ParseIds(n, key, get(c));
  };
}

// A file mode: TOML octal (0o660) or a string of octal digits ("0660"), at most 0777.
template <typename Get>
Apply ModeField(Get get) {
  return [get](const toml::node& n, const std::string& key, Config& c) -> Status {
    int64_t v = -1;
    if (n.is_integer()) {
      v = *n.value<int64_t>();
    } else if (n.is_string()) {
      const std::string t = *n.value<std::string>();
      if (t.empty() || t.size() > 4 || t.find_first_not_of("01234567") != std::string::npos) {
        return Status::Invalid(key + ": \"" + t + "\" is not an octal mode such as \"0660\"");
      }
      v = std::stol(t, nullptr, 8);
    } else {
      return TypeError(key, "an octal mode such as 0o660 or \"0660\"");
    }
    if (v < 0 || v > 0777) {
      return Status::Invalid(key + ": " + std::to_string(v) + " is not a mode in [0, 0o777] (write 0o660 or \"0660\")");
    }
    *get(c) = static_cast<uint32_t>(v);
    return Status::Ok();
  };
}

// An array of sizes (integers or strings such as "576KiB"), or one string of
// comma-separated sizes (handy for --set).
template <typename Get>
Apply SizeListField(Get get) {
  return [get](const toml::node& n, const std::string& key, Config& c) -> Status {
    std::vector<uint64_t> out;
    auto add = [&](const std::string& item) -> Status {
      auto v = ParseSize(item);
      if (!v.ok()) return Status::Invalid(key + ": " + v.status().message());
      out.push_back(*v);
      return Status::Ok();
    };
    if (n.is_string()) {
      std::stringstream ss(*n.value<std::string>());
      std::string item;
      while (std::getline(ss, item, ',')) {
        if (!item.empty()) KVTIER_RETURN_IF_ERROR(add(item));
      }
    } else if (n.is_array()) {
      for (const auto& e : *n.as_array()) {
        if (e.is_integer() && *e.value<int64_t>() >= 0) {
          out.push_back(static_cast<uint64_t>(*e.value<int64_t>()));
        } else if (e.is_string()) {
          KVTIER_RETURN_IF_ERROR(add(*e.value<std::string>()));
        } else {
          return TypeError(key, "an array of sizes such as [\"576KiB\", \"1440KiB\"]");
        }
      }
    } else {
      return TypeError(key, "an array of sizes such as [\"576KiB\", \"1440KiB\"]");
    }
    *get(c) = std::move(out);
    return Status::Ok();
  };
}

// One [[tenants]] table.
Status ParseTenant(const toml::table& t, const std::string& key, TenantConfig* out) {
  TenantConfig tc;
  bool named = false;
  for (auto&& [k, node] : t) {
    const toml::node& v = node;  // clang before 16 cannot capture a structured binding in a lambda
    const std::string name(k.str());
    const std::string fk = key + "." + name;
    auto number = [&](double* d) -> Status {
      if (!v.is_floating_point() && !v.is_integer()) return TypeError(fk, "a number");
      *d = *v.value<double>();
      if (!std::isfinite(*d)) return Status::Invalid(fk + ": not a finite number");
      return Status::Ok();
    };
    if (name == "name") {
      if (!v.is_string()) return TypeError(fk, "a string");
      tc.name = *v.value<std::string>();
      named = true;
    } else if (name == "uids") {
      KVTIER_RETURN_IF_ERROR(ParseIds(v, fk, &tc.uids));
    } else if (name == "gids") {
      KVTIER_RETURN_IF_ERROR(ParseIds(v, fk, &tc.gids));
    } else if (name == "hbm_share") {
      KVTIER_RETURN_IF_ERROR(number(&tc.hbm_share));
    } else if (name == "host_share") {
      KVTIER_RETURN_IF_ERROR(number(&tc.host_share));
    } else if (name == "nvme_share") {
      KVTIER_RETURN_IF_ERROR(number(&tc.nvme_share));
    } else if (name == "admin") {
      if (!v.is_boolean()) return TypeError(fk, "true or false");
      tc.admin = *v.value<bool>();
    } else {
      return Status::Invalid(fk + ": unknown key (a tenant has name, uids, gids, hbm_share, host_share, "
                                  "nvme_share, admin)");
    }
  }
  if (!named) return Status::Invalid(key + ".name: missing (every [[tenants]] table names its tenant)");
  *out = std::move(tc);
  return Status::Ok();
}

// [[tenants]]: an array of tables (inline tables too, for --set).
Status ApplyTenants(const toml::node& n, const std::string& key, Config& c) {
  if (!n.is_array()) return TypeError(key, "[[tenants]] tables");
  std::vector<TenantConfig> out;
  size_t i = 0;
  for (const auto& e : *n.as_array()) {
    const std::string k = key + "[" + std::to_string(i++) + "]";
    if (!e.is_table()) return TypeError(k, "a table");
    TenantConfig tc;
    KVTIER_RETURN_IF_ERROR(ParseTenant(*e.as_table(), k, &tc));
    out.push_back(std::move(tc));
  }
  c.tenants = std::move(out);
  return Status::Ok();
}

void AddTier(std::vector<Entry>& s, const std::string& prefix, TierConfig* (*tier)(Config&)) {
  s.push_back({prefix + ".capacity", SizeField([tier](Config& c) { return &tier(c)->capacity_bytes; })});
  s.push_back({prefix + ".policy", StringField([tier](Config& c) { return &tier(c)->policy; })});
  s.push_back({prefix + ".high_watermark",
               DoubleField([tier](Config& c) { return &tier(c)->high_watermark; })});
  s.push_back({prefix + ".low_watermark",
               DoubleField([tier](Config& c) { return &tier(c)->low_watermark; })});
  s.push_back({prefix + ".on_evict", StringField([tier](Config& c) { return &tier(c)->on_evict; })});
}

const std::vector<Entry>& Schema() {
  static const std::vector<Entry> schema = [] {
    std::vector<Entry> s;
    s.push_back({"daemon.socket", StringField([](Config& c) { return &c.daemon.socket; })});
    s.push_back({"daemon.log_level", StringField([](Config& c) { return &c.daemon.log_level; })});
    s.push_back({"daemon.metrics_address",
                 StringField([](Config& c) { return &c.daemon.metrics_address; })});
    s.push_back({"daemon.metrics_port",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.metrics_port; }, 0, 65535)});
    s.push_back({"daemon.metrics_max_connections",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.metrics_max_connections; }, 1, 1024)});
    s.push_back({"daemon.metrics_tenants", BoolField([](Config& c) { return &c.daemon.metrics_tenants; })});
    s.push_back({"daemon.ring_entries",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.ring_entries; }, 0, 1 << 30)});
    s.push_back({"daemon.ring_data_bytes",
                 SizeField([](Config& c) { return &c.daemon.ring_data_bytes; })});
    s.push_back({"daemon.max_clients",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_clients; }, 1, 4096)});
    s.push_back({"daemon.max_unattached",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_unattached; }, 1, 4096)});
    s.push_back({"daemon.max_unattached_per_uid",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_unattached_per_uid; }, 1, 4096)});
    s.push_back({"daemon.attach_timeout_ms",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.attach_timeout_ms; }, 1, 600000)});
    s.push_back({"daemon.max_socket_queue_bytes",
                 SizeField([](Config& c) { return &c.daemon.max_socket_queue_bytes; })});
    s.push_back({"daemon.max_keys_per_request",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_keys_per_request; }, 1,
                                    1 << 20)});
    s.push_back({"daemon.max_leases_per_client",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_leases_per_client; }, 1,
                                    1 << 24)});
    s.push_back({"daemon.max_tier_share_per_client",
                 DoubleField([](Config& c) { return &c.daemon.max_tier_share_per_client; })});
    s.push_back({"daemon.max_contracts_per_client",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_contracts_per_client; }, 1, 1 << 20)});
    s.push_back({"daemon.contract_sweep_ms",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.contract_sweep_ms; }, 100, 86400000)});
    s.push_back({"daemon.max_clients_per_uid",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_clients_per_uid; }, 1, 4096)});
    s.push_back({"daemon.max_clients_per_pid",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_clients_per_pid; }, 1, 4096)});
    s.push_back({"daemon.max_clients_per_tenant",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_clients_per_tenant; }, 1, 4096)});
    s.push_back({"daemon.max_async_acquires_per_client",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_async_acquires_per_client; }, 1,
                                    1024)});
    s.push_back({"daemon.max_bad_requests",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_bad_requests; }, 1,
                                    1 << 20)});
    s.push_back({"daemon.bad_request_decay_ms",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.bad_request_decay_ms; }, 1,
                                    1 << 30)});
    s.push_back({"daemon.spin_us",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.spin_us; }, 0, 100000)});
    s.push_back({"daemon.max_spinning_rings",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.max_spinning_rings; }, 0, 4096)});
    s.push_back({"daemon.bulk_nice",
                 IntField<uint32_t>([](Config& c) { return &c.daemon.bulk_nice; }, 0, 19)});
    s.push_back({"daemon.trace_copies", BoolField([](Config& c) { return &c.daemon.trace_copies; })});
    s.push_back({"security.socket_owner", StringField([](Config& c) { return &c.security.socket_owner; })});
    s.push_back({"security.socket_group", StringField([](Config& c) { return &c.security.socket_group; })});
    s.push_back({"security.socket_mode", ModeField([](Config& c) { return &c.security.socket_mode; })});
    s.push_back({"security.attach_uids", IdListField([](Config& c) { return &c.security.attach_uids; })});
    s.push_back({"security.attach_gids", IdListField([](Config& c) { return &c.security.attach_gids; })});
    s.push_back({"security.admin_uids", IdListField([](Config& c) { return &c.security.admin_uids; })});
    s.push_back({"security.admin_gids", IdListField([](Config& c) { return &c.security.admin_gids; })});
    s.push_back({"security.unmatched", StringField([](Config& c) { return &c.security.unmatched; })});
    s.push_back({"tenants", ApplyTenants});
    s.push_back({"tiers.slot_bytes", SizeField([](Config& c) { return &c.tiers.slot_bytes; })});
    s.push_back({"tiers.on_conflict", StringField([](Config& c) { return &c.tiers.on_conflict; })});
    // "auto" or a list of sizes; "auto" or a size.
    s.push_back({"tiers.slot_classes", [](const toml::node& n, const std::string& key, Config& c) -> Status {
                   const bool per_contract = n.is_string() && *n.value<std::string>() == "per-contract";
                   c.tiers.slot_classes_per_contract = per_contract;
                   c.tiers.slot_classes_auto = n.is_string() && *n.value<std::string>() == "auto";
                   if (c.tiers.slot_classes_auto || per_contract) {
                     c.tiers.slot_classes.clear();
                     return Status::Ok();
                   }
                   return SizeListField([](Config& c) { return &c.tiers.slot_classes; })(n, key, c);
                 }});
    s.push_back({"tiers.slab_bytes", [](const toml::node& n, const std::string& key, Config& c) -> Status {
                   if (n.is_string() && *n.value<std::string>() == "auto") {
                     c.tiers.slab_bytes = 0;
                     return Status::Ok();
                   }
                   KVTIER_RETURN_IF_ERROR(SizeField([](Config& c) { return &c.tiers.slab_bytes; })(n, key, c));
                   if (c.tiers.slab_bytes == 0) return Status::Invalid(key + ": 0 (write \"auto\" for the default)");
                   return Status::Ok();
                 }});
    AddTier(s, "tiers.hbm", [](Config& c) { return &c.tiers.hbm; });
    s.push_back({"tiers.hbm.cuda_device",
                 IntField<int32_t>([](Config& c) { return &c.tiers.cuda_device; }, 0, 1024)});
    s.push_back({"tiers.hbm.copy", StringField([](Config& c) { return &c.tiers.hbm_copy; })});
    s.push_back({"tiers.hbm.copy_streams",
                 IntField<uint32_t>([](Config& c) { return &c.tiers.hbm_copy_streams; }, 1, 8)});
    AddTier(s, "tiers.host", [](Config& c) { return &c.tiers.host; });
    s.push_back({"tiers.host.staging_slots_per_client",
                 IntField<uint32_t>([](Config& c) { return &c.tiers.host_staging_slots_per_client; }, 0,
                                    1u << 30)});
    s.push_back({"tiers.host.staging_bytes_total",
                 SizeField([](Config& c) { return &c.tiers.host_staging_bytes_total; })});
    s.push_back({"tiers.host.tenant_parts", BoolField([](Config& c) { return &c.tiers.host_tenant_parts; })});
    AddTier(s, "tiers.nvme", [](Config& c) { return &c.tiers.nvme.tier; });
    s.push_back({"tiers.nvme.dir", StringField([](Config& c) { return &c.tiers.nvme.dir; })});
    s.push_back({"tiers.nvme.admission",
                 StringField([](Config& c) { return &c.tiers.nvme.admission; })});
    s.push_back({"tiers.nvme.daily_write_budget",
                 SizeField([](Config& c) { return &c.tiers.nvme.daily_write_budget_bytes; })});
    s.push_back({"tiers.nvme.daily_write_budget_per_client",
                 DoubleField([](Config& c) { return &c.tiers.nvme.daily_write_budget_per_client; })});
    s.push_back({"tiers.nvme.queue_depth",
                 IntField<uint32_t>([](Config& c) { return &c.tiers.nvme.queue_depth; }, 1, 4096)});
    s.push_back({"tiers.nvme.slab_bytes", SizeField([](Config& c) { return &c.tiers.nvme.slab_bytes; })});
    s.push_back({"tiers.nvme.verify_on_restart",
                 BoolField([](Config& c) { return &c.tiers.nvme.verify_on_restart; })});
    s.push_back({"tiers.remote.nodes", StringListField([](Config& c) { return &c.tiers.remote.nodes; })});
    s.push_back({"tiers.remote.connect_timeout_ms",
                 IntField<uint32_t>([](Config& c) { return &c.tiers.remote.connect_timeout_ms; }, 1, 60000)});
    s.push_back({"tiers.remote.command_timeout_ms",
                 IntField<uint32_t>([](Config& c) { return &c.tiers.remote.command_timeout_ms; }, 1, 60000)});
    s.push_back({"tiers.remote.pool_size",
                 IntField<uint32_t>([](Config& c) { return &c.tiers.remote.pool_size; }, 1, 256)});
    s.push_back({"tiers.remote.write", StringField([](Config& c) { return &c.tiers.remote.write; })});
    s.push_back({"tiers.remote.compress", BoolField([](Config& c) { return &c.tiers.remote.compress; })});
    s.push_back({"tiers.remote.user", StringField([](Config& c) { return &c.tiers.remote.user; })});
    s.push_back({"tiers.remote.password_file",
                 StringField([](Config& c) { return &c.tiers.remote.password_file; })});
    s.push_back({"tiers.remote.tls", BoolField([](Config& c) { return &c.tiers.remote.tls; })});
    s.push_back({"tiers.remote.tls_ca_file", StringField([](Config& c) { return &c.tiers.remote.tls_ca_file; })});
    s.push_back({"tiers.remote.tls_cert_file", StringField([](Config& c) { return &c.tiers.remote.tls_cert_file; })});
    s.push_back({"tiers.remote.tls_key_file", StringField([](Config& c) { return &c.tiers.remote.tls_key_file; })});
    s.push_back({"tiers.remote.tls_server_name",
                 StringField([](Config& c) { return &c.tiers.remote.tls_server_name; })});
    s.push_back({"tiers.remote.tls_verify", BoolField([](Config& c) { return &c.tiers.remote.tls_verify; })});
    s.push_back({"tiers.remote.key_prefix", StringField([](Config& c) { return &c.tiers.remote.key_prefix; })});
    s.push_back({"tiers.policy.s3fifo_small_fraction",
                 DoubleField([](Config& c) { return &c.tiers.policy.s3fifo_small_fraction; })});
    s.push_back({"tiers.policy.reuse_protected_fraction",
                 DoubleField([](Config& c) { return &c.tiers.policy.reuse_protected_fraction; })});
    s.push_back({"tiers.policy.reuse_ghost_factor",
                 DoubleField([](Config& c) { return &c.tiers.policy.reuse_ghost_factor; })});
    s.push_back({"tiers.policy.tinylfu_window_fraction",
                 DoubleField([](Config& c) { return &c.tiers.policy.tinylfu_window_fraction; })});
    s.push_back({"tiers.policy.reuse_density", BoolField([](Config& c) { return &c.tiers.policy.reuse_density; })});
    s.push_back({"tiers.policy.reuse_adapt", BoolField([](Config& c) { return &c.tiers.policy.reuse_adapt; })});
    s.push_back(
        {"tiers.policy.reuse_lru_guard", BoolField([](Config& c) { return &c.tiers.policy.reuse_lru_guard; })});
    return s;
  }();
  return schema;
}

const Entry* FindEntry(const std::string& key) {
  for (const auto& e : Schema()) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

bool IsSection(const std::string& path) {
  return path == "daemon" || path == "security" || path == "tiers" || path == "tiers.hbm" || path == "tiers.host" ||
         path == "tiers.nvme" || path == "tiers.remote" || path == "tiers.policy";
}

std::string Where(const std::string& source, const toml::node& n) {
  const auto& src = n.source();
  if (src.begin.line == 0) return "";
  return " (" + source + ":" + std::to_string(src.begin.line) + ")";
}

// Walks a table, applying each leaf to the config in file order. Unknown keys and
// tables are errors naming the dotted key.
Status ApplyTable(const toml::table& t, const std::string& prefix, const std::string& source,
                  Config& c) {
  for (auto&& [k, v] : t) {
    const std::string key = prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (v.is_table()) {
      if (key == "tenants") return Status::Invalid("tenants: expected [[tenants]] tables" + Where(source, v));
      if (!IsSection(key)) return Status::Invalid(key + ": unknown section" + Where(source, v));
      KVTIER_RETURN_IF_ERROR(ApplyTable(*v.as_table(), key, source, c));
      continue;
    }
    const Entry* e = FindEntry(key);
    if (e == nullptr) {
      if (IsSection(key)) return Status::Invalid(key + ": expected a [" + key + "] table");
      return Status::Invalid(key + ": unknown key" + Where(source, v));
    }
    KVTIER_RETURN_IF_ERROR(e->apply(v, key, c));
  }
  return Status::Ok();
}

bool InSet(const std::string& v, std::initializer_list<const char*> set) {
  for (const char* s : set) {
    if (v == s) return true;
  }
  return false;
}

std::string Num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

Status ValidateTier(const std::string& p, const TierConfig& t, uint64_t slot_bytes) {
  if (tiers::PolicyIndex(t.policy) < 0) {
    return Status::Invalid(p + ".policy: \"" + t.policy + "\" is not one of " + tiers::PolicyNameList());
  }
  if (!InSet(t.on_evict, {"demote", "drop"})) {
    return Status::Invalid(p + ".on_evict: \"" + t.on_evict + "\" is not demote or drop");
  }
  if (!(t.high_watermark > 0.0 && t.high_watermark <= 1.0)) {
    return Status::Invalid(p + ".high_watermark: " + Num(t.high_watermark) + " not in (0, 1]");
  }
  if (!(t.low_watermark > 0.0 && t.low_watermark < t.high_watermark)) {
    return Status::Invalid(p + ".low_watermark: " + Num(t.low_watermark) + " must be above 0 and below " +
                           p + ".high_watermark (" + Num(t.high_watermark) + ")");
  }
  if (t.capacity_bytes != 0 && t.capacity_bytes < slot_bytes) {
    return Status::Invalid(p + ".capacity: " + FormatSize(t.capacity_bytes) +
                           " holds no slot of tiers.slot_bytes (" + FormatSize(slot_bytes) + ")");
  }
  return Status::Ok();
}

// tiers.slot_classes as a list or "auto" (classes fixed at start): the list, its slabs and
// the NVMe slabs that hold a record of slot_bytes.
Status ValidateListedClasses(const TiersConfig& t) {
  if (t.slot_classes.size() > 4) {
    return Status::Invalid("tiers.slot_classes: " + std::to_string(t.slot_classes.size()) +
                           " classes; at most 4 are supported");
  }
  for (size_t i = 0; i < t.slot_classes.size(); ++i) {
    const uint64_t v = t.slot_classes[i];
    if (v == 0 || v % 4096 != 0) {
      return Status::Invalid("tiers.slot_classes: " + std::to_string(v) + " is not a positive multiple of 4096");
    }
    for (size_t j = 0; j < i; ++j) {
      if (t.slot_classes[j] == v) return Status::Invalid("tiers.slot_classes: " + FormatSize(v) + " is listed twice");
    }
  }
  if (!t.slot_classes_auto && !t.slot_classes.empty() &&
      *std::max_element(t.slot_classes.begin(), t.slot_classes.end()) != t.slot_bytes) {
    return Status::Invalid("tiers.slot_classes: the largest class must be tiers.slot_bytes (" +
                           FormatSize(t.slot_bytes) + "), the slot of the HBM and NVMe tiers");
  }
  if (t.SlotClasses().size() > 1) {
    const uint64_t slab = t.SlabBytes();
    if (slab % 4096 != 0 || slab < t.slot_bytes || slab > (uint64_t{1} << 30)) {
      return Status::Invalid("tiers.slab_bytes: " + FormatSize(slab) +
                             " is not a multiple of 4KiB in [tiers.slot_bytes (" + FormatSize(t.slot_bytes) + "), 1GiB]");
    }
    if (t.host.capacity_bytes != 0 && t.host.capacity_bytes < slab) {
      return Status::Invalid("tiers.host.capacity: " + FormatSize(t.host.capacity_bytes) +
                             " holds no slab of tiers.slab_bytes (" + FormatSize(slab) + ")");
    }
  }
  if (t.nvme.slab_bytes % 4096 != 0 || t.nvme.slab_bytes < t.slot_bytes + 4096 ||
      t.nvme.slab_bytes > (uint64_t{1} << 30)) {
    return Status::Invalid("tiers.nvme.slab_bytes: " + FormatSize(t.nvme.slab_bytes) +
                           " is not a multiple of 4KiB in [tiers.slot_bytes + 4KiB (" + FormatSize(t.slot_bytes + 4096) +
                           "), 1GiB]");
  }
  return Status::Ok();
}

// A folder that exists must be a writable, searchable directory; one that does not must
// have an existing writable ancestor (it is created at start).
Status CheckFolder(const std::string& key, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  if (ec) return Status::Invalid(key + ": cannot resolve \"" + dir + "\": " + ec.message());
  fs::path probe = p;
  while (true) {
    struct stat st;
    if (::stat(probe.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        return Status::Invalid(key + ": " + probe.string() + " is not a folder");
      }
      if (::access(probe.c_str(), W_OK | X_OK) != 0) {
        return Status::Invalid(key + ": no write permission on folder " + probe.string() + " (" +
                               std::strerror(errno) + ")");
      }
      return Status::Ok();
    }
    if (errno != ENOENT) {
      return Status::Invalid(key + ": cannot access " + probe.string() + ": " + std::strerror(errno));
    }
    if (!probe.has_parent_path() || probe.parent_path() == probe) {
      return Status::Invalid(key + ": no existing parent folder for " + p.string());
    }
    probe = probe.parent_path();
  }
}

}  // namespace

Config::Config() {
  tiers.host.capacity_bytes = uint64_t{1} << 30;
  tiers.nvme.tier.capacity_bytes = uint64_t{2} << 30;
  tiers.nvme.tier.on_evict = "drop";
}

std::vector<uint64_t> TiersConfig::SlotClasses() const {
  if (slot_classes_per_contract) return {};  // made at registration, none at start
  if (!slot_classes_auto) return slot_classes.size() == 1 && slot_classes[0] == slot_bytes ? std::vector<uint64_t>{}
                                                                                            : slot_classes;
  std::vector<uint64_t> c;
  for (uint64_t b : kCommonBlockBytes) {
    if (b < slot_bytes) c.push_back(b);
  }
  if (c.empty()) return {};  // one class of slot_bytes
  while (c.size() > 3) c.erase(c.begin());  // at most 4 classes: the largest common ones
  c.push_back(slot_bytes);
  // "auto" never stops a start: a host tier too small for one slab gets one class.
  uint64_t lcm = 1;
  for (uint64_t b : c) lcm = std::lcm(lcm, b);
  const uint64_t slab = std::min(lcm, kMaxAutoSlabBytes);
  if (slab < slot_bytes || (host.capacity_bytes != 0 && host.capacity_bytes < slab)) return {};
  return c;
}

uint64_t TiersConfig::SlabBytes() const {
  if (slab_bytes != 0) return slab_bytes;
  uint64_t lcm = 1;
  for (uint64_t b : SlotClasses()) lcm = std::lcm(lcm, b);
  return std::max(std::min(lcm, kMaxAutoSlabBytes), slot_bytes);
}

Status Config::Validate() const {
  const auto& d = daemon;
  if (d.socket.empty()) return Status::Invalid("daemon.socket: empty path");
  {
    const std::string abs = std::filesystem::absolute(d.socket).string();
    if (abs.size() > 107) {
      return Status::Invalid("daemon.socket: " + abs + " is longer than a unix socket path allows (107 bytes)");
    }
  }
  if (!InSet(d.log_level, {"trace", "debug", "info", "warn", "error", "critical", "off"})) {
    return Status::Invalid("daemon.log_level: \"" + d.log_level +
                           "\" is not trace, debug, info, warn, error, critical or off");
  }
  if (!InSet(d.metrics_address, {"127.0.0.1", "::1", "localhost"})) {
    return Status::Invalid("daemon.metrics_address: \"" + d.metrics_address +
                           "\" is not a loopback address (127.0.0.1, ::1 or localhost)");
  }
  if (d.metrics_port > 65535) return Status::Invalid("daemon.metrics_port: over 65535");
  if (d.ring_entries < 8 || d.ring_entries > 65536 || (d.ring_entries & (d.ring_entries - 1)) != 0) {
    return Status::Invalid("daemon.ring_entries: " + std::to_string(d.ring_entries) +
                           " is not a power of two in [8, 65536]");
  }
  if (d.max_socket_queue_bytes < (64u << 10) || d.max_socket_queue_bytes > (uint64_t{1} << 30)) {
    return Status::Invalid("daemon.max_socket_queue_bytes: " + FormatSize(d.max_socket_queue_bytes) +
                           " is not in [64KiB, 1GiB]");
  }
  if (!(d.max_tier_share_per_client > 0.0 && d.max_tier_share_per_client <= 1.0)) {
    return Status::Invalid("daemon.max_tier_share_per_client: " + std::to_string(d.max_tier_share_per_client) +
                           " is not in (0, 1]");
  }
  if (d.ring_data_bytes < (64u << 10) || d.ring_data_bytes > (uint64_t{1} << 30) ||
      d.ring_data_bytes % 4096 != 0) {
    return Status::Invalid("daemon.ring_data_bytes: " + FormatSize(d.ring_data_bytes) +
                           " is not a multiple of 4KiB in [64KiB, 1GiB]");
  }
  const auto& t = tiers;
  if (t.slot_bytes == 0 || t.slot_bytes % 4096 != 0 || t.slot_bytes > (uint64_t{4} << 30)) {
    return Status::Invalid("tiers.slot_bytes: " + std::to_string(t.slot_bytes) +
                           " is not a positive multiple of 4096 up to 4GiB");
  }
  // Per-contract: slot_bytes is the largest block; each tier's slabs and granule follow
  // its capacity (a tier smaller than the largest block is one slab and limits blocks to
  // it), so a tier needs no more than one 4 KiB slot.
  if (!t.slot_classes_per_contract) KVTIER_RETURN_IF_ERROR(ValidateListedClasses(t));
  const uint64_t least_slot = t.slot_classes_per_contract ? 4096 : t.slot_bytes;
  KVTIER_RETURN_IF_ERROR(ValidateTier("tiers.hbm", t.hbm, least_slot));
  if (!InSet(t.hbm_copy, {"auto", "kernel", "batch", "loop"})) {
    return Status::Invalid("tiers.hbm.copy: \"" + t.hbm_copy + "\" is not auto, kernel, batch or loop");
  }
  if (t.hbm_copy_streams < 1 || t.hbm_copy_streams > 8) {
    return Status::Invalid("tiers.hbm.copy_streams: " + std::to_string(t.hbm_copy_streams) + " not in [1, 8]");
  }
  KVTIER_RETURN_IF_ERROR(ValidateTier("tiers.host", t.host, least_slot));
  if (!InSet(t.on_conflict, {"keep-first", "replace", "drop-disputed"})) {
    return Status::Invalid("tiers.on_conflict: \"" + t.on_conflict + "\" is not keep-first, replace or drop-disputed");
  }
  // The most host slots a client's alloc leases can hold: those of the smallest class.
  const std::vector<uint64_t> classes = t.SlotClasses();
  const uint64_t smallest = classes.empty() ? least_slot : *std::min_element(classes.begin(), classes.end());
  if (smallest > 0 && t.host_staging_slots_per_client > t.host.capacity_bytes / smallest) {
    return Status::Invalid("tiers.host.staging_slots_per_client: " + std::to_string(t.host_staging_slots_per_client) +
                           " is more than the host tier's " + std::to_string(t.host.capacity_bytes / smallest) +
                           " slots");
  }
  KVTIER_RETURN_IF_ERROR(ValidateTier("tiers.nvme", t.nvme.tier, least_slot));
  if (std::string why = t.policy.Check(); !why.empty()) {
    return Status::Invalid("tiers.policy." + why);
  }
  if (t.nvme.tier.on_evict != "drop") {
    return Status::Invalid("tiers.nvme.on_evict: the last tier can only drop");
  }
  if (t.host.capacity_bytes == 0 && t.hbm.capacity_bytes == 0) {
    return Status::Invalid(
        "tiers.host.capacity: 0 with no HBM tier leaves clients nowhere to write blocks");
  }
  if (t.nvme.tier.capacity_bytes != 0 && t.nvme.dir.empty()) {
    return Status::Invalid("tiers.nvme.dir: empty path with an NVMe capacity");
  }
  if (!t.slot_classes_per_contract && t.nvme.tier.capacity_bytes != 0 &&
      t.nvme.tier.capacity_bytes < t.slot_bytes + 4096) {
    // A record is a slot plus a 4 KiB header; the NVMe tier must hold one. (Per contract,
    // the tier's capacity caps the blocks it takes instead: TierManager.)
    return Status::Invalid("tiers.nvme.capacity: " + FormatSize(t.nvme.tier.capacity_bytes) +
                           " holds no record of a slot (tiers.slot_bytes " + FormatSize(t.slot_bytes) +
                           " plus a 4KiB header): give it at least " + std::to_string(t.slot_bytes + 4096) + " bytes" +
                           ", lower tiers.slot_bytes, or set it to 0 for no NVMe tier");
  }
  if (!InSet(t.nvme.admission, {"always", "second-hit", "reuse"})) {
    return Status::Invalid("tiers.nvme.admission: \"" + t.nvme.admission +
                           "\" is not always, second-hit or reuse");
  }
  if (!(t.nvme.daily_write_budget_per_client > 0.0 && t.nvme.daily_write_budget_per_client <= 1.0)) {
    return Status::Invalid("tiers.nvme.daily_write_budget_per_client: " +
                           std::to_string(t.nvme.daily_write_budget_per_client) + " is not in (0, 1]");
  }
  if (!InSet(t.remote.write, {"on-demote", "write-through", "off"})) {
    return Status::Invalid("tiers.remote.write: \"" + t.remote.write + "\" is not on-demote, write-through or off");
  }
  for (const std::string& n : t.remote.nodes) {
    const size_t colon = n.rfind(':');
    const std::string port = colon == std::string::npos ? "" : n.substr(colon + 1);
    const bool digits = !port.empty() && port.size() <= 5 &&
                        std::all_of(port.begin(), port.end(), [](unsigned char ch) { return std::isdigit(ch); });
    if (colon == std::string::npos || colon == 0 || !digits || std::stoul(port) == 0 || std::stoul(port) > 65535) {
      return Status::Invalid("tiers.remote.nodes: \"" + n + "\" is not host:port (port in [1, 65535])");
    }
  }
  const RemoteConfig& r = t.remote;
  auto printable = [](const std::string& v, bool braces_ok) {
    return std::all_of(v.begin(), v.end(), [&](unsigned char ch) {
      return ch > 0x20 && ch < 0x7f && (braces_ok || (ch != '{' && ch != '}'));
    });
  };
  if (r.key_prefix.size() > 64 || !printable(r.key_prefix, false)) {
    return Status::Invalid("tiers.remote.key_prefix: \"" + r.key_prefix +
                           "\" is not at most 64 bytes of printable ASCII without spaces or braces");
  }
  if (r.user.size() > 128 || !printable(r.user, true)) {
    return Status::Invalid("tiers.remote.user: \"" + r.user + "\" is not at most 128 bytes of printable ASCII without spaces");
  }
  if (!r.user.empty() && r.password_file.empty()) {
    return Status::Invalid("tiers.remote.user: set without tiers.remote.password_file (the password is read from a file)");
  }
  if (!r.tls) {
    for (const auto& [key, v] : {std::pair<const char*, const std::string*>{"tls_ca_file", &r.tls_ca_file},
                                 {"tls_cert_file", &r.tls_cert_file},
                                 {"tls_key_file", &r.tls_key_file},
                                 {"tls_server_name", &r.tls_server_name}}) {
      if (!v->empty()) return Status::Invalid(std::string("tiers.remote.") + key + ": set while tiers.remote.tls = false");
    }
  }
  if (r.tls_cert_file.empty() != r.tls_key_file.empty()) {
    return Status::Invalid(r.tls_cert_file.empty() ? "tiers.remote.tls_key_file: set without tiers.remote.tls_cert_file"
                                                   : "tiers.remote.tls_cert_file: set without tiers.remote.tls_key_file");
  }
  const auto& sec = security;
  if (!InSet(sec.unmatched, {"default", "refuse"})) {
    return Status::Invalid("security.unmatched: \"" + sec.unmatched + "\" is not default or refuse");
  }
  if (sec.socket_mode > 0777) return Status::Invalid("security.socket_mode: over 0o777");
  for (const auto* owner : {&sec.socket_owner, &sec.socket_group}) {
    for (unsigned char ch : *owner) {
      if (!(std::isalnum(ch) || ch == '_' || ch == '-' || ch == '.')) {
        return Status::Invalid(std::string(owner == &sec.socket_owner ? "security.socket_owner" : "security.socket_group") +
                               ": \"" + *owner + "\" is not a user/group name or number");
      }
    }
  }
  if (tenants.size() > 1024) return Status::Invalid("tenants: " + std::to_string(tenants.size()) + " tables, at most 1024");
  std::map<std::string, size_t> names;
  std::map<uint32_t, std::string> uid_owner, gid_owner;
  double share[3] = {0, 0, 0};
  for (size_t i = 0; i < tenants.size(); ++i) {
    const TenantConfig& tc = tenants[i];
    const std::string k = "tenants[" + std::to_string(i) + "]";
    const bool ok_name = !tc.name.empty() && tc.name.size() <= 64 &&
                         std::all_of(tc.name.begin(), tc.name.end(), [](unsigned char ch) {
                           return std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-';
                         });
    if (!ok_name) {
      return Status::Invalid(k + ".name: \"" + tc.name + "\" is not 1-64 characters of [A-Za-z0-9._-]");
    }
    if (tc.name == "default" || tc.name == "shared") {
      return Status::Invalid(k + ".name: \"" + tc.name + "\" is reserved (the implicit tenant and the shared namespace)");
    }
    if (!names.emplace(tc.name, i).second) return Status::Invalid(k + ".name: tenant \"" + tc.name + "\" twice");
    if (tc.uids.empty() && tc.gids.empty()) {
      return Status::Invalid(k + ": tenant \"" + tc.name + "\" has neither uids nor gids (no client could be in it)");
    }
    for (uint32_t u : tc.uids) {
      auto [it, fresh] = uid_owner.emplace(u, tc.name);
      if (!fresh && it->second != tc.name) {
        return Status::Invalid(k + ".uids: uid " + std::to_string(u) + " is in tenants \"" + it->second + "\" and \"" +
                               tc.name + "\"");
      }
    }
    for (uint32_t g : tc.gids) {
      auto [it, fresh] = gid_owner.emplace(g, tc.name);
      if (!fresh && it->second != tc.name) {
        return Status::Invalid(k + ".gids: gid " + std::to_string(g) + " is in tenants \"" + it->second + "\" and \"" +
                               tc.name + "\"");
      }
    }
    const double s3[3] = {tc.hbm_share, tc.host_share, tc.nvme_share};
    const char* sk[3] = {"hbm_share", "host_share", "nvme_share"};
    for (int t = 0; t < 3; ++t) {
      if (!(s3[t] >= 0.0 && s3[t] <= 1.0)) {
        return Status::Invalid(k + "." + sk[t] + ": " + Num(s3[t]) + " not in [0, 1]");
      }
      share[t] += s3[t];
      if (share[t] > 1.0 + 1e-9) {
        return Status::Invalid(k + "." + sk[t] + ": the tenants' " + sk[t] + "s add up to " + Num(share[t]) +
                               ", over 1");
      }
    }
  }
  return Status::Ok();
}

Status Config::CheckPaths() const {
  if (tiers.nvme.tier.capacity_bytes != 0) {
    KVTIER_RETURN_IF_ERROR(CheckFolder("tiers.nvme.dir", tiers.nvme.dir));
  }
  const auto parent = std::filesystem::absolute(daemon.socket).parent_path();
  return CheckFolder("daemon.socket", parent.string());
}

StatusOr<Override> ParseOverride(std::string_view arg) {
  const size_t eq = arg.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    return Status::Invalid("--set " + std::string(arg) + ": expected section.key=value");
  }
  return Override{std::string(arg.substr(0, eq)), std::string(arg.substr(eq + 1))};
}

StatusOr<Config> LoadString(std::string_view toml_text, const std::vector<Override>& overrides,
                            const std::string& source) {
  Config c;
  c.source = source;
  try {
    toml::table t = toml::parse(toml_text, source);
    KVTIER_RETURN_IF_ERROR(ApplyTable(t, "", source, c));
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return Status::Invalid(source + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                           ": " + std::string(e.description()));
  }
  for (const auto& o : overrides) {
    const Entry* e = FindEntry(o.key);
    if (e == nullptr) return Status::Invalid(o.key + ": unknown key (in --set)");
    // Read the value as TOML when it is one ("4", "true", "0.9", "\"x\""), else as a string.
    toml::table vt;
    try {
      vt = toml::parse("v = " + o.value);
    } catch (const toml::parse_error&) {
      vt = toml::table{};
      vt.insert("v", o.value);
    }
    const toml::node* n = vt.get("v");
    if (n == nullptr) return Status::Invalid(o.key + ": empty value (in --set)");
    // A bare word that TOML would read as something else entirely (e.g. a date) is meant
    // as a string when the key wants one.
    Status s = e->apply(*n, o.key, c);
    if (!s.ok() && !n->is_string()) {
      toml::table st;
      st.insert("v", o.value);
      Status s2 = e->apply(*st.get("v"), o.key, c);
      if (s2.ok()) s = Status::Ok();
    }
    if (!s.ok()) return Status::Invalid(s.message() + " (in --set)");
  }
  KVTIER_RETURN_IF_ERROR(c.Validate());
  return c;
}

StatusOr<Config> LoadFile(const std::string& path, const std::vector<Override>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Invalid("--config " + path + ": cannot open: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::Invalid("--config " + path + ": cannot read");
  return LoadString(ss.str(), overrides, path);
}

std::vector<std::string> SchemaKeys() {
  std::vector<std::string> keys;
  for (const auto& e : Schema()) keys.push_back(e.key);
  return keys;
}

}  // namespace kvtier::config
