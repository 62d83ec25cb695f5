#include "tools/bench/daemon_proc.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

namespace kvtier::bench {

DaemonProc::~DaemonProc() {
  if (pid > 0) {
    ::kill(pid, SIGTERM);
    int st;
    ::waitpid(pid, &st, 0);
  }
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

Status StartDaemon(DaemonProc* d, const std::string& tiers_toml, const std::string& daemon_extra,
                   int pin_cpu, double wait_s) {
  char tmpl[] = "/tmp/kvtier-daemon-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Status::IoError("mkdtemp failed");
  d->dir = tmpl;
  d->socket = d->dir + "/kvtierd.sock";
  const std::string cfg = d->dir + "/kvtier.toml";
  std::string tiers = tiers_toml;
  for (size_t p; (p = tiers.find("{dir}")) != std::string::npos;) tiers.replace(p, 5, d->dir);
  {
    std::ofstream o(cfg);
    o << "[daemon]\nsocket = \"" << d->socket << "\"\nlog_level = \"warn\"\nmetrics_port = 0\n"
      << daemon_extra << "\n" << tiers << "\n";
    if (!o) return Status::IoError("cannot write " + cfg);
  }
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string bin = std::filesystem::path(self).parent_path().string() + "/kvtierd";
  if (::access(bin.c_str(), X_OK) != 0) return Status::NotFound(bin + " not found (build kvtierd)");
  d->pid = ::fork();
  if (d->pid < 0) return Status::IoError("fork failed");
  if (d->pid == 0) {
    if (pin_cpu >= 0) {  // its ring threads inherit this mask when clients attach
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(pin_cpu, &set);
      ::sched_setaffinity(0, sizeof set, &set);
    }
    const int fd = ::open((d->dir + "/kvtierd.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl(bin.c_str(), bin.c_str(), "--config", cfg.c_str(), nullptr);
    ::_exit(98);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
  while (std::chrono::steady_clock::now() < deadline) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", d->socket.c_str());
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return Status::Ok();
    int st;
    if (::waitpid(d->pid, &st, WNOHANG) == d->pid) {
      d->pid = -1;
      return Status::IoError("kvtierd exited at start; see " + d->dir + "/kvtierd.log");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::IoError("kvtierd did not start; see " + d->dir + "/kvtierd.log");
}

}  // namespace kvtier::bench
