// Daemon::Impl: the state of kvtierd's process that its control server, its attach
// handshake, its reload and its contract bookkeeping share. Internal to daemon/; the
// public face is daemon/server.h.
//
// One class, its methods split over files by what they do:
//   daemon/server.cc        start-up, the control socket's listening and accept, signals,
//                           shutdown
//   daemon/connection.h/.cc one control connection: framing, socket-path requests, writes
//   daemon/attach.cc        the attach handshake (limits, the session, the reply's fds)
//   daemon/registrants.cc   who registered each contract, what each uid keeps, the sweep
//   daemon/reload.cc        the config's tier options, and the reload (SIGHUP, kvtierctl)
//   daemon/metrics_http.cc  the /metrics listener and its HTTP exchanges
//
// Threads: the fields the comments mark "io thread only" are touched by the io thread
// alone; registrants_mu_ and reload_mu_ guard what their comments say; the rest is set in
// Start and read-only after it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "common/log_limit.h"
#include "daemon/access.h"
#include "daemon/contract_store.h"
#include "daemon/metrics.h"
#include "daemon/server.h"
#include "daemon/session.h"
#include "daemon/staging.h"

namespace kvtier::daemon {

namespace asio = boost::asio;
using UnixSocket = asio::local::stream_protocol::socket;

// A path of the config made absolute (the daemon's folders and files).
inline std::string Abs(const std::string& p) { return std::filesystem::absolute(p).lexically_normal().string(); }

class Connection;

class Daemon::Impl {
 public:
  explicit Impl(Options opts) : opts_(std::move(opts)), signals_(io_, SIGINT, SIGTERM, SIGHUP) {}

  // Start-up (daemon/server.cc): OpenTiers opens the TierManager and registers again
  // the contracts kept for restarts; ListenMetrics (daemon/metrics_http.cc) binds /metrics.
  Status Start();
  Status OpenTiers();
  Status ListenMetrics();
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
  // Out of fds: the spare goes, one pending connection on listen_fd is taken and closed,
  // and the spare is opened again (spare_fd_ below).
  void ShedPending(int listen_fd);
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

}  // namespace kvtier::daemon
