// kvtierd's process: the control server (Boost.Asio, unix socket), the metrics endpoint
// (Boost.Beast, loopback HTTP), signal handling, and the sessions of attached clients.
//
// One io_context thread runs the control sockets, /metrics and the signals; each attached
// client has its own ring thread (daemon/session.h); the TierManager has its own workers.
// The io thread never waits for another thread: work that can take long or that waits
// for a ring thread runs on one of two single-thread pools instead.
//   - admin: config reloads (SIGHUP) and the socket path's admin requests (listings,
//     inspect, verify, flush, reload). A ring-path admin request runs on its client's
//     ring thread, which may take its time without holding anyone else up.
//   - closer: the end of a session (Session::Close joins the ring thread, waits for its
//     in-flight acquires and releases its leases).
// Nothing these pools run waits for the io thread, and a ring thread waits for neither
// pool, so no thread waits on one that can wait on it. Config reloads are serialised by
// one mutex wherever they run.
//
// Start-up is all-or-nothing (Create): the config has been validated by the caller, the
// socket path is checked for a live daemon, folders are created, the TierManager opened,
// then both listeners bound. Any failure returns a one-line Status and leaves nothing
// running (the TierManager is closed again).
//
// Signals: SIGHUP re-reads the config file (with the same --set overrides) and applies
// the eviction and admission settings through TierManager::Reconfigure; settings that
// need a restart (sizes, folders, socket, ports, rings) are reported and ignored, and a
// config that fails validation changes nothing. SIGTERM/SIGINT drain: stop accepting,
// let each client's ring thread finish what is already in its ring, wait for in-flight
// acquires, release every lease, close the sockets, then close the TierManager.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"
#include "formats/status.h"
#include "tiers/tier_manager.h"

namespace kvtier::daemon {

// Maps the config's tier sections onto the TierManager's options.
tiers::TierManagerOptions ToTierManagerOptions(const config::Config& c);

class Daemon {
 public:
  struct Options {
    config::Config config;                    // validated (Validate + CheckPaths)
    std::string config_path;                  // re-read on SIGHUP ("" = no reload)
    std::vector<config::Override> overrides;  // re-applied on SIGHUP
  };

  static StatusOr<std::unique_ptr<Daemon>> Create(Options opts);
  ~Daemon();

  // Serves until SIGTERM/SIGINT; returns the process exit code (0 after a clean drain).
  int Run();

  // "unix:/abs/path.sock" and "http://127.0.0.1:9464/metrics" (or "off").
  std::string ListenDescription() const;

  class Impl;

 private:
  explicit Daemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::daemon
