// Test harness for daemon + client integration tests: a real kvtierd process started
// from KVTIER_BIN_DIR with a temporary config, client processes made with fork(), a raw
// attach that speaks formats/wire.h directly (to send what libkvtier never would), and
// small helpers (HTTP GET of /metrics, contracts, free ports).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "formats/wire.h"
#include "kvtier/kvtier.h"

namespace kvtier::testing {

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvtier-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
    ::chmod(path_.c_str(), 0755);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline int FreeTcpPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// GET http://127.0.0.1:port/path; returns the body ("" on failure).
inline std::string HttpGet(int port, const std::string& path, int* status = nullptr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string resp;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) resp.append(buf, static_cast<size_t>(n));
  ::close(fd);
  if (status) *status = resp.size() > 12 ? std::atoi(resp.c_str() + 9) : 0;
  const size_t p = resp.find("\r\n\r\n");
  return p == std::string::npos ? "" : resp.substr(p + 4);
}

// Value of the first sample line starting with `series` ("kvtier_leases" or
// "kvtier_tier_blocks{tier=\"host\"}"); -1 when absent.
inline double MetricValue(const std::string& text, const std::string& series) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::atof(line.c_str() + series.size() + 1);
  }
  return -1;
}

struct DaemonConfig {
  std::string slot_bytes = "4KiB";
  std::string host_capacity = "256KiB";  // 64 slots
  std::string nvme_capacity = "1MiB";
  std::string extra;                      // appended TOML
  std::string daemon_extra;               // keys appended to the [daemon] table
  std::string tiers_extra;                // keys appended to the [tiers] table
  int metrics_port = 0;                   // 0: pick a free one
  int max_bad_requests = 4;
  // The daemon binary in KVTIER_BIN_DIR: kvtierd, or kvtierd-test for the tests that arm
  // kill points or fault injection from the environment (KVTIER_TEST_*).
  std::string binary = "kvtierd";
  int bad_request_decay_ms = 0;           // 0: the daemon's default
  int max_keys_per_request = 0;           // 0: the daemon's default
};

// Result of a short kvtierd run (config errors).
struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

inline RunResult RunKvtierd(const std::vector<std::string>& args, const std::string& dir,
                            bool as_nobody = false) {
  const std::string bin = std::string(KVTIER_BIN_DIR) + "/kvtierd";
  const std::string out = dir + "/run.out", err = dir + "/run.err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
    ::dup2(o, 1);
    ::dup2(e, 2);
    if (as_nobody) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(99);
    }
    std::vector<char*> argv{const_cast<char*>(bin.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(98);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  RunResult r;
  r.exit_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = ReadText(out);
  r.err = ReadText(err);
  return r;
}

class DaemonProcess {
 public:
  explicit DaemonProcess(const DaemonConfig& c = DaemonConfig()) : cfg_(c) {
    metrics_port_ = c.metrics_port ? c.metrics_port : FreeTcpPort();
    socket_ = dir_.path() + "/kvtierd.sock";
    config_path_ = dir_.path() + "/kvtier.toml";
    WriteText(config_path_, ConfigText());
  }
  ~DaemonProcess() { Kill(); }

  std::string ConfigText() const {
    std::ostringstream o;
    o << "[daemon]\nsocket = \"" << socket_ << "\"\nlog_level = \"info\"\nmetrics_port = "
      << metrics_port_ << "\nring_entries = 64\nring_data_bytes = \"1MiB\"\nmax_bad_requests = "
      << cfg_.max_bad_requests << "\n"
      << (cfg_.bad_request_decay_ms ? "bad_request_decay_ms = " + std::to_string(cfg_.bad_request_decay_ms) + "\n" : "")
      << (cfg_.max_keys_per_request ? "max_keys_per_request = " + std::to_string(cfg_.max_keys_per_request) + "\n" : "")
      << cfg_.daemon_extra
      << "[tiers]\nslot_bytes = \"" << cfg_.slot_bytes << "\"\n"
      << cfg_.tiers_extra
      << "[tiers.host]\ncapacity = \"" << cfg_.host_capacity
      << "\"\npolicy = \"prefix-lru\"\n"
      << "[tiers.nvme]\ncapacity = \"" << cfg_.nvme_capacity
      << "\"\ndir = \"" << dir_.path() << "/nvme\"\n"
      << cfg_.extra;
    return o.str();
  }

  // Starts kvtierd and waits until its socket accepts a connection.
  bool Start(std::vector<std::string> extra_args = {}) {
    const std::string bin = std::string(KVTIER_BIN_DIR) + "/" + cfg_.binary;
    log_ = dir_.path() + "/kvtierd.log";
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<std::string> args{bin, "--config", config_path_};
      for (auto& a : extra_args) args.push_back(a);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(bin.c_str(), argv.data());
      ::_exit(98);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int st;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        exit_status_ = st;
        pid_ = -1;
        return false;
      }
      if (CanConnect()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  bool CanConnect() const {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", socket_.c_str());
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
  }

  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Sends SIGTERM and waits; returns the exit code (or 128+signal, -1 on timeout).
  int Stop(int timeout_s = 20) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    while (std::chrono::steady_clock::now() < deadline) {
      int st;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  void Kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
      pid_ = -1;
    }
  }
  bool Alive() {
    if (pid_ <= 0) return false;
    int st;
    return ::waitpid(pid_, &st, WNOHANG) == 0;
  }

  std::string Metrics() const { return HttpGet(metrics_port_, "/metrics"); }
  // Polls /metrics until `series` equals `want` (or the deadline passes); returns the last value.
  double WaitMetric(const std::string& series, double want, int timeout_ms = 5000) const {
    double v = -1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    do {
      v = MetricValue(Metrics(), series);
      if (v == want) return v;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < deadline);
    return v;
  }

  const std::string& socket() const { return socket_; }
  const std::string& config_path() const { return config_path_; }
  const std::string& dir() const { return dir_.path(); }
  std::string log() const { return ReadText(log_); }
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }

 private:
  DaemonConfig cfg_;
  TempDir dir_;
  std::string socket_, config_path_, log_;
  int metrics_port_ = 0;
  pid_t pid_ = -1;
  int exit_status_ = 0;
};

// A child process running fn(); its return value is the exit code.
class Child {
 public:
  explicit Child(const std::function<int()>& fn) {
    pid_ = ::fork();
    if (pid_ == 0) {
      int rc = 1;
      rc = fn();
      std::fflush(stderr);
      ::_exit(rc);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int st;
      ::waitpid(pid_, &st, 0);
    }
  }
  int Wait() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  void Kill(int sig) { ::kill(pid_, sig); }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

// Check inside child processes (no gtest there): prints and exits non-zero.
#define CHILD_CHECK(cond)                                                                    \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: child check failed: %s (last error: %s)\n", __FILE__,   \
                   __LINE__, #cond, kvtier_last_error());                                    \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

// A small NVFP4 contract (L=2, H=1, D=16, T=16: 576-byte blocks) that fits 4 KiB slots.
inline kvtier_contract_desc SmallContract(const char* model = "test/model-a") {
  kvtier_contract_desc d{};
  d.model_id = model;
  d.model_revision = "r1";
  d.tokenizer_revision = "t1";
  d.num_layers = 2;
  d.num_kv_heads = 1;
  d.head_dim = 16;
  d.block_tokens = 16;
  d.tp_size = 1;
  return d;
}

// Deterministic block bytes for (contract, key): what a writer stores and a reader checks.
inline void FillBlock(uint8_t* p, size_t n, uint64_t contract, const kvtier_key& k) {
  uint64_t x = contract ^ k.hi ^ (k.lo * 0x9E3779B97F4A7C15ull);
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<uint8_t>(x);
  }
}
inline bool CheckBlock(const uint8_t* p, size_t n, uint64_t contract, const kvtier_key& k) {
  std::vector<uint8_t> want(n);
  FillBlock(want.data(), n, contract, k);
  return std::memcmp(p, want.data(), n) == 0;
}

// Attach that speaks the wire protocol directly, for requests libkvtier would never send.
class RawClient {
 public:
  ~RawClient() { Close(); }
  void Close() {
    if (ring_) ::munmap(ring_, ring_bytes_);
    ring_ = nullptr;
    if (host_) ::munmap(host_, host_bytes_);
    host_ = nullptr;
    if (sock_ >= 0) ::close(sock_);
    sock_ = -1;
  }

  // Returns the reply (status != 0 when refused). `version` goes in both the header and
  // the attach request, as the only version this client speaks.
  bool Attach(const std::string& path, wire::AttachReply* reply, uint32_t version = wire::kProtocolVersion,
              uint32_t flags = 0) {
    sock_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    if (::connect(sock_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return false;
    wire::ControlHeader h;
    h.version = static_cast<uint16_t>(version);
    h.type = static_cast<uint16_t>(wire::ControlType::kAttach);
    h.length = sizeof(wire::AttachRequest);
    wire::AttachRequest r;
    r.protocol_version = version;
    r.min_protocol_version = version;  // speaks exactly `version`
    r.flags = flags;
    std::snprintf(r.name, sizeof r.name, "raw");
    uint8_t msg[sizeof h + sizeof r];
    std::memcpy(msg, &h, sizeof h);
    std::memcpy(msg + sizeof h, &r, sizeof r);
    if (::write(sock_, msg, sizeof msg) != static_cast<ssize_t>(sizeof msg)) return false;
    uint8_t buf[sizeof(wire::ControlHeader) + sizeof(wire::AttachReply)];
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 8)];
    iovec iov{buf, sizeof buf};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctrl;
    mh.msg_controllen = sizeof ctrl;
    ssize_t got = ::recvmsg(sock_, &mh, MSG_WAITALL);
    if (got != static_cast<ssize_t>(sizeof buf)) return false;
    std::vector<int> fds;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
      const size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        fds.push_back(fd);
      }
    }
    std::memcpy(reply, buf + sizeof(wire::ControlHeader), sizeof *reply);
    wire::ControlHeader rh;
    std::memcpy(&rh, buf, sizeof rh);
    // Protocol 5: the SlotClassTable; 6 with kReplyHostParts: the HostPartTable; 7: then
    // the HbmGeometry.
    const bool parts = (reply->flags & wire::kReplyHostParts) != 0;
    const bool hbm_table = reply->status == 0 && reply->protocol_version >= 7;
    const size_t tail = sizeof(wire::SlotClassTable) + (parts ? sizeof(wire::HostPartTable) : 0) +
                        (hbm_table ? sizeof(wire::HbmGeometry) : 0);
    const bool table = rh.length == sizeof(wire::AttachReply) + tail;
    if (table &&
        ::recv(sock_, &host_classes_, sizeof host_classes_, MSG_WAITALL) != static_cast<ssize_t>(sizeof host_classes_)) {
      return false;
    }
    if (table && parts &&
        ::recv(sock_, &host_parts_, sizeof host_parts_, MSG_WAITALL) != static_cast<ssize_t>(sizeof host_parts_)) {
      return false;
    }
    if (table && hbm_table && ::recv(sock_, &hbm_, sizeof hbm_, MSG_WAITALL) != static_cast<ssize_t>(sizeof hbm_)) {
      return false;
    }
    if (reply->status == 0 && !fds.empty()) {
      ring_bytes_ = reply->ring_bytes;
      ring_ = static_cast<uint8_t*>(::mmap(nullptr, ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0));
      std::memcpy(&hdr_, ring_, sizeof hdr_);
      req_ = wire::RequestRing(ring_, hdr_);
      cmp_ = wire::CompletionRing(ring_, hdr_);
      if (fds.size() > 1) {
        host_bytes_ = reply->host_arena_bytes;
        // Read-only: the daemon seals the arena against writes.
        void* h = ::mmap(nullptr, host_bytes_, PROT_READ, MAP_SHARED, fds[1], 0);
        host_ = h == MAP_FAILED ? nullptr : static_cast<uint8_t*>(h);
      }
    }
    for (int fd : fds) ::close(fd);
    return true;
  }

  uint8_t* data() const { return ring_ + hdr_.data_offset; }
  const wire::HostPartTable& host_parts() const { return host_parts_; }
  const wire::RingRegionHeader& header() const { return hdr_; }
  wire::RingControl* request_control() const { return req_.control(); }
  int sock() const { return sock_; }
  uint8_t* host() const { return host_; }
  // The host tier's slot classes of a protocol-5 attach reply (count 0 before it).
  const wire::SlotClassTable& host_classes() const { return host_classes_; }
  const wire::HbmGeometry& hbm() const { return hbm_; }  // protocol 7

  // Pushes an entry (waking the daemon) and waits up to 5 s for a completion.
  bool Submit(const wire::RequestEntry& e, wire::CompletionEntry* out) {
    if (!Push(e)) return false;
    return WaitCompletion(out, 5000);
  }
  // Pushes an entry and wakes the daemon; does not wait.
  bool Push(const wire::RequestEntry& e) {
    if (!req_.TryPush(e)) return false;
    if (req_.ConsumerSleeping()) {
      ::syscall(SYS_futex, req_.tail_word(), 1 /*FUTEX_WAKE*/, 1, nullptr, nullptr, 0);
    }
    return true;
  }
  bool WaitCompletion(wire::CompletionEntry* out, int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      uint32_t n = 0;
      if (cmp_.Available(&n) && n > 0) {
        cmp_.Pop(out);
        return true;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return false;
  }
  // True once the daemon closed our socket (within timeout_ms).
  bool WaitSocketClosed(int timeout_ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      char b[4096];
      const ssize_t k = ::recv(sock_, b, sizeof b, MSG_DONTWAIT);
      if (k == 0) return true;
      if (k > 0) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // The text of the daemon's goodbye message (ControlType::kGoodbye) when one arrives
  // within timeout_ms; "" otherwise.
  std::string ReadGoodbye(int timeout_ms) {
    pollfd p{sock_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return {};
    wire::ControlHeader h;
    if (::recv(sock_, &h, sizeof h, MSG_WAITALL) != static_cast<ssize_t>(sizeof h)) return {};
    if (h.type != static_cast<uint16_t>(wire::ControlType::kGoodbye) || h.length > wire::kMaxGoodbyeBytes) return {};
    std::string why(h.length, '\0');
    if (::recv(sock_, why.data(), why.size(), MSG_WAITALL) != static_cast<ssize_t>(why.size())) return {};
    return why;
  }
  // Sends one socket-path request with a chosen header version; reads the completion.
  bool SocketRequest(const wire::RequestEntry& e, const void* in, size_t in_len, uint16_t version,
                     wire::CompletionEntry* out, std::string* body) {
    wire::ControlHeader h;
    h.version = version;
    h.type = static_cast<uint16_t>(wire::ControlType::kRequest);
    h.length = static_cast<uint32_t>(sizeof e + in_len);
    std::vector<uint8_t> msg(sizeof h + h.length);
    std::memcpy(msg.data(), &h, sizeof h);
    std::memcpy(msg.data() + sizeof h, &e, sizeof e);
    if (in_len) std::memcpy(msg.data() + sizeof h + sizeof e, in, in_len);
    if (::write(sock_, msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) return false;
    wire::ControlHeader rh;
    if (::recv(sock_, &rh, sizeof rh, MSG_WAITALL) != static_cast<ssize_t>(sizeof rh)) return false;
    std::vector<uint8_t> p(rh.length);
    if (::recv(sock_, p.data(), p.size(), MSG_WAITALL) != static_cast<ssize_t>(p.size())) return false;
    if (p.size() < sizeof *out) return false;
    std::memcpy(out, p.data(), sizeof *out);
    body->assign(reinterpret_cast<char*>(p.data()) + sizeof *out, p.size() - sizeof *out);
    return true;
  }

 private:
  int sock_ = -1;
  uint8_t* ring_ = nullptr;
  uint64_t ring_bytes_ = 0;
  uint8_t* host_ = nullptr;
  uint64_t host_bytes_ = 0;
  wire::SlotClassTable host_classes_;
  wire::HostPartTable host_parts_;
  wire::HbmGeometry hbm_;
  wire::RingRegionHeader hdr_;
  wire::RingView<wire::RequestEntry> req_;
  wire::RingView<wire::CompletionEntry> cmp_;
};

}  // namespace kvtier::testing
