// kvtierd: the kvtier daemon. See docs/daemon.md.
//
//   kvtierd --config PATH [--set section.key=value ...]
//   kvtierd --version
//
// Exit codes: 0 after a clean drain (SIGTERM/SIGINT), 2 for a usage or config error
// (one line on stderr naming the key), 1 when start-up fails for another reason.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "config/config.h"
#include "daemon/server.h"
#include "formats/wire.h"
#include "kvtier/version.h"

namespace {

void Usage(FILE* f) {
  std::fprintf(f,
               "usage: kvtierd --config PATH [--set section.key=value ...]\n"
               "  --config PATH   TOML config (see config/kvtier.toml)\n"
               "  --set K=V       override one key, e.g. --set tiers.host.capacity=4GiB\n"
               "  --check         validate the config and exit\n"
               "  --version       print the version and exit\n"
               "Signals: SIGHUP reloads eviction/admission settings; SIGTERM drains and exits.\n");
}

int ConfigError(const std::string& msg) {
  std::fprintf(stderr, "kvtierd: config error: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kvtier;
  std::string config_path;
  std::vector<config::Override> overrides;
  bool check_only = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      if (a.size() > n && a.compare(0, n, name) == 0 && a[n] == '=') return argv[i] + n + 1;
      if (a == name && i + 1 < argc) return argv[++i];
      return nullptr;
    };
    if (a == "--help" || a == "-h") {
      Usage(stdout);
      return 0;
    } else if (a == "--version") {
      std::printf("kvtierd %s (protocol %u)\n", KVTIER_VERSION_STRING, wire::kProtocolVersion);
      return 0;
    } else if (a == "--check") {
      check_only = true;
    } else if (a.rfind("--config", 0) == 0) {
      const char* v = value("--config");
      if (v == nullptr) return ConfigError("--config needs a path");
      config_path = v;
    } else if (a.rfind("--set", 0) == 0) {
      const char* v = value("--set");
      if (v == nullptr) return ConfigError("--set needs section.key=value");
      auto o = config::ParseOverride(v);
      if (!o.ok()) return ConfigError(o.status().message());
      overrides.push_back(*o);
    } else {
      std::fprintf(stderr, "kvtierd: unknown argument '%s'\n", a.c_str());
      Usage(stderr);
      return 2;
    }
  }
  if (config_path.empty()) {
    std::fprintf(stderr, "kvtierd: --config PATH is required\n");
    Usage(stderr);
    return 2;
  }
  auto cfg = config::LoadFile(config_path, overrides);
  if (!cfg.ok()) return ConfigError(cfg.status().message());
  Status paths = cfg->CheckPaths();
  if (!paths.ok()) return ConfigError(paths.message());
  if (check_only) {
    std::printf("kvtierd: %s is valid\n", config_path.c_str());
    return 0;
  }

  auto logger = spdlog::stderr_color_mt("kvtierd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(spdlog::level::from_str(cfg->daemon.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ kvtierd: %v");

  daemon::Daemon::Options opts;
  opts.config = *cfg;
  opts.config_path = config_path;
  opts.overrides = overrides;
  auto d = daemon::Daemon::Create(std::move(opts));
  if (!d.ok()) {
    std::fprintf(stderr, "kvtierd: cannot start: %s\n", d.status().message().c_str());
    return d.status().code() == StatusCode::kInvalid ? 2 : 1;
  }
  const auto& t = cfg->tiers;
  std::printf("kvtierd: listening on %s\n", (*d)->ListenDescription().c_str());
  std::printf("kvtierd: tiers: hbm %s, host %s, nvme %s in %s; slot %s\n",
              t.hbm.capacity_bytes ? config::FormatSize(t.hbm.capacity_bytes).c_str() : "off",
              t.host.capacity_bytes ? config::FormatSize(t.host.capacity_bytes).c_str() : "off",
              t.nvme.tier.capacity_bytes ? config::FormatSize(t.nvme.tier.capacity_bytes).c_str() : "off",
              t.nvme.dir.c_str(), config::FormatSize(t.slot_bytes).c_str());
  std::fflush(stdout);
  spdlog::info("kvtierd {} listening on {}", KVTIER_VERSION_STRING, (*d)->ListenDescription());
  return (*d)->Run();
}
