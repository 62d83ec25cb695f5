// kvtierd's start-up, the control socket's listening and accept, signals and shutdown
// (Daemon::Impl, daemon/server_impl.h). The attach handshake is in daemon/attach.cc, a
// connection's requests in daemon/connection.cc, the reload in daemon/reload.cc, the
// contract bookkeeping in daemon/registrants.cc, /metrics in daemon/metrics_http.cc.
#include "daemon/server.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "daemon/connection.h"
#include "daemon/server_impl.h"
#include "formats/wire.h"

namespace kvtier::daemon {

namespace {

// A user or group named in the config: a number, or a name looked up in the passwd /
// group database. -1 (unchanged) for "".
StatusOr<int64_t> ResolveId(const std::string& v, bool group, const char* key) {
  if (v.empty()) return int64_t{-1};
  if (std::all_of(v.begin(), v.end(), [](unsigned char ch) { return std::isdigit(ch); }) && v.size() <= 10) {
    const int64_t n = std::stoll(v);
    if (n <= 4294967294LL) return n;
  }
  std::vector<char> buf(16384);
  if (group) {
    struct group g {};
    struct group* res = nullptr;
    if (::getgrnam_r(v.c_str(), &g, buf.data(), buf.size(), &res) == 0 && res) return int64_t{g.gr_gid};
  } else {
    struct passwd pw {};
    struct passwd* res = nullptr;
    if (::getpwnam_r(v.c_str(), &pw, buf.data(), buf.size(), &res) == 0 && res) return int64_t{pw.pw_uid};
  }
  return Status::Invalid(std::string(key) + ": no " + (group ? "group" : "user") + " \"" + v + "\"");
}

// security.socket_owner and socket_group as ids (-1: unchanged).
struct SocketIds {
  int64_t uid = -1, gid = -1;
};
StatusOr<SocketIds> ResolveSocketIds(const config::SecurityConfig& sec) {
  auto uid = ResolveId(sec.socket_owner, false, "security.socket_owner");
  if (!uid.ok()) return uid.status();
  auto gid = ResolveId(sec.socket_group, true, "security.socket_group");
  if (!gid.ok()) return gid.status();
  return SocketIds{*uid, *gid};
}

// The owner, group and mode (security.socket_mode) of the bound socket, set before it
// listens: no client connects through a socket whose access is not yet the config's.
Status SetSocketOwnership(const std::string& path, const SocketIds& ids, const config::SecurityConfig& sec) {
  if (ids.uid >= 0 || ids.gid >= 0) {
    if (::chown(path.c_str(), ids.uid >= 0 ? static_cast<uid_t>(ids.uid) : static_cast<uid_t>(-1),
                ids.gid >= 0 ? static_cast<gid_t>(ids.gid) : static_cast<gid_t>(-1)) != 0) {
      return Status::IoError("security.socket_owner/socket_group: chown " + path + ": " + std::strerror(errno));
    }
  }
  if (::chmod(path.c_str(), static_cast<mode_t>(sec.socket_mode)) != 0) {
    return Status::IoError("security.socket_mode: chmod " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Status Daemon::Impl::Start() {
  const config::Config& c = opts_.config;
  // Every client costs a few descriptors: take all the fds the hard limit allows.
  {
    rlimit rl{};
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
      const rlim_t was = rl.rlim_cur;
      rl.rlim_cur = rl.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &rl) == 0) {
        spdlog::info("fds: soft RLIMIT_NOFILE raised from {} to the hard limit {}", was, rl.rlim_max);
      } else {
        spdlog::warn("fds: cannot raise soft RLIMIT_NOFILE from {}: {}", was, std::strerror(errno));
      }
    }
  }
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  accept_backoff_ = std::make_unique<asio::steady_timer>(io_);
  sweep_timer_ = std::make_unique<asio::steady_timer>(io_);
  metrics_backoff_ = std::make_unique<asio::steady_timer>(io_);
  tenants_ = std::make_unique<Tenants>(c, static_cast<uint32_t>(::getuid()), static_cast<uint32_t>(::getgid()));
  socket_path_ = Abs(c.daemon.socket);
  // An unknown socket owner or group stops the start before anything is created.
  auto socket_ids = ResolveSocketIds(c.security);
  if (!socket_ids.ok()) return socket_ids.status();
  // A live daemon on the socket path is an error; a stale socket file is replaced.
  {
    struct stat st;
    if (::lstat(socket_path_.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) {
        return Status::Invalid("daemon.socket: " + socket_path_ + " exists and is not a socket");
      }
      const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::snprintf(a.sun_path, sizeof a.sun_path, "%s", socket_path_.c_str());
      const bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
      if (live) {
        return Status::Rejected("daemon.socket: another kvtierd is listening on " + socket_path_);
      }
      ::unlink(socket_path_.c_str());
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(socket_path_).parent_path(), ec);
  if (ec) return Status::IoError("daemon.socket: cannot create its folder: " + ec.message());
  if (c.tiers.nvme.tier.capacity_bytes != 0) {
    std::filesystem::create_directories(Abs(c.tiers.nvme.dir), ec);
    if (ec) return Status::IoError("tiers.nvme.dir: cannot create " + Abs(c.tiers.nvme.dir) + ": " + ec.message());
  }

  KVTIER_RETURN_IF_ERROR(OpenTiers());

  boost::system::error_code bec;
  acceptor_ = std::make_unique<asio::local::stream_protocol::acceptor>(io_);
  acceptor_->open(asio::local::stream_protocol(), bec);
  if (!bec) acceptor_->bind(asio::local::stream_protocol::endpoint(socket_path_), bec);
  if (bec) return Status::IoError("daemon.socket: cannot bind " + socket_path_ + ": " + bec.message());
  if (Status ps = SetSocketOwnership(socket_path_, *socket_ids, c.security); !ps.ok()) {
    ::unlink(socket_path_.c_str());
    return ps;
  }
  acceptor_->listen(asio::socket_base::max_listen_connections, bec);
  if (bec) {
    ::unlink(socket_path_.c_str());
    return Status::IoError("daemon.socket: cannot listen on " + socket_path_ + ": " + bec.message());
  }

  if (c.daemon.metrics_port != 0) KVTIER_RETURN_IF_ERROR(ListenMetrics());
  return Status::Ok();
}

// The TierManager, the daemon's staging total, and (with an NVMe tier) the contracts
// registered before a restart, registered again so that their blocks answer at once.
Status Daemon::Impl::OpenTiers() {
  const config::Config& c = opts_.config;
  auto tm = tiers::TierManager::Open(ToTierManagerOptions(c));
  if (!tm.ok()) return Status(tm.status().code(), "tiers: " + tm.status().message());
  tm_ = std::move(*tm);
  staging_budget_ = std::make_shared<StagingBudget>(
      c.tiers.host_staging_bytes_total != 0 ? c.tiers.host_staging_bytes_total : c.tiers.host.capacity_bytes);
  if (c.tiers.nvme.tier.capacity_bytes != 0) {
    // Contracts registered before the restart: their blocks on NVMe are reachable at once.
    std::vector<StoredContract> known;
    uint64_t dropped = 0;
    ContractParseReport rep;
    auto store = ContractStore::Open(Abs(c.tiers.nvme.dir) + "/contracts.kvc", &known, &dropped, &rep);
    if (!store.ok()) return Status(store.status().code(), "tiers.nvme.dir: " + store.status().message());
    contracts_ = std::move(*store);
    if (dropped > 0) {
      spdlog::warn("{}: dropped a torn tail of {} bytes (an append cut short)", contracts_->path(), dropped);
    }
    if (rep.corrupt_records > 0) {
      metrics_.contract_records_corrupt.fetch_add(rep.corrupt_records);
      spdlog::error("{}: corruption: skipped {} corrupt records ({} bytes) and kept the {} intact ones around "
                    "them; the file was compacted without them",
                    contracts_->path(), rep.corrupt_records, rep.corrupt_bytes, known.size());
    }
    RestoreContracts(known);
  }
  return Status::Ok();
}

std::vector<TenantRow> Daemon::Impl::TenantRows() const {
  std::vector<TenantRow> rows;
  const AccessPolicy& ap = tenants_->access();
  if (!ap.tenants_configured()) return rows;
  const auto groups = tm_->GroupStatsAll();
  for (uint32_t i = 0; i <= ap.tenant_count(); ++i) {
    rows.push_back(MakeTenantRow(*tenants_, i == ap.tenant_count() ? kSharedOwner : i, groups));
  }
  return rows;
}

void Daemon::Impl::ShedPending(int listen_fd) {
  if (spare_fd_ >= 0) ::close(spare_fd_);
  const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd >= 0) ::close(fd);
  spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
}

void Daemon::Impl::Accept() {
  acceptor_->async_accept([this](const boost::system::error_code& ec, UnixSocket s) {
    if (ec) {
      if (ec == asio::error::operation_aborted || shutting_down_) return;
      const bool no_fds = ec.value() == EMFILE || ec.value() == ENFILE;
      uint64_t held = 0;
      if (accept_log_.Allow(&held)) {
        spdlog::warn("accept: {}{} ({} more accept errors held back)", ec.message(),
                     no_fds ? "; closing new connections until descriptors are free" : "", held);
      }
      if (no_fds) ShedPending(acceptor_->native_handle());
      accept_backoff_->expires_after(std::chrono::milliseconds(no_fds ? 100 : 10));
      accept_backoff_->async_wait([this](const boost::system::error_code& tec) {
        if (!tec && !shutting_down_) Accept();
      });
      return;
    } else if (!shutting_down_) {
      Admit(std::move(s));
    }
    if (!shutting_down_) Accept();
  });
}

// A new control connection, judged by its credentials before anything of it is read: a
// peer that may not attach is refused at once, and one uid holds at most
// daemon.max_unattached_per_uid of the daemon.max_unattached places, so neither a
// refused user nor one admitted user keeps the others from attaching.
void Daemon::Impl::Admit(UnixSocket s) {
  const auto& dc = opts_.config.daemon;
  auto cred = ReadPeerCred(s.native_handle());
  if (!cred.ok()) {
    if (uint64_t held = 0; unattached_log_.Allow(&held)) {
      spdlog::warn("accept: {}; closing ({} more lines about unattached connections held back)",
                   cred.status().ToString(), held);
    }
    boost::system::error_code cec;
    s.close(cec);
    return;
  }
  uint32_t tenant = kDefaultTenant;
  if (Status as = tenants_->access().AdmitEngine(*cred, &tenant); !as.ok()) {
    metrics_.access_denied.fetch_add(1);
    return RefuseAtAccept(s, as);
  }
  auto it = unattached_by_uid_.find(cred->uid);
  if (it != unattached_by_uid_.end() && it->second >= dc.max_unattached_per_uid) {
    return RefuseAtAccept(s, Status::Retry("daemon.max_unattached_per_uid (" +
                                           std::to_string(dc.max_unattached_per_uid) + ") connections of uid " +
                                           std::to_string(cred->uid) + " have not attached yet"));
  }
  if (unattached_ >= dc.max_unattached) {
    // Connections that have not attached yet are capped: idle ones cannot crowd out the
    // clients that attach.
    return RefuseAtAccept(s, Status::Retry("daemon.max_unattached (" + std::to_string(dc.max_unattached) +
                                           ") connections have not attached yet"));
  }
  const uint64_t id = next_conn_id_++;
  auto conn = std::make_shared<Connection>(this, id, std::move(s), std::move(*cred));
  conns_.emplace(id, conn);
  conn->Start();
}

void Daemon::Impl::RefuseAtAccept(UnixSocket& s, const Status& why) {
  metrics_.attach_refused.fetch_add(1);
  if (uint64_t held = 0; unattached_log_.Allow(&held)) {
    spdlog::warn("accept: attach refused: {} ({} more lines about unattached connections held back)", why.ToString(),
                 held);
  }
  wire::ControlHeader h;
  h.type = static_cast<uint16_t>(wire::ControlType::kAttachReply);
  h.length = sizeof(wire::AttachReply);
  wire::AttachReply r;
  r.status = static_cast<int32_t>(why.code());
  std::snprintf(r.message, sizeof r.message, "%s", why.message().c_str());
  uint8_t buf[sizeof h + sizeof r];
  std::memcpy(buf, &h, sizeof h);
  std::memcpy(buf + sizeof h, &r, sizeof r);
  // A new socket's buffer is empty: this fits, or the peer is gone already.
  (void)::send(s.native_handle(), buf, sizeof buf, MSG_DONTWAIT | MSG_NOSIGNAL);
  boost::system::error_code ec;
  s.shutdown(asio::socket_base::shutdown_both, ec);
  s.close(ec);
}

void Daemon::Impl::OnConnectionClosed(uint64_t conn_id) {
  // Deferred: the connection may be running one of its own handlers right now.
  asio::post(io_, [this, conn_id] { conns_.erase(conn_id); });
}

void Daemon::Impl::WaitSignal() {
  signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGHUP) {
      asio::post(admin_, [this] { (void)Reload(); });
      WaitSignal();
      return;
    }
    spdlog::info("{} received: draining", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    Shutdown();
  });
}

void Daemon::Impl::Shutdown() {
  if (shutting_down_) return;
  shutting_down_ = true;
  boost::system::error_code ec;
  if (acceptor_) acceptor_->close(ec);
  if (metrics_acceptor_) metrics_acceptor_->close(ec);
  if (accept_backoff_) accept_backoff_->cancel();
  if (sweep_timer_) sweep_timer_->cancel();
  if (metrics_backoff_) metrics_backoff_->cancel();
  ::unlink(socket_path_.c_str());
  signals_.cancel(ec);
  // Drain every client: its ring thread executes what is already queued, in-flight
  // acquires finish, then every lease is released.
  auto conns = conns_;
  for (auto& [id, conn] : conns) conn->Close(/*drain=*/true);
  // Let queued completion writes go out, then stop.
  asio::post(io_, [this] { io_.stop(); });
}

int Daemon::Impl::Run() {
  Accept();
  if (metrics_acceptor_) AcceptMetrics();
  ArmSweep();
  WaitSignal();
  io_.run();
  conns_.clear();
  closer_.join();  // every session ended, its leases released
  admin_.join();
  spdlog::info("drained; closing tiers");
  tm_.reset();
  spdlog::info("kvtierd stopped");
  return exit_code_;
}

Daemon::Daemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Daemon::~Daemon() = default;

StatusOr<std::unique_ptr<Daemon>> Daemon::Create(Options opts) {
  ::signal(SIGPIPE, SIG_IGN);
  auto impl = std::make_unique<Impl>(std::move(opts));
  KVTIER_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Daemon>(new Daemon(std::move(impl)));
}

int Daemon::Run() { return impl_->Run(); }

std::string Daemon::ListenDescription() const {
  return "unix:" + impl_->socket_path_ + " (protocol " + std::to_string(wire::kProtocolVersion) +
         "), metrics " + impl_->metrics_url_;
}

}  // namespace kvtier::daemon
