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
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include "common/log_limit.h"
#include "daemon/access.h"
#include "daemon/contract_store.h"
#include "daemon/metrics.h"
#include "daemon/session.h"
#include "formats/wire.h"
#include "kvtier/version.h"
#include "tiers/policy/policy.h"

namespace kvtier::daemon {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using UnixSocket = asio::local::stream_protocol::socket;

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

std::string Abs(const std::string& p) { return std::filesystem::absolute(p).lexically_normal().string(); }

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

class Connection;

class Daemon::Impl {
 public:
  explicit Impl(Options opts) : opts_(std::move(opts)), signals_(io_, SIGINT, SIGTERM, SIGHUP) {}

  Status Start();
  int Run();
  void Shutdown();
  // Re-reads the config (SIGHUP, or kvtierctl config reload). Any thread but the io
  // thread; reloads are serialised by reload_mu_.
  Status Reload(std::string* summary = nullptr);
  void WaitSignal();

  // Connections.
  void Accept();
  void Admit(UnixSocket s);
  void AcceptMetrics();
  void OnConnectionClosed(uint64_t conn_id);

  Options opts_;
  // /metrics connections open now (daemon.metrics_max_connections); io thread only.
  // Before io_: the exchanges io_ still holds when it goes count themselves out.
  uint32_t metrics_conns_ = 0;
  asio::io_context io_;
  asio::signal_set signals_;
  std::unique_ptr<asio::local::stream_protocol::acceptor> acceptor_;
  std::unique_ptr<asio::ip::tcp::acceptor> metrics_acceptor_;
  std::unique_ptr<tiers::TierManager> tm_;
  // Every client's staging memory together (tiers.host.staging_bytes_total); set in Start.
  std::shared_ptr<StagingBudget> staging_budget_;
  std::unique_ptr<ContractStore> contracts_;  // with an NVMe tier: registrations that outlive restarts
  // [security] and [[tenants]] of the config the daemon started with (a change needs a
  // restart), the contracts' owners and the tenants' counters. Created in Start.
  std::unique_ptr<Tenants> tenants_;
  // /metrics' per-tenant rows (none without [[tenants]]).
  std::vector<TenantRow> TenantRows() const;
  Metrics metrics_;
  std::string socket_path_;
  std::string metrics_url_ = "off";
  std::map<uint64_t, std::shared_ptr<Connection>> conns_;  // io thread only
  uint64_t next_conn_id_ = 1;
  std::atomic<uint64_t> next_client_id_{1};
  size_t attached_ = 0;    // io thread only
  size_t unattached_ = 0;  // connections accepted and not attached (nor closed) yet; io thread only
  // Unattached connections per peer uid (daemon.max_unattached_per_uid) and attached
  // clients per tenant (daemon.max_clients_per_tenant); io thread only.
  std::map<uint32_t, uint32_t> unattached_by_uid_, clients_by_tenant_;
  // The metrics listener's fd-exhaustion back-off, as the control socket's (spare_fd_).
  std::unique_ptr<asio::steady_timer> metrics_backoff_;
  LogLimit metrics_log_;
  // Refuses a new control connection at accept, before anything of it is read: a bare
  // attach refusal (what every client version reads as the answer to its attach) if it
  // fits without waiting, then the close.
  void RefuseAtAccept(UnixSocket& s, const Status& why);
  // Lines about connections that never attach (refused, timed out, over the cap): any
  // local process can cause them at any rate.
  LogLimit unattached_log_;
  LogLimit socket_queue_log_;  // clients disconnected for not reading their replies
  // Lines any client can cause by connecting, attaching, detaching, misbehaving or asking
  // for reloads in a loop: one per interval each, with the count held back.
  LogLimit conn_log_;
  LogLimit attach_log_{std::chrono::seconds(1)};
  LogLimit detach_log_{std::chrono::seconds(1)};
  LogLimit reload_log_{std::chrono::seconds(1)};
  // Out of fds (EMFILE/ENFILE): the accept loop closes this spare descriptor, takes the
  // pending connection and closes it (the client sees a clean close, not a hang), opens
  // the spare again and waits accept_backoff_ before the next accept, so that a full fd
  // table costs neither a spinning core nor a log line per try.
  int spare_fd_ = -1;
  std::unique_ptr<asio::steady_timer> accept_backoff_;
  LogLimit accept_log_;
  bool shutting_down_ = false;
  int exit_code_ = 0;
  std::mutex reload_mu_;          // one reload at a time; guards the reloadable fields of opts_.config
  asio::thread_pool admin_{1};    // reloads and socket-path admin requests (daemon/server.h)
  asio::thread_pool closer_{1};   // Session::Close of clients that went away
  // Attached clients per peer uid and pid (SO_PEERCRED; io thread only).
  std::map<uint32_t, uint32_t> clients_by_uid_, clients_by_pid_;
  // Attached clients that registered each contract, by the TierManager's id (any thread,
  // under registrants_mu_): when the last one detaches, a contract no block uses is
  // forgotten, by the TierManager and in contracts.kvc.
  struct Registrants {
    uint32_t count = 0;
    uint64_t contract = 0;  // ScaleContract::Id
    std::string ns;         // its namespace in contracts.kvc (ContractStore)
  };
  std::mutex registrants_mu_;
  std::unordered_map<uint64_t, Registrants> registrants_;
  // Contracts registered with no attached registrant: the last one detached while a
  // block of it was cached, or contracts.kvc brought it back at start. The sweep
  // (daemon.contract_sweep_ms) forgets those whose blocks are gone. Under registrants_mu_.
  std::unordered_map<uint64_t, Registrants> idle_;
  // Contracts each peer uid keeps registered, across its attaches
  // (daemon.max_contracts_per_client), and the uids that keep each: an id leaves them
  // when the daemon forgets it. Under registrants_mu_.
  std::unordered_map<uint32_t, std::unordered_set<uint64_t>> kept_by_uid_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> keepers_;
  std::unique_ptr<asio::steady_timer> sweep_timer_;
  std::atomic<bool> sweeping_{false};
  void ContractRegistered(const ScaleContract& ct, uint64_t internal, uint32_t owner);
  void ContractsReleased(const std::vector<uint64_t>& ids);
  // A registration by a client of `uid` of a contract (the TierManager's id): refused
  // when the uid keeps daemon.max_contracts_per_client others; else counted against it.
  Status AdmitContract(uint32_t uid, uint64_t internal);
  // The uids that kept a forgotten contract no longer count it. Caller holds registrants_mu_.
  void DropKeptLocked(uint64_t internal);
  // Forgets the contract if no block of it is cached (owners, uids' counts; its record
  // goes into *forgotten by namespace). Caller holds registrants_mu_.
  bool ForgetLocked(uint64_t internal, const Registrants& r, std::map<std::string, std::vector<uint64_t>>* forgotten);
  void RemoveFromStore(const std::map<std::string, std::vector<uint64_t>>& forgotten);
  void ArmSweep();  // io thread
  void Sweep();     // admin pool
  // Registers again the contracts contracts.kvc holds, each in its namespace.
  void RestoreContracts(const std::vector<StoredContract>& known);
};

// One control-socket connection; after a successful attach it owns the client's Session.
// Every method runs on the io thread except the completion callbacks, which post back.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // peer: SO_PEERCRED / SO_PEERGROUPS, read at accept; the connection holds one of the
  // places of daemon.max_unattached (and of its uid's max_unattached_per_uid) until it
  // attaches or closes.
  Connection(Daemon::Impl* d, uint64_t id, UnixSocket sock, PeerCred peer)
      : d_(d), id_(id), sock_(std::move(sock)), peer_(std::move(peer)) {
    ++d_->unattached_;
    ++d_->unattached_by_uid_[peer_.uid];
  }

  // Reads the attach, which must complete within daemon.attach_timeout_ms.
  void Start() {
    std::weak_ptr<Connection> w = shared_from_this();
    attach_timer_.expires_after(std::chrono::milliseconds(d_->opts_.config.daemon.attach_timeout_ms));
    attach_timer_.async_wait([w](const boost::system::error_code& ec) {
      auto self = w.lock();
      if (ec || !self || self->closed_ || self->session_) return;
      self->d_->metrics_.attach_refused.fetch_add(1);
      uint64_t held = 0;
      if (self->d_->unattached_log_.Allow(&held)) {
        spdlog::warn("control connection {}: no attach within daemon.attach_timeout_ms ({} ms); closing "
                     "({} more lines about unattached connections held back)",
                     self->id_, self->d_->opts_.config.daemon.attach_timeout_ms, held);
      }
      self->Close(false);
    });
    ReadHeader();
  }

  // Closes the socket and ends the session (releasing its leases). Idempotent. A
  // non-empty `why` goes to the client first (ControlType::kGoodbye), so that its next
  // call says why it was disconnected.
  void Close(bool drain, const std::string& why = {}) {
    if (closed_) return;
    closed_ = true;
    attach_timer_.cancel();
    LeaveUnattached();
    boost::system::error_code ec;
    if (!why.empty()) {
      const size_t n = std::min<size_t>(why.size(), wire::kMaxGoodbyeBytes);
      wire::ControlHeader h;
      h.version = static_cast<uint16_t>(protocol_);
      h.type = static_cast<uint16_t>(wire::ControlType::kGoodbye);
      h.length = static_cast<uint32_t>(n);
      std::vector<uint8_t> msg(sizeof h + n);
      std::memcpy(msg.data(), &h, sizeof h);
      std::memcpy(msg.data() + sizeof h, why.data(), n);
      // Best effort, and only what fits without waiting: the client may be gone or not reading.
      (void)::send(sock_.native_handle(), msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    }
    sock_.shutdown(asio::socket_base::shutdown_both, ec);
    sock_.close(ec);
    if (session_) {
      if (!kicked_) d_->metrics_.disconnect_closed.fetch_add(1);
      --d_->attached_;
      if (--d_->clients_by_uid_[peer_uid_] == 0) d_->clients_by_uid_.erase(peer_uid_);
      if (--d_->clients_by_pid_[peer_pid_] == 0) d_->clients_by_pid_.erase(peer_pid_);
      if (--d_->clients_by_tenant_[tenant_] == 0) d_->clients_by_tenant_.erase(tenant_);
      // The ring thread may be inside a long request (an admin flush, a reload): the
      // session ends on the closer pool, never on the io thread.
      Daemon::Impl* d = d_;
      asio::post(d_->closer_, [d, s = std::move(session_), drain] {
        s->Close(drain);
        // kvtier_clients counts a client until its session has ended: once it drops, every
        // lease of the client is released (what a test of a close can wait for).
        d->metrics_.clients.fetch_sub(1);
        d->ContractsReleased(s->registered_contracts());
        if (uint64_t held = 0; d->detach_log_.Allow(&held)) {
          spdlog::info("client {} ({}) detached{}", s->id(), s->name(), HeldBack(held, "detach lines"));
        }
      });
    }
    d_->OnConnectionClosed(id_);
  }

 private:
  // Gives back the unattached places (at attach or close; once).
  void LeaveUnattached() {
    if (!unattached_) return;
    unattached_ = false;
    --d_->unattached_;
    if (--d_->unattached_by_uid_[peer_.uid] == 0) d_->unattached_by_uid_.erase(peer_.uid);
  }

  void ReadHeader() {
    auto self = shared_from_this();
    asio::async_read(sock_, asio::buffer(&hdr_, sizeof hdr_),
                     [self](const boost::system::error_code& ec, size_t) {
                       if (ec) return self->Close(false);
                       Status s = wire::ValidateControlHeader(self->hdr_);
                       if (!s.ok()) {
                         // A stream whose framing is broken cannot be resynchronised.
                         if (uint64_t held = 0; self->d_->conn_log_.Allow(&held)) {
                           spdlog::warn("control connection {}: {}; closing ({} more such lines held back)",
                                        self->id_, s.message(), held);
                         }
                         self->d_->metrics_.requests_malformed.fetch_add(1);
                         return self->Close(false);
                       }
                       if (!self->session_) {
                         // Before attach only an attach of exactly its size is read: nothing
                         // a stranger declares is allocated.
                         if (self->hdr_.type != static_cast<uint16_t>(wire::ControlType::kAttach)) {
                           return self->Dispatch();
                         }
                         if (Status as = wire::CheckAttachHeader(self->hdr_); !as.ok()) {
                           wire::AttachReply r;
                           return self->RefuseAttach(&r, as);
                         }
                       }
                       self->payload_.resize(self->hdr_.length);
                       self->ReadPayload();
                     });
  }

  void ReadPayload() {
    auto self = shared_from_this();
    asio::async_read(sock_, asio::buffer(payload_), [self](const boost::system::error_code& ec, size_t) {
      if (ec) return self->Close(false);
      self->Dispatch();
    });
  }

  void Dispatch() {
    const auto type = static_cast<wire::ControlType>(hdr_.type);
    if (type == wire::ControlType::kAttach) {
      if (session_) {
        if (uint64_t held = 0; d_->conn_log_.Allow(&held)) {
          spdlog::warn("control connection {}: second attach; closing ({} more such lines held back)", id_, held);
        }
        return Close(false);
      }
      return HandleAttach();
    }
    if (type == wire::ControlType::kRequest) {
      if (!session_) {
        uint64_t held = 0;
        if (d_->unattached_log_.Allow(&held)) {
          spdlog::warn("control connection {}: request before attach; closing ({} more lines about unattached "
                       "connections held back)", id_, held);
        }
        return Close(false);
      }
      HandleRequest();
      return ReadHeader();
    }
    if (uint64_t held = 0; d_->conn_log_.Allow(&held)) {
      spdlog::warn("control connection {}: unexpected message type {}; closing ({} more such lines held back)", id_,
                   hdr_.type, held);
    }
    Close(false);
  }

  void RefuseAttach(wire::AttachReply* r, const Status& s) {
    r->status = static_cast<int32_t>(s.code());
    std::snprintf(r->message, sizeof r->message, "%s", s.message().c_str());
    d_->metrics_.attach_refused.fetch_add(1);
    uint64_t held = 0;
    if (d_->unattached_log_.Allow(&held)) {
      spdlog::warn("control connection {}: attach refused: {} ({} more lines about unattached connections held back)",
                   id_, s.ToString(), held);
    }
    (void)SendAttachReply(*r, {});
    Close(false);
  }

  void HandleAttach() {
    wire::AttachReply r;
    wire::AttachRequest a;
    uint32_t version = 0;
    if (Status ps = wire::ParseAttach(hdr_, payload_.data(), payload_.size(), &a, &version); !ps.ok()) {
      return RefuseAttach(&r, ps);
    }
    protocol_ = version;
    if (d_->shutting_down_) return RefuseAttach(&r, Status::Retry("daemon is shutting down"));
    uint32_t tenant = kDefaultTenant;
    if (Status as = d_->tenants_->access().AdmitEngine(peer_, &tenant); !as.ok()) {
      d_->metrics_.access_denied.fetch_add(1);
      return RefuseAttach(&r, as);
    }
    const auto& dc = d_->opts_.config.daemon;
    if (d_->attached_ >= dc.max_clients) {
      return RefuseAttach(&r, Status::Rejected("daemon.max_clients (" + std::to_string(dc.max_clients) +
                                               ") clients attached"));
    }
    // Who is on the other end, as the kernel says (not what the attach request claims).
    ucred cred{};
    socklen_t cred_len = sizeof cred;
    if (::getsockopt(sock_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
      return RefuseAttach(&r, Status::IoError(std::string("SO_PEERCRED: ") + std::strerror(errno)));
    }
    auto count_of = [](const std::map<uint32_t, uint32_t>& m, uint32_t k) {
      auto it = m.find(k);
      return it == m.end() ? 0u : it->second;
    };
    if (count_of(d_->clients_by_uid_, cred.uid) >= dc.max_clients_per_uid) {
      return RefuseAttach(&r, Status::Rejected("daemon.max_clients_per_uid (" + std::to_string(dc.max_clients_per_uid) +
                                               ") clients of uid " + std::to_string(cred.uid) + " attached"));
    }
    if (count_of(d_->clients_by_pid_, static_cast<uint32_t>(cred.pid)) >= dc.max_clients_per_pid) {
      return RefuseAttach(&r, Status::Rejected("daemon.max_clients_per_pid (" + std::to_string(dc.max_clients_per_pid) +
                                               ") clients of pid " + std::to_string(cred.pid) + " attached"));
    }
    // With tenants, the members of one tenant together (several uids of one tenant would
    // otherwise take every place the per-uid cap leaves).
    if (d_->tenants_->access().tenants_configured() &&
        count_of(d_->clients_by_tenant_, tenant) >= dc.max_clients_per_tenant) {
      return RefuseAttach(&r, Status::Rejected("daemon.max_clients_per_tenant (" +
                                               std::to_string(dc.max_clients_per_tenant) + ") clients of tenant " +
                                               d_->tenants_->access().tenant_name(tenant) + " attached"));
    }
    std::string name(a.name, strnlen(a.name, sizeof a.name));
    for (char& ch : name) {
      if (ch < 0x20 || ch > 0x7e) ch = '?';
    }
    const bool has_gpu = (a.flags & wire::kAttachHasGpu) != 0;
    SessionLimits lim;
    lim.ring_entries = dc.ring_entries;
    lim.ring_data_bytes = dc.ring_data_bytes;
    lim.max_keys = dc.max_keys_per_request;
    lim.max_leases = dc.max_leases_per_client;
    lim.max_tier_share = dc.max_tier_share_per_client;
    lim.max_contracts = dc.max_contracts_per_client;
    lim.max_async_acquires = dc.max_async_acquires_per_client;
    lim.max_bad_requests = dc.max_bad_requests;
    lim.bad_request_decay_ms = dc.bad_request_decay_ms;
    lim.spin_us = dc.spin_us;
    lim.max_spinning = dc.max_spinning_rings;
    lim.protocol_version = protocol_;
    // Slot classes made per contract: a client of protocol 8 or older would address
    // slots by a table of classes fixed at attach.
    if (d_->tm_->classes_at_registration() && protocol_ < 9) {
      // (The reply's message holds 127 bytes.)
      return RefuseAttach(&r, Status::Unsupported("tiers.slot_classes = \"per-contract\": slot sizes per contract "
                                                  "need libkvtier of protocol 9 (this one speaks " +
                                                  std::to_string(protocol_) + ")"));
    }
    if (protocol_ >= 5 && d_->tm_->has_tier(tiers::Tier::kHost)) {
      // The most host slots its leases could hold: all of the smallest slot class. What its
      // staging slots hold in memory is bounded by its leases (each counted in bytes against
      // daemon.max_tier_share_per_client) and, for freed slots, by the daemon's total.
      const tiers::HostGeometry g = d_->tm_->host_geometry();
      const uint32_t cap = d_->opts_.config.tiers.host_staging_slots_per_client;
      if (d_->tm_->classes_at_registration()) {
        // Slots of each contract's own size: the area is the client's share of the host
        // tier's bytes (what its leases may hold) and one largest slot, in granules;
        // staging_slots_per_client (0: no cap of its own) caps the slots taken at once.
        const uint64_t largest = std::min(d_->tm_->slot_bytes(), g.slab_bytes);
        const auto share = static_cast<uint64_t>(dc.max_tier_share_per_client * static_cast<double>(g.arena_bytes));
        lim.staging_bytes = (std::min(share, g.arena_bytes) + largest + g.granule - 1) / g.granule * g.granule;
        lim.staging_slots = cap != 0 ? cap : static_cast<uint32_t>(std::min<uint64_t>(lim.staging_bytes / g.granule,
                                                                                      UINT32_MAX));
      } else {
        const auto host_slots = g.most[0];
        // 0: the client's share of the host tier (daemon.max_tier_share_per_client), which
        // bounds what its leases hold anyway.
        const auto share = static_cast<uint32_t>(dc.max_tier_share_per_client * static_cast<double>(host_slots));
        lim.staging_slots = std::min(host_slots, cap != 0 ? cap : std::max<uint32_t>(1, share));
      }
      lim.staging_budget = d_->staging_budget_;
      // With tenants, no client maps the arena: it holds every tenant's blocks.
      lim.private_reads = d_->tenants_->access().tenants_configured();
    }
    const uint64_t client_id = d_->next_client_id_.fetch_add(1);
    std::weak_ptr<Connection> weak = shared_from_this();
    asio::io_context* io = &d_->io_;
    auto kick = [weak, io](const std::string& why) {
      asio::post(*io, [weak, why] {
        if (auto c = weak.lock()) {
          if (uint64_t held = 0; c->d_->conn_log_.Allow(&held)) {
            spdlog::warn("disconnecting client: {} ({} more such lines held back)", why, held);
          }
          c->kicked_ = true;
          c->Close(false, why);
        }
      });
    };
    Daemon::Impl* impl = d_;
    auto reload = [impl](std::string* summary) { return impl->Reload(summary); };
    Session::RegisteredFn registered = [impl](const ScaleContract& ct, uint64_t internal, uint32_t owner) {
      impl->ContractRegistered(ct, internal, owner);
    };
    auto sess = Session::Create(client_id, name, a.pid, has_gpu, d_->tm_.get(), &d_->metrics_, lim, kick,
                                reload, std::move(registered));
    if (!sess.ok()) return RefuseAttach(&r, sess.status());
    (*sess)->SetPeer(peer_, tenant, d_->tenants_.get());
    (*sess)->SetContractAdmission(
        [impl, uid = cred.uid](uint64_t internal) { return impl->AdmitContract(uid, internal); });
    tiers::TierManager* tm = d_->tm_.get();
    r.status = 0;
    r.protocol_version = protocol_;
    r.client_id = client_id;
    r.slot_bytes = tm->slot_bytes();
    r.ring_bytes = (*sess)->ring_bytes();
    r.max_keys_per_request = dc.max_keys_per_request;
    std::vector<int> fds{(*sess)->ring_fd()};
    std::vector<tiers::HostPart> parts;
    // The host arena only with a staging area to write through: a client of protocol
    // < 5 would map it writable, which its seal refuses.
    if (tm->has_tier(tiers::Tier::kHost) && (*sess)->staging() != nullptr) {
      r.flags |= wire::kReplyHasHost | wire::kReplyHasStaging;
      r.host_arena_bytes = tm->host_arena_bytes();
      // Per contract (protocol 9): the area's granules; else its slots of slot_bytes.
      r.staging_slots = tm->classes_at_registration() ? (*sess)->staging()->units() : (*sess)->staging()->slots();
      if ((*sess)->private_reads()) {
        r.flags |= wire::kReplyHostPrivate;
        // Its tenant's part of the arena (tiers.host.tenant_parts), which holds that
        // tenant's blocks only: a protocol-6 client maps it and reads them in place.
        const tiers::HostPart hp = tm->host_part(d_->tenants_->group_of(tenant));
        if (protocol_ >= 6 && hp.bytes > 0) {
          r.flags |= wire::kReplyHostParts;
          parts.push_back(hp);
          fds.push_back(hp.fd);
          (*sess)->SetHostPart(hp.offset, hp.bytes);
        }
      } else {
        fds.push_back(tm->host_arena_fd());
      }
      fds.push_back((*sess)->staging()->fd());
    }
    if (tm->has_tier(tiers::Tier::kNvme)) r.flags |= wire::kReplyHasNvme;
    // The HBM arena's IPC handle only for a client that attached with a GPU: CUDA IPC maps
    // the arena read-write, so a handle is the power to change every HBM block.
    // A client of protocol 6 or older addresses HBM slot s at s * slot_bytes: none with
    // several HBM slot classes (Session::CheckTarget refuses its HBM leases too).
    if (has_gpu && tm->has_tier(tiers::Tier::kHbm) && (protocol_ >= 7 || tm->hbm_geometry().classes.size() <= 1)) {
      Status hs = tm->hbm_ipc_handle(r.hbm_ipc_handle);
      if (hs.ok()) r.flags |= wire::kReplyHasHbm;
      else spdlog::warn("HBM IPC handle unavailable: {}", hs.ToString());
    }
    r.num_fds = static_cast<uint32_t>(fds.size());
    Status s = SendAttachReply(r, fds, parts);
    if (!s.ok()) {
      if (uint64_t held = 0; d_->conn_log_.Allow(&held)) {
        spdlog::warn("control connection {}: attach reply failed: {} ({} more such lines held back)", id_,
                     s.ToString(), held);
      }
      (*sess)->Close(false);
      return Close(false);
    }
    session_ = std::move(*sess);
    session_->Start();
    LeaveUnattached();
    ++d_->attached_;
    peer_uid_ = cred.uid;
    peer_pid_ = static_cast<uint32_t>(cred.pid);
    tenant_ = tenant;
    ++d_->clients_by_uid_[peer_uid_];
    ++d_->clients_by_pid_[peer_pid_];
    ++d_->clients_by_tenant_[tenant_];
    d_->metrics_.clients.fetch_add(1);
    d_->metrics_.clients_attached.fetch_add(1);
    if (uint64_t held = 0; d_->attach_log_.Allow(&held)) {
      spdlog::info("client {} ({}, pid {}{}) attached to kvtierd {} (protocol {}); peer {}{}{}", client_id, name,
                   a.pid, has_gpu ? ", gpu" : "", KVTIER_VERSION_STRING, wire::kProtocolVersion, peer_.ToString(),
                   d_->tenants_->access().tenants_configured()
                       ? ", tenant " + d_->tenants_->access().tenant_name(tenant)
                       : "",
                   HeldBack(held, "attach lines"));
    }
    ReadHeader();
  }

  // The attach reply goes out with sendmsg (SCM_RIGHTS), outside asio's async writes;
  // nothing else has been written to this socket before it.
  Status SendAttachReply(const wire::AttachReply& r, const std::vector<int>& fds,
                         const std::vector<tiers::HostPart>& parts = {}) {
    wire::ControlHeader h;
    h.type = static_cast<uint16_t>(wire::ControlType::kAttachReply);
    // Protocol 5 on: the host tier's slot classes follow an accepting reply. A refusal is
    // the bare reply, which every version reads.
    const bool table = protocol_ >= 5 && r.status == 0;
    const bool hbm_table = protocol_ >= 7 && r.status == 0;
    wire::HbmGeometry hg;
    // Per contract (protocol 9): no classes listed, the register completion gives each.
    const bool per_contract = d_->tm_->classes_at_registration();
    if (hbm_table && (r.flags & wire::kReplyHasHbm)) {
      const tiers::HostGeometry g = d_->tm_->hbm_geometry();
      hg.classes.flags = per_contract ? wire::kSlotClassesPerContract : 0;
      hg.classes.count =
          per_contract ? 0 : static_cast<uint32_t>(std::min<size_t>(g.classes.size(), wire::kMaxWireSlotClasses));
      hg.classes.granule = g.granule;
      hg.classes.slab_bytes = g.slab_bytes;
      for (uint32_t i = 0; i < hg.classes.count; ++i) hg.classes.class_bytes[i] = g.classes[i];
      hg.arena_bytes = g.arena_bytes;
    }
    wire::SlotClassTable t;
    if (table && (r.flags & wire::kReplyHasHost)) {
      const tiers::HostGeometry g = d_->tm_->host_geometry();
      t.flags = per_contract ? wire::kSlotClassesPerContract : 0;
      t.count = per_contract ? 0 : static_cast<uint32_t>(std::min<size_t>(g.classes.size(), wire::kMaxWireSlotClasses));
      t.granule = g.granule;
      t.slab_bytes = g.slab_bytes;
      for (uint32_t i = 0; i < t.count; ++i) t.class_bytes[i] = g.classes[i];
    }
    // Protocol 6, kReplyHostParts: the parts the fds after the ring's are.
    const bool with_parts = table && (r.flags & wire::kReplyHostParts) != 0;
    wire::HostPartTable pt;
    if (with_parts) {
      pt.count = static_cast<uint32_t>(std::min<size_t>(parts.size(), wire::kMaxWireHostParts));
      for (uint32_t i = 0; i < pt.count; ++i) pt.parts[i] = {parts[i].offset, parts[i].bytes};
    }
    h.length = static_cast<uint32_t>(sizeof r + (table ? sizeof t : 0) + (with_parts ? sizeof pt : 0) +
                                     (hbm_table ? sizeof hg : 0));
    uint8_t buf[sizeof h + sizeof r + sizeof t + sizeof pt + sizeof hg];
    std::memcpy(buf, &h, sizeof h);
    std::memcpy(buf + sizeof h, &r, sizeof r);
    size_t at = sizeof h + sizeof r;
    if (table) std::memcpy(buf + at, &t, sizeof t), at += sizeof t;
    if (with_parts) std::memcpy(buf + at, &pt, sizeof pt), at += sizeof pt;
    if (hbm_table) std::memcpy(buf + at, &hg, sizeof hg);
    const size_t total = sizeof h + h.length;
    iovec iov{buf, total};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 4)] = {};
    if (!fds.empty()) {
      msg.msg_control = ctrl;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
    }
    const int fd = sock_.native_handle();
    size_t sent = 0;
    for (int tries = 0; tries < 1000 && sent < total; ++tries) {
      ssize_t n;
      if (sent == 0) {
        n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      } else {
        n = ::send(fd, buf + sent, total - sent, MSG_NOSIGNAL);
      }
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
          ::usleep(1000);
          continue;
        }
        return Status::IoError(std::string("sendmsg: ") + std::strerror(errno));
      }
      sent += static_cast<size_t>(n);
    }
    if (sent < total) return Status::IoError("attach reply could not be sent");
    return Status::Ok();
  }

  void HandleRequest() {
    auto reply_error = [this](uint64_t tag, uint16_t op, const Status& s) {
      wire::CompletionEntry c;
      c.tag = tag;
      c.op = op;
      c.status = static_cast<int32_t>(s.code());
      const std::string& m = s.message();
      c.msg_len = static_cast<uint16_t>(std::min<size_t>(m.size(), 1024));
      auto buf = std::make_shared<std::vector<uint8_t>>();
      AppendCompletion(buf.get(), c, reinterpret_cast<const uint8_t*>(m.data()), c.msg_len);
      QueueWrite(buf);
    };
    if (payload_.size() < sizeof(wire::RequestEntry)) {
      d_->metrics_.requests_malformed.fetch_add(1);
      return reply_error(0, 0, Status::Invalid("request shorter than a RequestEntry"));
    }
    wire::RequestEntry e;
    std::memcpy(&e, payload_.data(), sizeof e);
    if (hdr_.version != protocol_) {
      d_->metrics_.requests_malformed.fetch_add(1);
      return reply_error(e.tag, e.op,
                         Status::Unsupported("protocol version " + std::to_string(hdr_.version) +
                                             "; this connection attached with " +
                                             std::to_string(protocol_)));
    }
    wire::RequestLimits lim;
    lim.max_keys = d_->opts_.config.daemon.max_keys_per_request;
    const uint64_t in_bytes = payload_.size() - sizeof e;
    Status v = wire::ValidateSocketRequest(e, in_bytes, lim);
    if (!v.ok()) {
      d_->metrics_.requests_malformed.fetch_add(1);
      return reply_error(e.tag, e.op, v);
    }
    // Room for what the op can write (not what the client declared: a nop with out_len
    // 16 MiB gets 256 bytes) and for an error message. Admin output depends on its action
    // and stays the client's out_len, bounded by the socket message limit.
    wire::RequestEntry req = e;
    uint64_t can_write = e.out_len;
    if (e.op == static_cast<uint16_t>(wire::Op::kStats)) {
      can_write = uint64_t{std::min<uint32_t>(e.count, 8)} * sizeof(wire::WireTierStats);  // 4 tiers at most
    } else if (e.op != static_cast<uint16_t>(wire::Op::kAdmin)) {
      can_write = wire::RequiredOutBytes(e);
    }
    req.out_len = static_cast<uint32_t>(std::max<uint64_t>(std::min<uint64_t>(can_write, e.out_len), 256));
    auto buf = std::make_shared<std::vector<uint8_t>>(sizeof(wire::ControlHeader) +
                                                      sizeof(wire::CompletionEntry) + req.out_len);
    uint8_t* out = buf->data() + sizeof(wire::ControlHeader) + sizeof(wire::CompletionEntry);
    std::weak_ptr<Connection> weak = shared_from_this();
    asio::io_context* io = &d_->io_;
    auto done = [weak, io, buf](const wire::CompletionEntry& c) {
          asio::post(*io, [weak, buf, c] {
            auto self = weak.lock();
            if (!self || self->closed_) return;
            const uint32_t body = std::max<uint32_t>(c.out_bytes, c.msg_len);
            wire::ControlHeader h;
            h.version = static_cast<uint16_t>(self->protocol_);
            h.type = static_cast<uint16_t>(wire::ControlType::kCompletion);
            h.length = static_cast<uint32_t>(sizeof c + body);
            std::memcpy(buf->data(), &h, sizeof h);
            std::memcpy(buf->data() + sizeof h, &c, sizeof c);
            buf->resize(sizeof h + sizeof c + body);
            self->QueueWrite(buf);
          });
        };
    std::vector<uint8_t> in(payload_.begin() + sizeof e, payload_.end());
    if (e.op == static_cast<uint16_t>(wire::Op::kAdmin)) {
      // Listings, verify, flush and reload can take long: never on the io thread.
      asio::post(d_->admin_, [s = session_, req, in = std::move(in), out, done = std::move(done)]() mutable {
        s->ExecuteSocket(req, std::move(in), out, std::move(done));
      });
      return;
    }
    session_->ExecuteSocket(req, std::move(in), out, std::move(done));
  }

  void AppendCompletion(std::vector<uint8_t>* buf, const wire::CompletionEntry& c, const uint8_t* body,
                        size_t n) const {
    wire::ControlHeader h;
    h.version = static_cast<uint16_t>(protocol_);
    h.type = static_cast<uint16_t>(wire::ControlType::kCompletion);
    h.length = static_cast<uint32_t>(sizeof c + n);
    buf->resize(sizeof h + sizeof c + n);
    std::memcpy(buf->data(), &h, sizeof h);
    std::memcpy(buf->data() + sizeof h, &c, sizeof c);
    if (n) std::memcpy(buf->data() + sizeof h + sizeof c, body, n);
  }

  void QueueWrite(std::shared_ptr<std::vector<uint8_t>> buf) {
    if (closed_) return;
    const uint64_t limit = d_->opts_.config.daemon.max_socket_queue_bytes;
    if (queued_bytes_ + buf->size() > limit && !writes_.empty()) {
      // A client that does not read its replies: disconnect it rather than hold them.
      const std::string why = "socket replies not read: " + std::to_string(queued_bytes_ + buf->size()) +
                              " bytes queued, over daemon.max_socket_queue_bytes (" + std::to_string(limit) + ")";
      uint64_t held = 0;
      if (d_->socket_queue_log_.Allow(&held)) {
        spdlog::warn("client {}: {}; disconnecting ({} more such lines held back)",
                     session_ ? session_->id() : 0, why, held);
      }
      kicked_ = true;
      d_->metrics_.disconnect_misbehaved.fetch_add(1);
      // The reason goes out only if it fits without waiting (the client is not reading).
      wire::ControlHeader h;
      h.version = static_cast<uint16_t>(protocol_);
      h.type = static_cast<uint16_t>(wire::ControlType::kGoodbye);
      h.length = static_cast<uint32_t>(std::min<size_t>(why.size(), wire::kMaxGoodbyeBytes));
      std::vector<uint8_t> msg(sizeof h + h.length);
      std::memcpy(msg.data(), &h, sizeof h);
      std::memcpy(msg.data() + sizeof h, why.data(), h.length);
      (void)::send(sock_.native_handle(), msg.data(), msg.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      return Close(false);
    }
    queued_bytes_ += buf->size();
    writes_.push_back(std::move(buf));
    if (writes_.size() == 1) WriteNext();
  }

  void WriteNext() {
    auto self = shared_from_this();
    asio::async_write(sock_, asio::buffer(*writes_.front()),
                      [self](const boost::system::error_code& ec, size_t) {
                        if (ec) return self->Close(false);
                        self->queued_bytes_ -= self->writes_.front()->size();
                        self->writes_.pop_front();
                        if (!self->writes_.empty()) self->WriteNext();
                      });
  }

  Daemon::Impl* d_;
  uint64_t id_;
  UnixSocket sock_;
  wire::ControlHeader hdr_;
  std::vector<uint8_t> payload_;
  std::shared_ptr<Session> session_;
  PeerCred peer_;  // SO_PEERCRED / SO_PEERGROUPS, read at accept
  std::deque<std::shared_ptr<std::vector<uint8_t>>> writes_;
  uint64_t queued_bytes_ = 0;  // bytes in writes_, at most daemon.max_socket_queue_bytes
  bool closed_ = false;
  bool unattached_ = true;  // holds its places among the unattached connections
  uint32_t tenant_ = kDefaultTenant;  // at attach

 public:
  bool kicked_ = false;
  uint32_t peer_uid_ = 0, peer_pid_ = 0;       // SO_PEERCRED at attach
  uint32_t protocol_ = wire::kProtocolVersion;  // negotiated at attach
  asio::steady_timer attach_timer_{d_->io_};     // daemon.attach_timeout_ms from accept
};

// Bytes of a /metrics request: its header (a scraper sends a few hundred) and its body
// (a GET has none). A request past either is answered 413 and closed, having cost no more.
inline constexpr uint32_t kMetricsHeaderLimit = 8192;
inline constexpr uint64_t kMetricsRequestLimit = 4096;

// One /metrics HTTP exchange; it holds one of daemon.metrics_max_connections places
// until it ends (io thread only).
class HttpExchange : public std::enable_shared_from_this<HttpExchange> {
 public:
  HttpExchange(asio::ip::tcp::socket s, Daemon::Impl* d) : stream_(std::move(s)), d_(d) {
    ++d_->metrics_conns_;
    parser_.header_limit(kMetricsHeaderLimit);
    parser_.body_limit(kMetricsRequestLimit);
  }
  ~HttpExchange() { --d_->metrics_conns_; }
  void Start() {
    stream_.expires_after(std::chrono::seconds(5));
    auto self = shared_from_this();
    http::async_read(stream_, buf_, parser_, [self](beast::error_code ec, size_t) {
      if (ec == http::error::body_limit || ec == http::error::header_limit) return self->TooLarge();
      if (ec) return;
      self->req_ = self->parser_.release();
      self->Respond();
    });
  }

 private:
  void TooLarge() {
    res_.version(11);
    res_.keep_alive(false);
    res_.result(http::status::payload_too_large);
    res_.set(http::field::content_type, "text/plain");
    res_.body() = "request over " + std::to_string(kMetricsHeaderLimit) + " header bytes or " +
                  std::to_string(kMetricsRequestLimit) + " body bytes\n";
    Send();
  }

  void Respond() {
    res_.version(req_.version());
    res_.keep_alive(false);
    const std::string target(req_.target());
    if (req_.method() != http::verb::get) {
      res_.result(http::status::method_not_allowed);
      res_.set(http::field::content_type, "text/plain");
      res_.body() = "GET only\n";
    } else if (target == "/metrics" || target.rfind("/metrics?", 0) == 0) {
      res_.result(http::status::ok);
      res_.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res_.body() = d_->metrics_.Render(d_->tm_->Stats());
      Metrics::RenderClientBudget(d_->tm_->ClientBudgetRejects(), &res_.body());
      // Per-tenant series only where the operator keeps the port from the tenants.
      if (d_->opts_.config.daemon.metrics_tenants) Metrics::RenderTenants(d_->TenantRows(), &res_.body());
    } else {
      res_.result(http::status::not_found);
      res_.set(http::field::content_type, "text/plain");
      res_.body() = "kvtierd: see /metrics\n";
    }
    Send();
  }

  void Send() {
    res_.prepare_payload();
    auto self = shared_from_this();
    http::async_write(stream_, res_, [self](beast::error_code, size_t) {
      beast::error_code ec;
      self->stream_.socket().shutdown(asio::ip::tcp::socket::shutdown_send, ec);
    });
  }

  beast::tcp_stream stream_;
  Daemon::Impl* d_;
  beast::flat_buffer buf_;
  http::request_parser<http::string_body> parser_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
};

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

  if (c.daemon.metrics_port != 0) {
    const std::string addr = c.daemon.metrics_address == "localhost" ? "127.0.0.1" : c.daemon.metrics_address;
    asio::ip::tcp::endpoint ep(asio::ip::make_address(addr, bec), static_cast<uint16_t>(c.daemon.metrics_port));
    if (bec) return Status::Invalid("daemon.metrics_address: " + bec.message());
    metrics_acceptor_ = std::make_unique<asio::ip::tcp::acceptor>(io_);
    metrics_acceptor_->open(ep.protocol(), bec);
    if (!bec) metrics_acceptor_->set_option(asio::socket_base::reuse_address(true), bec);
    if (!bec) metrics_acceptor_->bind(ep, bec);
    if (!bec) metrics_acceptor_->listen(asio::socket_base::max_listen_connections, bec);
    if (bec) {
      ::unlink(socket_path_.c_str());
      return Status::IoError("daemon.metrics_port: cannot listen on " + addr + ":" +
                             std::to_string(c.daemon.metrics_port) + ": " + bec.message());
    }
    metrics_url_ = "http://" + (addr.find(':') != std::string::npos ? "[" + addr + "]" : addr) + ":" +
                   std::to_string(c.daemon.metrics_port) + "/metrics";
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
      if (no_fds) {
        if (spare_fd_ >= 0) ::close(spare_fd_);
        const int fd = ::accept4(acceptor_->native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) ::close(fd);
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      }
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

// The metrics listener: the control socket's fd-exhaustion back-off (a full fd table
// costs neither a spinning core nor a line per try) and at most
// daemon.metrics_max_connections exchanges at once (each bounded by kMetricsRequestLimit
// and a deadline); past it a new connection is closed at accept.
void Daemon::Impl::AcceptMetrics() {
  metrics_acceptor_->async_accept([this](const boost::system::error_code& ec, asio::ip::tcp::socket s) {
    if (ec == asio::error::operation_aborted || shutting_down_) return;
    if (ec) {
      const bool no_fds = ec.value() == EMFILE || ec.value() == ENFILE;
      if (uint64_t held = 0; metrics_log_.Allow(&held)) {
        spdlog::warn("metrics accept: {}{} ({} more such lines held back)", ec.message(),
                     no_fds ? "; closing new connections until descriptors are free" : "", held);
      }
      if (no_fds) {
        if (spare_fd_ >= 0) ::close(spare_fd_);
        const int fd = ::accept4(metrics_acceptor_->native_handle(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) ::close(fd);
        spare_fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      }
      metrics_backoff_->expires_after(std::chrono::milliseconds(no_fds ? 100 : 10));
      metrics_backoff_->async_wait([this](const boost::system::error_code& tec) {
        if (!tec && !shutting_down_) AcceptMetrics();
      });
      return;
    }
    if (metrics_conns_ >= opts_.config.daemon.metrics_max_connections) {
      if (uint64_t held = 0; metrics_log_.Allow(&held)) {
        spdlog::warn("metrics accept: daemon.metrics_max_connections ({}) connections open; closing a new one "
                     "({} more such lines held back)",
                     opts_.config.daemon.metrics_max_connections, held);
      }
      boost::system::error_code cec;
      s.close(cec);
    } else {
      std::make_shared<HttpExchange>(std::move(s), this)->Start();
    }
    AcceptMetrics();
  });
}

void Daemon::Impl::RestoreContracts(const std::vector<StoredContract>& known) {
  const AccessPolicy& ap = tenants_->access();
  size_t restored = 0;
  for (const auto& sc : known) {
    const ScaleContract& ct = sc.contract;
    uint32_t owner = kDefaultTenant;
    uint64_t internal = ct.Id();
    if (sc.ns == "shared") {
      owner = kSharedOwner;
      internal = SharedContractId(ct.Id());
    } else if (!sc.ns.empty()) {
      for (uint32_t t = 1; t < ap.tenant_count(); ++t) {
        if (ap.tenant_name(t) == sc.ns) owner = t;
      }
      if (owner == kDefaultTenant) {
        spdlog::warn("contract {} ({}) of tenant \"{}\" in {} not registered again: no [[tenants]] table has that "
                     "name (the record is kept)",
                     ContractIdHex(ct.Id()), ct.model_id, sc.ns, contracts_->path());
        continue;
      }
      internal = NamespacedContractId(ap.tenant_namespace(owner), ct.Id());
    }
    Status rs = owner == kDefaultTenant
                    ? tm_->RegisterContract(ct)
                    : tm_->RegisterContractAs(ct, internal, ap.tenants_configured() ? tenants_->group_of(owner) : 0,
                                              sc.ns);
    if (!rs.ok()) {
      spdlog::warn("contract {} ({}) from {} not registered again: {}", ContractIdHex(ct.Id()), ct.model_id,
                   contracts_->path(), rs.ToString());
      continue;
    }
    if (owner != kDefaultTenant) tenants_->owners().Add(internal, {owner, owner == kSharedOwner ? internal : ct.Id()});
    {
      // No client registered it yet: the sweep forgets it once no block of it is cached.
      std::lock_guard<std::mutex> l(registrants_mu_);
      Registrants& r = idle_[internal];
      r.contract = ct.Id();
      r.ns = sc.ns;
    }
    ++restored;
  }
  if (restored > 0) spdlog::info("{} contracts registered again from {}", restored, contracts_->path());
}

void Daemon::Impl::ContractRegistered(const ScaleContract& ct, uint64_t internal, uint32_t owner) {
  const std::string ns = tenants_->NamespaceName(owner);
  {
    std::lock_guard<std::mutex> l(registrants_mu_);
    Registrants& r = registrants_[internal];
    ++r.count;
    idle_.erase(internal);
    r.contract = ct.Id();
    r.ns = ns;
    // Its last registrant may have detached between the registration and this count (and
    // ContractsReleased dropped its owner entry: the session's was added before).
    if (owner != kDefaultTenant) tenants_->owners().Add(internal, {owner, owner == kSharedOwner ? internal : ct.Id()});
    if (!tm_->HasContract(internal)) {
      const AccessPolicy& ap = tenants_->access();
      (void)(owner == kDefaultTenant && internal == ct.Id()
                 ? tm_->RegisterContract(ct)
                 : tm_->RegisterContractAs(ct, internal, ap.tenants_configured() ? tenants_->group_of(owner) : 0,
                                           ns));
    }
  }
  if (contracts_) {
    Status s = contracts_->Add(ct, ns);
    if (!s.ok()) {
      static LogLimit store_log;
      uint64_t held = 0;
      if (store_log.Allow(&held)) {
        spdlog::warn("contract {} is registered but not kept for restarts: {} ({} more such lines held back)",
                     ContractIdHex(ct.Id()), s.ToString(), held);
      }
    }
  }
}

void Daemon::Impl::ContractsReleased(const std::vector<uint64_t>& ids) {
  // Under registrants_mu_ to the end: a registration of a contract forgotten here either
  // counts before the forgetting (and nothing is forgotten) or registers it again and
  // adds it back to the file after it was removed.
  std::lock_guard<std::mutex> l(registrants_mu_);
  std::map<std::string, std::vector<uint64_t>> forgotten;  // namespace -> contract ids
  for (const uint64_t id : ids) {
    auto it = registrants_.find(id);
    if (it == registrants_.end() || --it->second.count > 0) continue;
    const Registrants r = it->second;
    registrants_.erase(it);
    // A block of it is cached: the sweep forgets it once they are gone.
    if (!ForgetLocked(id, r, &forgotten)) idle_[id] = r;
  }
  RemoveFromStore(forgotten);
}

bool Daemon::Impl::ForgetLocked(uint64_t internal, const Registrants& r,
                                std::map<std::string, std::vector<uint64_t>>* forgotten) {
  if (!tm_->ForgetContractIfUnused(internal)) return false;
  // Its owner entry goes with it (a tenant admin's listings walk the owners' contracts);
  // a registration racing this one adds it back in ContractRegistered, under this lock.
  tenants_->owners().Remove(internal);
  DropKeptLocked(internal);
  (*forgotten)[r.ns].push_back(r.contract);
  return true;
}

void Daemon::Impl::DropKeptLocked(uint64_t internal) {
  auto it = keepers_.find(internal);
  if (it == keepers_.end()) return;
  for (const uint32_t uid : it->second) {
    auto k = kept_by_uid_.find(uid);
    if (k == kept_by_uid_.end()) continue;
    k->second.erase(internal);
    if (k->second.empty()) kept_by_uid_.erase(k);
  }
  keepers_.erase(it);
}

Status Daemon::Impl::AdmitContract(uint32_t uid, uint64_t internal) {
  const uint32_t cap = opts_.config.daemon.max_contracts_per_client;
  std::lock_guard<std::mutex> l(registrants_mu_);
  auto& kept = kept_by_uid_[uid];
  if (kept.count(internal)) return Status::Ok();
  if (kept.size() >= cap) {
    return Status::Rejected("uid " + std::to_string(uid) + " keeps " + std::to_string(kept.size()) +
                            " contracts registered, daemon.max_contracts_per_client (" + std::to_string(cap) +
                            "), counted across its attaches: a contract counts until the daemon forgets it (no "
                            "client of it attached and no block of it cached)");
  }
  kept.insert(internal);
  keepers_[internal].push_back(uid);
  return Status::Ok();
}

void Daemon::Impl::RemoveFromStore(const std::map<std::string, std::vector<uint64_t>>& forgotten) {
  if (!contracts_) return;
  for (const auto& [ns, cids] : forgotten) {
    if (Status s = contracts_->Remove(ns, cids); !s.ok()) {
      static LogLimit remove_log;
      uint64_t held = 0;
      if (remove_log.Allow(&held)) {
        spdlog::warn("{} forgotten contracts stay in {} (a restart registers them again): {}{}", cids.size(),
                     contracts_->path(), s.ToString(), HeldBack(held, "such lines"));
      }
    }
  }
}

void Daemon::Impl::ArmSweep() {
  sweep_timer_->expires_after(std::chrono::milliseconds(opts_.config.daemon.contract_sweep_ms));
  sweep_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec || shutting_down_) return;
    if (!sweeping_.exchange(true)) {
      asio::post(admin_, [this] {
        Sweep();
        sweeping_.store(false);
      });
    }
    ArmSweep();
  });
}

void Daemon::Impl::Sweep() {
  // In batches, the lock released between them: registrations and detaches wait for one
  // batch at most, as a listing's bystanders do.
  constexpr size_t kBatch = 256;
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> l(registrants_mu_);
    ids.reserve(idle_.size() + keepers_.size());
    for (const auto& [id, r] : idle_) ids.push_back(id);
    // Counted at admission, never registered (the registration failed after it): not kept.
    for (const auto& [id, uids] : keepers_) {
      if (!idle_.count(id)) ids.push_back(id);
    }
  }
  size_t forgot = 0;
  for (size_t at = 0; at < ids.size(); at += kBatch) {
    std::map<std::string, std::vector<uint64_t>> forgotten;
    std::lock_guard<std::mutex> l(registrants_mu_);
    for (size_t i = at; i < std::min(ids.size(), at + kBatch); ++i) {
      const uint64_t id = ids[i];
      if (registrants_.count(id)) continue;  // registered again meanwhile
      auto it = idle_.find(id);
      if (it == idle_.end()) {
        if (!tm_->HasContract(id)) DropKeptLocked(id);
        continue;
      }
      if (ForgetLocked(id, it->second, &forgotten)) {
        idle_.erase(it);
        ++forgot;
      }
    }
    RemoveFromStore(forgotten);
  }
  if (forgot > 0) {
    static LogLimit sweep_log(std::chrono::seconds(60));
    if (uint64_t held = 0; sweep_log.Allow(&held)) {
      spdlog::info("sweep: forgot {} contracts no client registered whose blocks are gone{}", forgot,
                   HeldBack(held, "sweep lines"));
    }
  }
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
