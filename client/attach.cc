// libkvtier's attach: connect to the daemon's unix socket, send AttachRequest, receive
// AttachReply with the ring region's memfd (and the host arena's) by SCM_RIGHTS, check
// the region's header and map both. After that every request goes through transport.cc.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "client/client_internal.h"

namespace kvtier::lib {

namespace w = kvtier::wire;

namespace {

// Bounds the socket's next blocking call (connect, send, receive) by what is left of the
// attach's deadline; at least 1 ms, so that an expired deadline still fails the call.
void BoundBy(int sock, std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now());
  const int64_t us = std::max<int64_t>(1000, left.count());
  timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  (void)::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

}  // namespace

kvtier_status Attach(const char* socket_path, const kvtier_connect_options* opts, kvtier_client* c) {
  // The whole attach (connect, request, reply) within timeout_ms: a daemon that accepts
  // and never answers, or whose backlog is full, is a timeout, not a hang.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(c->timeout_ms);
  auto timed_out = [&] { return (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINPROGRESS) &&
                                std::chrono::steady_clock::now() >= deadline - std::chrono::milliseconds(1); };
  sockaddr_un addr{};
  if (std::strlen(socket_path) >= sizeof addr.sun_path) return Fail(KVTIER_INVALID, "socket path too long");
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, socket_path);
  c->sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->sock >= 0) BoundBy(c->sock, deadline);
  if (c->sock < 0 || ::connect(c->sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string err = std::strerror(errno);
    const bool late = c->sock >= 0 && timed_out();
    Detach(c);
    if (late) {
      return Fail(KVTIER_TIMEOUT, std::string("cannot connect to ") + socket_path + " within " +
                                      std::to_string(c->timeout_ms) + " ms (timeout_ms)");
    }
    return Fail(KVTIER_IO_ERROR, std::string("cannot connect to ") + socket_path + ": " + err);
  }
  w::AttachRequest a;
  a.flags = (opts && opts->has_gpu) ? w::kAttachHasGpu : 0;
  a.pid = static_cast<uint32_t>(::getpid());
  std::snprintf(a.name, sizeof a.name, "%s", (opts && opts->name) ? opts->name : "libkvtier");
  w::ControlHeader h;
  h.type = static_cast<uint16_t>(w::ControlType::kAttach);
  h.length = sizeof a;
  uint8_t msg[sizeof h + sizeof a];
  std::memcpy(msg, &h, sizeof h);
  std::memcpy(msg + sizeof h, &a, sizeof a);
  BoundBy(c->sock, deadline);
  // A daemon that refuses the peer at accept (its credentials, its uid's unattached
  // connections) sends the refusal and closes before reading: the send may fail then,
  // and the refusal waiting on the socket is the answer.
  const bool sent = WriteAll(c->sock, msg, sizeof msg);
  const int send_errno = errno;
  // The reply carries the fds (SCM_RIGHTS) with its first bytes.
  uint8_t buf[sizeof(w::ControlHeader) + sizeof(w::AttachReply)];
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * 8)];
  iovec iov{buf, sizeof buf};
  msghdr mh{};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctrl;
  mh.msg_controllen = sizeof ctrl;
  ssize_t got;
  BoundBy(c->sock, deadline);
  do {
    got = ::recvmsg(c->sock, &mh, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
  const bool reply_late = got < 0 && timed_out();
  std::vector<int> fds;
  for (cmsghdr* cm = got > 0 ? CMSG_FIRSTHDR(&mh) : nullptr; cm; cm = CMSG_NXTHDR(&mh, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      const size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < n; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        fds.push_back(fd);
      }
    }
  }
  auto close_fds = [&] {
    for (int fd : fds) ::close(fd);
  };
  if (got <= 0 || (static_cast<size_t>(got) < sizeof buf &&
                   !ReadAll(c->sock, buf + got, sizeof buf - static_cast<size_t>(got)))) {
    const bool late = reply_late || (got > 0 && timed_out());
    close_fds();
    Detach(c);
    if (!sent) return Fail(KVTIER_IO_ERROR, std::string("attach: send failed: ") + std::strerror(send_errno));
    if (late) {
      return Fail(KVTIER_TIMEOUT, "attach: no reply from kvtierd within " + std::to_string(c->timeout_ms) +
                                      " ms (timeout_ms)");
    }
    return Fail(KVTIER_DISCONNECTED, "attach: kvtierd closed the connection");
  }
  // Requests have their own deadline (transport.cc); the socket blocks again as before.
  {
    timeval none{0, 0};
    (void)::setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    (void)::setsockopt(c->sock, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  }
  w::ControlHeader rh;
  std::memcpy(&rh, buf, sizeof rh);
  std::memcpy(&c->reply, buf + sizeof rh, sizeof c->reply);
  const w::AttachReply& r = c->reply;
  // Protocol 5: an accepting reply is followed by the host tier's slot classes; protocol 6
  // with kReplyHostParts, then by the host parts this client maps; protocol 7, then by the
  // HBM tier's slot classes.
  const bool parts_flag = (r.flags & w::kReplyHostParts) != 0;
  const bool with_hbm = r.status == 0 && r.protocol_version >= 7;
  const size_t tail = sizeof(w::SlotClassTable) + (parts_flag ? sizeof(w::HostPartTable) : 0) +
                      (with_hbm ? sizeof(w::HbmGeometry) : 0);
  const bool with_table = rh.length == sizeof(w::AttachReply) + tail;
  const bool with_parts = with_table && parts_flag;
  if (!w::ValidateControlHeader(rh).ok() || rh.type != static_cast<uint16_t>(w::ControlType::kAttachReply) ||
      (rh.length != sizeof(w::AttachReply) && !with_table) ||
      (with_table && (r.status != 0 || r.protocol_version < 5)) ||
      (parts_flag && !with_parts) || (with_parts && r.protocol_version < 6) || (with_hbm && !with_table)) {
    close_fds();
    Detach(c);
    return Fail(KVTIER_IO_ERROR, "attach: malformed reply");
  }
  c->host_classes = w::SlotClassTable{};
  c->host_parts = w::HostPartTable{};
  c->hbm = w::HbmGeometry{};
  if ((with_table && !ReadAll(c->sock, &c->host_classes, sizeof c->host_classes)) ||
      (with_parts && !ReadAll(c->sock, &c->host_parts, sizeof c->host_parts)) ||
      (with_hbm && !ReadAll(c->sock, &c->hbm, sizeof c->hbm))) {
    close_fds();
    Detach(c);
    return Fail(KVTIER_DISCONNECTED, "attach: kvtierd closed the connection");
  }
  if (r.status == 0 && (r.protocol_version < w::kMinProtocolVersion || r.protocol_version > w::kProtocolVersion)) {
    close_fds();
    Detach(c);
    return Fail(KVTIER_UNSUPPORTED, "attach: kvtierd chose protocol version " + std::to_string(r.protocol_version) +
                                        ", outside this library's " + std::to_string(w::kMinProtocolVersion) + " to " +
                                        std::to_string(w::kProtocolVersion));
  }
  if (r.status != 0) {
    char m[sizeof r.message + 1] = {};
    std::memcpy(m, r.message, sizeof r.message);
    const kvtier_status s = (r.status >= 1 && r.status <= 7) ? static_cast<kvtier_status>(r.status) : KVTIER_IO_ERROR;
    close_fds();
    Detach(c);
    return Fail(s, std::string("attach refused: ") + m);
  }
  const bool has_host = (r.flags & w::kReplyHasHost) != 0;
  const bool has_staging = (r.flags & w::kReplyHasStaging) != 0;
  // Private: no arena fd (the daemon has tenants); the staging area is fd [1], or fd
  // [n + 1] after the n host parts this client maps (kReplyHostParts).
  const bool host_private = (r.flags & w::kReplyHostPrivate) != 0;
  const uint32_t n_parts = c->host_parts.count;
  const size_t want_fds = 1u + (has_host && !host_private ? 1u : 0u) + n_parts + (has_staging ? 1u : 0u);
  if (fds.size() != r.num_fds || fds.size() != want_fds || has_host != has_staging || (host_private && !has_host) ||
      (with_parts && (!host_private || n_parts < 1 || n_parts > w::kMaxWireHostParts))) {
    close_fds();
    Detach(c);
    return Fail(KVTIER_IO_ERROR, "attach: expected " + std::to_string(want_fds) + " fds (host arena and staging "
                                     "area together), got " + std::to_string(fds.size()));
  }
  struct stat st;
  if (::fstat(fds[0], &st) != 0 || static_cast<uint64_t>(st.st_size) != r.ring_bytes) {
    close_fds();
    Detach(c);
    return Fail(KVTIER_IO_ERROR, "attach: ring region size mismatch");
  }
  void* p = ::mmap(nullptr, r.ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  if (p == MAP_FAILED) {
    const std::string err = std::strerror(errno);
    close_fds();
    Detach(c);
    return Fail(KVTIER_IO_ERROR, "attach: mmap ring region: " + err);
  }
  c->ring = static_cast<uint8_t*>(p);
  c->ring_bytes = r.ring_bytes;
  std::memcpy(&c->hdr, c->ring, sizeof c->hdr);
  kvtier::Status hs = w::CheckRingHeader(c->hdr, c->ring_bytes);
  if (!hs.ok()) {
    close_fds();
    Detach(c);
    return Fail(KVTIER_IO_ERROR, "attach: " + hs.ToString());
  }
  if (r.flags & w::kReplyHasHbm) {
    // The HBM tier's granule and classes, checked as the host's below. A daemon of
    // protocol 6 or older sent none: one class, HBM slot s at s * slot_bytes (arena size
    // unknown).
    w::SlotClassTable& t = c->hbm.classes;
    if (!with_hbm) {
      t.count = 1;
      t.granule = r.slot_bytes;
      t.class_bytes[0] = r.slot_bytes;
    }
    // Protocol 9, per contract: no classes, the granule alone (the register completion
    // gives each contract's slot).
    const bool hbm_per_contract = with_hbm && r.protocol_version >= 9 && t.flags == w::kSlotClassesPerContract;
    bool ok = hbm_per_contract
                  ? t.count == 0 && t.granule > 0 && t.granule % 4096 == 0 && c->hbm.arena_bytes % t.granule == 0
                  : t.count >= 1 && t.count <= w::kMaxWireSlotClasses && t.granule > 0 && t.granule % 4096 == 0 &&
                        t.flags == 0 && t.class_bytes[t.count - 1] == r.slot_bytes &&
                        c->hbm.arena_bytes % t.granule == 0;
    for (uint32_t i = 0; ok && i < t.count; ++i) {
      const uint64_t k = t.class_bytes[i];
      ok = k > 0 && k % t.granule == 0 && (i == 0 || k > t.class_bytes[i - 1]) &&
           (!with_hbm || k <= c->hbm.arena_bytes);
    }
    if (!ok) {
      close_fds();
      Detach(c);
      return Fail(KVTIER_IO_ERROR, "attach: malformed HBM slot class table");
    }
  } else {
    c->hbm = w::HbmGeometry{};
  }
  c->req = w::RequestRing(c->ring, c->hdr);
  c->cmp = w::CompletionRing(c->ring, c->hdr);
  c->data = c->ring + c->hdr.data_offset;
  if (has_host) {
    // The host tier's granule and classes: ascending, each a whole number of granules, the
    // largest the daemon's slot_bytes, the arena a whole number of granules. A table that
    // says otherwise is refused. A daemon that sent none has one class: granule slot_bytes.
    w::SlotClassTable& t = c->host_classes;
    if (!with_table && r.slot_bytes > 0) {
      t.count = 1;
      t.granule = r.slot_bytes;
      t.slab_bytes = r.host_arena_bytes;
      t.class_bytes[0] = r.slot_bytes;
    }
    // Protocol 9, per contract: no classes, the granule alone.
    const bool per_contract = with_table && r.protocol_version >= 9 && t.flags == w::kSlotClassesPerContract;
    bool table_ok = per_contract ? t.count == 0 && t.granule > 0 && t.granule % 4096 == 0 &&
                                       r.host_arena_bytes % t.granule == 0
                                 : t.count >= 1 && t.count <= w::kMaxWireSlotClasses && t.granule > 0 &&
                                       t.granule % 4096 == 0 && t.flags == 0 &&
                                       t.class_bytes[t.count - 1] == r.slot_bytes &&
                                       r.host_arena_bytes % t.granule == 0;
    for (uint32_t i = 0; table_ok && i < t.count; ++i) {
      const uint64_t k = t.class_bytes[i];
      table_ok = k > 0 && k % t.granule == 0 && (i == 0 || k > t.class_bytes[i - 1]) && k <= r.host_arena_bytes;
    }
    // Parts: granule-aligned, inside the arena, in order without overlap, each fd as large.
    for (uint32_t i = 0; table_ok && i < n_parts; ++i) {
      const auto& pt = c->host_parts.parts[i];
      table_ok = pt.bytes > 0 && pt.offset % t.granule == 0 && pt.bytes % t.granule == 0 &&
                 pt.offset <= r.host_arena_bytes && pt.bytes <= r.host_arena_bytes - pt.offset &&
                 (i == 0 || pt.offset >= c->host_parts.parts[i - 1].offset + c->host_parts.parts[i - 1].bytes) &&
                 ::fstat(fds[1 + i], &st) == 0 && static_cast<uint64_t>(st.st_size) >= pt.bytes;
    }
    if (!table_ok) {
      close_fds();
      Detach(c);
      return Fail(KVTIER_IO_ERROR, "attach: malformed host slot class or part table");
    }
    // One window: the arena read-only (sealed: a writable mapping is refused), then this
    // client's staging area writable right after it, so that host slot s of either kind
    // is at window + s * granule (HostSlot) and staging ids follow arena ids. A staging
    // slot holds the largest class (slot_bytes); per contract, the area is staging_slots
    // granules, a staging slot as long as its contract's. Without the arena fd (private)
    // the arena's part of the window stays unmapped.
    const int arena_fd = host_private ? -1 : fds[1];
    const int staging_fd = host_private ? fds[1 + n_parts] : fds[2];
    const uint64_t staging_bytes = uint64_t{r.staging_slots} * (per_contract ? t.granule : r.slot_bytes);
    struct stat sst;
    if ((arena_fd >= 0 && (::fstat(arena_fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < r.host_arena_bytes)) ||
        r.slot_bytes == 0 || r.staging_slots == 0 ||
        ::fstat(staging_fd, &sst) != 0 || static_cast<uint64_t>(sst.st_size) < staging_bytes) {
      close_fds();
      Detach(c);
      return Fail(KVTIER_IO_ERROR, "attach: host arena or staging area size mismatch");
    }
    const uint64_t window = r.host_arena_bytes + staging_bytes;
    p = ::mmap(nullptr, window, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    void* arena = p == MAP_FAILED || arena_fd < 0
                      ? p
                      : ::mmap(p, r.host_arena_bytes, PROT_READ, MAP_SHARED | MAP_FIXED, arena_fd, 0);
    // Its tenant's parts of the arena, read-only, each at its offset (the rest of the
    // arena's part of the window stays unmapped).
    for (uint32_t i = 0; i < n_parts && arena != MAP_FAILED; ++i) {
      const auto& pt = c->host_parts.parts[i];
      if (::mmap(static_cast<uint8_t*>(p) + pt.offset, pt.bytes, PROT_READ, MAP_SHARED | MAP_FIXED, fds[1 + i], 0) ==
          MAP_FAILED) {
        arena = MAP_FAILED;
      }
    }
    void* staged = arena == MAP_FAILED ? MAP_FAILED
                                       : ::mmap(static_cast<uint8_t*>(p) + r.host_arena_bytes, staging_bytes,
                                                PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, staging_fd, 0);
    if (staged == MAP_FAILED) {
      const std::string err = std::strerror(errno);
      if (p != MAP_FAILED) ::munmap(p, window);
      close_fds();
      Detach(c);
      return Fail(KVTIER_IO_ERROR, "attach: mmap host arena and staging area: " + err);
    }
    c->host = static_cast<uint8_t*>(p);
    c->host_bytes = window;
    c->host_arena_bytes = r.host_arena_bytes;
    c->host_fd = arena_fd;  // kept: kvtier_host_arena_fd (a language binding maps it itself; -1 private)
    c->staging_fd = staging_fd;  // kept: kvtier_host_staging_fd
    c->host_private = host_private;
    for (uint32_t i = 0; i < n_parts; ++i) c->part_fds[i] = fds[1 + i];  // kept: kvtier_host_parts
    fds.resize(1);
  }
  close_fds();  // the mappings stay
  ++c->attaches;
  return Ok();
}


void Detach(kvtier_client* c) {
  if (c->ring) ::munmap(c->ring, c->ring_bytes);
  if (c->host) ::munmap(c->host, c->host_bytes);
  if (c->sock >= 0) ::close(c->sock);
  if (c->host_fd >= 0) ::close(c->host_fd);
  if (c->staging_fd >= 0) ::close(c->staging_fd);
  for (int& fd : c->part_fds) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  c->host_parts = kvtier::wire::HostPartTable{};
#if KVTIER_HAVE_CUDA
  if (c->hbm_ptr) cudaIpcCloseMemHandle(c->hbm_ptr);
#endif
  c->ring = nullptr;
  c->ring_bytes = 0;
  c->host = nullptr;
  c->host_bytes = 0;
  c->sock = -1;
  c->host_fd = -1;
  c->staging_fd = -1;
  c->host_arena_bytes = 0;
  c->host_private = false;
  c->hbm_ptr = nullptr;
  c->data = nullptr;
  c->req = {};
  c->cmp = {};
}

namespace {
std::atomic<uint64_t> g_fork_generation{0};
void AfterForkInChild() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

uint64_t ForkGeneration() {
  static const bool registered = [] { return ::pthread_atfork(nullptr, nullptr, AfterForkInChild) == 0; }();
  (void)registered;
  return g_fork_generation.load(std::memory_order_relaxed);
}

}  // namespace kvtier::lib
