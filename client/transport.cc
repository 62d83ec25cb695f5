// libkvtier's transports: one request/completion exchange over the shared-memory rings
// (the default) or the unix socket (tools, the benchmark baseline), and the decoding of
// the completion that both share.
//
// Ring: write the input at the start of the data area and leave the output room after
// it, push one RequestEntry, wake the daemon's ring thread if it sleeps, and wait for the
// completion with the same tag (spin, then futex on the completion ring's tail). While it
// waits it also watches the socket, so a daemon that died ends the call with
// DISCONNECTED instead of a hang.
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "client/client_internal.h"
#include "formats/ring_wait.h"

namespace kvtier::lib {

namespace w = kvtier::wire;

namespace {

using Clock = std::chrono::steady_clock;

// True when the daemon's end of the socket is gone.
bool PeerClosed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) return true;
  if (p.revents & POLLIN) {
    char b;
    const ssize_t k = ::recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0;
  }
  return false;
}

// The reason the daemon sent before it closed the socket (ControlType::kGoodbye), or "".
// Reads only what is already there: the peer is gone, nothing more will come.
std::string GoodbyeReason(int fd, const w::ControlHeader* already_read = nullptr) {
  w::ControlHeader h;
  if (already_read != nullptr) {
    h = *already_read;
  } else if (::recv(fd, &h, sizeof h, MSG_DONTWAIT | MSG_WAITALL) != static_cast<ssize_t>(sizeof h)) {
    return {};
  }
  if (!w::ValidateControlHeader(h).ok() || h.type != static_cast<uint16_t>(w::ControlType::kGoodbye) ||
      h.length > w::kMaxGoodbyeBytes) {
    return {};
  }
  std::string why(h.length, '\0');
  if (h.length > 0 && ::recv(fd, why.data(), why.size(), MSG_DONTWAIT | MSG_WAITALL) != static_cast<ssize_t>(why.size())) {
    return {};
  }
  return why;
}

// The daemon closed the connection; the error says why when it said so.
std::string ClosedText(int fd, const w::ControlHeader* already_read = nullptr) {
  const std::string why = GoodbyeReason(fd, already_read);
  return why.empty() ? std::string("kvtierd closed the connection")
                     : "kvtierd closed the connection: " + why;
}

// Gives the connection up: every later call fails at once with the same status and text.
kvtier_status Broken(kvtier_client* c, kvtier_status s, std::string why) {
  AbandonAsync(c, s, why);
  c->broken = true;
  c->broken_reason = why;
  return Fail(s, std::move(why));
}

kvtier_status SocketExchange(kvtier_client* c, w::RequestEntry& req, const void* in, size_t in_len,
                             size_t out_cap, w::CompletionEntry* cmp, std::string* body) {
  req.out_len = static_cast<uint32_t>(out_cap);
  w::ControlHeader h;
  h.type = static_cast<uint16_t>(w::ControlType::kRequest);
  if (sizeof req + in_len > w::kMaxControlPayload) {
    return Fail(KVTIER_INVALID, "request too large for one socket message");
  }
  h.length = static_cast<uint32_t>(sizeof req + in_len);
  std::vector<uint8_t> msg(sizeof h + h.length);
  std::memcpy(msg.data(), &h, sizeof h);
  std::memcpy(msg.data() + sizeof h, &req, sizeof req);
  if (in_len) std::memcpy(msg.data() + sizeof h + sizeof req, in, in_len);
  w::ControlHeader rh;
  if (!WriteAll(c->sock, msg.data(), msg.size()) || !ReadAll(c->sock, &rh, sizeof rh)) {
    return Broken(c, KVTIER_DISCONNECTED, ClosedText(c->sock));
  }
  if (rh.type == static_cast<uint16_t>(w::ControlType::kGoodbye)) {
    return Broken(c, KVTIER_DISCONNECTED, ClosedText(c->sock, &rh));
  }
  if (!w::ValidateControlHeader(rh).ok() || rh.type != static_cast<uint16_t>(w::ControlType::kCompletion) ||
      rh.length < sizeof *cmp) {
    return Broken(c, KVTIER_IO_ERROR, "malformed reply from kvtierd");
  }
  std::vector<uint8_t> payload(rh.length);
  if (!ReadAll(c->sock, payload.data(), payload.size())) {
    return Broken(c, KVTIER_DISCONNECTED, "kvtierd closed the connection");
  }
  std::memcpy(cmp, payload.data(), sizeof *cmp);
  body->assign(reinterpret_cast<const char*>(payload.data() + sizeof *cmp), payload.size() - sizeof *cmp);
  if (cmp->tag != req.tag) return Broken(c, KVTIER_IO_ERROR, "reply tag mismatch");
  return KVTIER_OK;
}

kvtier_status RingExchange(kvtier_client* c, w::RequestEntry& req, const void* in, size_t in_len,
                           size_t out_cap, w::CompletionEntry* cmp, std::string* body) {
  const size_t want_out = std::max<size_t>(out_cap, 256);  // room for an error message
  const uint64_t out_off = (in_len + 7) / 8 * 8;
  if (out_off + want_out > SyncDataBytes(c)) {
    return Fail(KVTIER_INVALID, "request needs " + std::to_string(out_off + want_out) +
                                    " bytes of the ring data area, which has " +
                                    std::to_string(SyncDataBytes(c)) +
                                    (c->async.empty() ? "" : " while asynchronous acquires hold the rest") + " (split it)");
  }
  req.in_off = 0;
  req.out_off = static_cast<uint32_t>(out_off);
  req.out_len = static_cast<uint32_t>(want_out);
  if (in_len) std::memcpy(c->data, in, in_len);
  const auto deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
  // Full only with stale requests of a timed-out call, or indices the daemon gave up on.
  while (!c->req.TryPush(req)) {
    if (PeerClosed(c->sock)) return Broken(c, KVTIER_DISCONNECTED, ClosedText(c->sock));
    if (Clock::now() > deadline) return Fail(KVTIER_TIMEOUT, "request ring stayed full");
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  w::WakeConsumer(c->req);
  const auto spin_end = Clock::now() + std::chrono::microseconds(c->spin_us);
  uint32_t spins = 0;
  c->cmp.SetConsumerCpu(::sched_getcpu());
  while (true) {
    uint32_t n = 0;
    if (!c->cmp.Available(&n)) return Broken(c, KVTIER_IO_ERROR, "completion ring indices are corrupt");
    if (n > 0) {
      c->cmp.Pop(cmp);
      if (cmp->tag == req.tag) break;
      if (!c->async.empty()) (void)FinishAsync(c, *cmp);
      continue;  // otherwise a stale completion of a timed-out call; skip it
    }
    const auto now = Clock::now();
    if (now < spin_end) {
      w::SpinOnce(c->cmp, c->req, &spins);
      continue;
    }
    if (now > deadline) {
      // Its out region may still be written later: retire the connection.
      return Broken(c, KVTIER_TIMEOUT, "no completion within " + std::to_string(c->timeout_ms) +
                                           " ms: the connection is given up (kvtierd may be hung; a late "
                                           "completion would land in reused memory); kvtier_reconnect "
                                           "attaches again, its leases are gone");
    }
    w::SleepUntilPushed(c->cmp, 20'000'000L);
    uint32_t m = 0;
    if (c->cmp.Available(&m) && m == 0 && PeerClosed(c->sock)) {
      return Broken(c, KVTIER_DISCONNECTED, ClosedText(c->sock));
    }
  }
  const size_t room = req.out_len;
  const size_t nbody = std::min<size_t>(std::max<size_t>(cmp->out_bytes, cmp->msg_len), room);
  body->assign(reinterpret_cast<const char*>(c->data + req.out_off), nbody);
  return KVTIER_OK;
}

}  // namespace

bool WriteAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::send(fd, b, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool ReadAll(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t k = ::recv(fd, b, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    b += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

kvtier_status Call(kvtier_client* c, w::RequestEntry req, const void* in, size_t in_len, void* out,
                   size_t out_cap, w::CompletionEntry* done) {
  if (c->broken) {
    if (!c->auto_reconnect) {
      return Fail(KVTIER_DISCONNECTED, "connection to kvtierd is closed (" + c->broken_reason +
                                           "): kvtier_reconnect attaches again");
    }
    const kvtier_status rs = Reconnect(c);
    if (rs != KVTIER_OK) return rs;
  }
  req.tag = c->next_tag++;
  req.in_len = static_cast<uint32_t>(in_len);
  w::CompletionEntry cmp;
  std::string body;
  const kvtier_status xs = c->transport == KVTIER_TRANSPORT_SOCKET
                               ? SocketExchange(c, req, in, in_len, out_cap, &cmp, &body)
                               : RingExchange(c, req, in, in_len, out_cap, &cmp, &body);
  if (xs != KVTIER_OK) return xs;
  *done = cmp;
  if (cmp.status != 0) {
    const std::string msg = body.substr(0, std::min<size_t>(cmp.msg_len, body.size()));
    const int code = cmp.status;
    const kvtier_status s = (code >= 1 && code <= 7) ? static_cast<kvtier_status>(code) : KVTIER_IO_ERROR;
    return Fail(s, std::string("kvtierd: ") + w::OpName(req.op) + ": " +
                       kvtier::StatusCodeName(static_cast<kvtier::StatusCode>(code)) + ": " + msg);
  }
  if (cmp.out_bytes > out_cap || cmp.out_bytes > body.size()) {
    return Fail(KVTIER_IO_ERROR, "completion claims more output than there is room for");
  }
  if (cmp.out_bytes) std::memcpy(out, body.data(), cmp.out_bytes);
  return Ok();
}

}  // namespace kvtier::lib
