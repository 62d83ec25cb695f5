// A kvtierd child process on a fresh temporary folder, for the benchmarks and
// `kvtierctl bench replay --spawn`: the kvtierd binary beside the running executable,
// a config written into the folder, ready once its socket accepts a connection.
// The destructor stops it (SIGTERM, wait) and removes the folder.
#pragma once

#include <sys/types.h>

#include <string>

#include "formats/status.h"

namespace kvtier::bench {

struct DaemonProc {
  pid_t pid = -1;
  std::string dir, socket;
  DaemonProc() = default;
  DaemonProc(const DaemonProc&) = delete;
  DaemonProc& operator=(const DaemonProc&) = delete;
  ~DaemonProc();
};

// `tiers_toml` holds the [tiers...] sections; "{dir}" in it is replaced by the folder.
// `daemon_extra` adds lines to [daemon] (socket, log_level = warn and metrics_port = 0
// are set here). pin_cpu >= 0 pins the daemon to that CPU. Waits up to wait_s seconds.
Status StartDaemon(DaemonProc* d, const std::string& tiers_toml, const std::string& daemon_extra = "",
                   int pin_cpu = -1, double wait_s = 15.0);

}  // namespace kvtier::bench
