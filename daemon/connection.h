// Connection: one control-socket connection of kvtierd. Before attach it holds one of the
// daemon's places for unattached connections and reads only an attach; after a successful
// attach (daemon/attach.cc) it owns the client's Session and carries its socket-path
// requests (daemon/connection.cc) and their completions.
//
// Every method runs on the io thread except the completion callbacks, which post back to
// it. Internal to daemon/.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "daemon/server_impl.h"
#include "formats/wire.h"

namespace kvtier::daemon {

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // peer: SO_PEERCRED / SO_PEERGROUPS, read at accept; the connection holds one of the
  // places of daemon.max_unattached (and of its uid's max_unattached_per_uid) until it
  // attaches or closes.
  Connection(Daemon::Impl* d, uint64_t id, UnixSocket sock, PeerCred peer);

  // Reads the attach, which must complete within daemon.attach_timeout_ms.
  void Start();

  // Closes the socket and ends the session (releasing its leases). Idempotent. A
  // non-empty `why` goes to the client first (ControlType::kGoodbye), so that its next
  // call says why it was disconnected.
  void Close(bool drain, const std::string& why = {});

 private:
  // Gives back the unattached places (at attach or close; once).
  void LeaveUnattached();
  void ReadHeader();
  void ReadPayload();
  // One whole message read: an attach (once), or a request of an attached client.
  void Dispatch();

  // ---- the attach handshake (daemon/attach.cc) ----
  void RefuseAttach(wire::AttachReply* r, const Status& s);
  void HandleAttach();
  // The daemon's limits on attached clients, counted by the kernel's credentials of the
  // peer (`cred`) and its tenant: Rejected past any of them.
  Status CheckClientLimits(const ucred& cred, uint32_t tenant) const;
  // What the new session may do (rings, leases, shares, its staging area), from the
  // daemon's config and the negotiated protocol; Unsupported for a client too old for
  // the tiers' slot classes.
  StatusOr<SessionLimits> LimitsOf() const;
  // Fills the accepting reply for `sess` and the fds that travel with it (the ring, the
  // host arena or the tenant's part of it, the staging area), and the host parts listed.
  std::vector<int> FillAttachReply(Session& sess, uint32_t tenant, wire::AttachReply* r,
                                   std::vector<tiers::HostPart>* parts) const;
  // The attach reply goes out with sendmsg (SCM_RIGHTS), outside asio's async writes;
  // nothing else has been written to this socket before it.
  Status SendAttachReply(const wire::AttachReply& r, const std::vector<int>& fds,
                         const std::vector<tiers::HostPart>& parts = {});

  // ---- requests on the socket path (daemon/connection.cc) ----
  void HandleRequest();
  void AppendCompletion(std::vector<uint8_t>* buf, const wire::CompletionEntry& c, const uint8_t* body,
                        size_t n) const;
  // Queues a reply; a client whose unread replies pass daemon.max_socket_queue_bytes is
  // disconnected instead.
  void QueueWrite(std::shared_ptr<std::vector<uint8_t>> buf);
  void WriteNext();

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

}  // namespace kvtier::daemon
