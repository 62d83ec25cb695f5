// Connection (daemon/connection.h): framing, the dispatch of whole messages, the
// socket path's requests and the queue of replies. The attach is in daemon/attach.cc.
#include "daemon/connection.h"

#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include <spdlog/spdlog.h>

namespace kvtier::daemon {

Connection::Connection(Daemon::Impl* d, uint64_t id, UnixSocket sock, PeerCred peer)
    : d_(d), id_(id), sock_(std::move(sock)), peer_(std::move(peer)) {
  ++d_->unattached_;
  ++d_->unattached_by_uid_[peer_.uid];
}

void Connection::Start() {
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

void Connection::Close(bool drain, const std::string& why) {
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

void Connection::LeaveUnattached() {
  if (!unattached_) return;
  unattached_ = false;
  --d_->unattached_;
  if (--d_->unattached_by_uid_[peer_.uid] == 0) d_->unattached_by_uid_.erase(peer_.uid);
}

void Connection::ReadHeader() {
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

void Connection::ReadPayload() {
  auto self = shared_from_this();
  asio::async_read(sock_, asio::buffer(payload_), [self](const boost::system::error_code& ec, size_t) {
    if (ec) return self->Close(false);
    self->Dispatch();
  });
}

void Connection::Dispatch() {
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

void Connection::HandleRequest() {
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


void Connection::AppendCompletion(std::vector<uint8_t>* buf, const wire::CompletionEntry& c, const uint8_t* body,
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

void Connection::QueueWrite(std::shared_ptr<std::vector<uint8_t>> buf) {
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

void Connection::WriteNext() {
  auto self = shared_from_this();
  asio::async_write(sock_, asio::buffer(*writes_.front()),
                    [self](const boost::system::error_code& ec, size_t) {
                      if (ec) return self->Close(false);
                      self->queued_bytes_ -= self->writes_.front()->size();
                      self->writes_.pop_front();
                      if (!self->writes_.empty()) self->WriteNext();
                    });
}

}  // namespace kvtier::daemon
