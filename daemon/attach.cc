// The attach handshake of a control connection (daemon/connection.h): the peer's limits,
// the new Session and its limits, and the reply with the fds the client maps (its ring,
// the host arena or its tenant's part of it, its staging area, the HBM IPC handle).
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include <spdlog/spdlog.h>

#include "daemon/connection.h"
#include "kvtier/version.h"

namespace kvtier::daemon {

void Connection::RefuseAttach(wire::AttachReply* r, const Status& s) {
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

Status Connection::CheckClientLimits(const ucred& cred, uint32_t tenant) const {
  const auto& dc = d_->opts_.config.daemon;
  if (d_->attached_ >= dc.max_clients) {
    return Status::Rejected("daemon.max_clients (" + std::to_string(dc.max_clients) + ") clients attached");
  }
  auto count_of = [](const std::map<uint32_t, uint32_t>& m, uint32_t k) {
    auto it = m.find(k);
    return it == m.end() ? 0u : it->second;
  };
  if (count_of(d_->clients_by_uid_, cred.uid) >= dc.max_clients_per_uid) {
    return Status::Rejected("daemon.max_clients_per_uid (" + std::to_string(dc.max_clients_per_uid) +
                            ") clients of uid " + std::to_string(cred.uid) + " attached");
  }
  if (count_of(d_->clients_by_pid_, static_cast<uint32_t>(cred.pid)) >= dc.max_clients_per_pid) {
    return Status::Rejected("daemon.max_clients_per_pid (" + std::to_string(dc.max_clients_per_pid) +
                            ") clients of pid " + std::to_string(cred.pid) + " attached");
  }
  // With tenants, the members of one tenant together (several uids of one tenant would
  // otherwise take every place the per-uid cap leaves).
  if (d_->tenants_->access().tenants_configured() &&
      count_of(d_->clients_by_tenant_, tenant) >= dc.max_clients_per_tenant) {
    return Status::Rejected("daemon.max_clients_per_tenant (" + std::to_string(dc.max_clients_per_tenant) +
                            ") clients of tenant " + d_->tenants_->access().tenant_name(tenant) + " attached");
  }
  return Status::Ok();
}

StatusOr<SessionLimits> Connection::LimitsOf() const {
  const auto& dc = d_->opts_.config.daemon;
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
  lim.bulk_nice = static_cast<int>(dc.bulk_nice);
  lim.protocol_version = protocol_;
  // Slot classes made per contract: a client of protocol 8 or older would address
  // slots by a table of classes fixed at attach.
  if (d_->tm_->classes_at_registration() && protocol_ < 9) {
    // (The reply's message holds 127 bytes.)
    return Status::Unsupported("tiers.slot_classes = \"per-contract\": slot sizes per contract "
                               "need libkvtier of protocol 9 (this one speaks " +
                               std::to_string(protocol_) + ")");
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
  return lim;
}

std::vector<int> Connection::FillAttachReply(Session& sess, uint32_t tenant, wire::AttachReply* r,
                                             std::vector<tiers::HostPart>* parts) const {
  const auto& dc = d_->opts_.config.daemon;
  tiers::TierManager* tm = d_->tm_.get();
  r->protocol_version = protocol_;
  r->slot_bytes = tm->slot_bytes();
  r->ring_bytes = sess.ring_bytes();
  r->max_keys_per_request = dc.max_keys_per_request;
  std::vector<int> fds{sess.ring_fd()};
  // The host arena only with a staging area to write through: a client of protocol
  // < 5 would map it writable, which its seal refuses.
  if (tm->has_tier(tiers::Tier::kHost) && sess.staging() != nullptr) {
    r->flags |= wire::kReplyHasHost | wire::kReplyHasStaging;
    r->host_arena_bytes = tm->host_arena_bytes();
    // Per contract (protocol 9): the area's granules; else its slots of slot_bytes.
    r->staging_slots = tm->classes_at_registration() ? sess.staging()->units() : sess.staging()->slots();
    if (sess.private_reads()) {
      r->flags |= wire::kReplyHostPrivate;
      // Its tenant's part of the arena (tiers.host.tenant_parts), which holds that
      // tenant's blocks only: a protocol-6 client maps it and reads them in place.
      const tiers::HostPart hp = tm->host_part(d_->tenants_->group_of(tenant));
      if (protocol_ >= 6 && hp.bytes > 0) {
        r->flags |= wire::kReplyHostParts;
        parts->push_back(hp);
        fds.push_back(hp.fd);
        sess.SetHostPart(hp.offset, hp.bytes);
      }
    } else {
      fds.push_back(tm->host_arena_fd());
    }
    fds.push_back(sess.staging()->fd());
  }
  if (tm->has_tier(tiers::Tier::kNvme)) r->flags |= wire::kReplyHasNvme;
  // The HBM arena's IPC handle only for a client that attached with a GPU: CUDA IPC maps
  // the arena read-write, so a handle is the power to change every HBM block.
  // A client of protocol 6 or older addresses HBM slot s at s * slot_bytes: none with
  // several HBM slot classes (Session::CheckTarget refuses its HBM leases too).
  if (sess.has_gpu() && tm->has_tier(tiers::Tier::kHbm) &&
      (protocol_ >= 7 || tm->hbm_geometry().classes.size() <= 1)) {
    Status hs = tm->hbm_ipc_handle(r->hbm_ipc_handle);
    if (hs.ok()) r->flags |= wire::kReplyHasHbm;
    else spdlog::warn("HBM IPC handle unavailable: {}", hs.ToString());
  }
  r->num_fds = static_cast<uint32_t>(fds.size());
  return fds;
}

void Connection::HandleAttach() {
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
  // Who is on the other end, as the kernel says (not what the attach request claims).
  ucred cred{};
  socklen_t cred_len = sizeof cred;
  if (::getsockopt(sock_.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0) {
    return RefuseAttach(&r, Status::IoError(std::string("SO_PEERCRED: ") + std::strerror(errno)));
  }
  if (Status ls = CheckClientLimits(cred, tenant); !ls.ok()) return RefuseAttach(&r, ls);
  std::string name(a.name, strnlen(a.name, sizeof a.name));
  for (char& ch : name) {
    if (ch < 0x20 || ch > 0x7e) ch = '?';
  }
  const bool has_gpu = (a.flags & wire::kAttachHasGpu) != 0;
  auto lim = LimitsOf();
  if (!lim.ok()) return RefuseAttach(&r, lim.status());
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
  auto sess = Session::Create(client_id, name, a.pid, has_gpu, d_->tm_.get(), &d_->metrics_, *lim, kick,
                              reload, std::move(registered));
  if (!sess.ok()) return RefuseAttach(&r, sess.status());
  (*sess)->SetPeer(peer_, tenant, d_->tenants_.get());
  (*sess)->SetContractAdmission(
      [impl, uid = cred.uid](uint64_t internal) { return impl->AdmitContract(uid, internal); });
  r.status = 0;
  r.client_id = client_id;
  std::vector<tiers::HostPart> parts;
  const std::vector<int> fds = FillAttachReply(**sess, tenant, &r, &parts);
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

Status Connection::SendAttachReply(const wire::AttachReply& r, const std::vector<int>& fds,
                                   const std::vector<tiers::HostPart>& parts) {
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

}  // namespace kvtier::daemon
