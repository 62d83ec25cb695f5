// libkvtier: attach over the unix socket, then requests through the shared-memory rings
// (formats/wire.h). Implements the C ABI of client/include/kvtier/kvtier.h; nothing here
// throws across it (every entry point catches, just in case an allocation fails).
//
// One request in flight per client: a call takes the client's mutex, writes its input at
// the start of the data area and its output room after it, pushes one RequestEntry,
// wakes the daemon's ring thread if it sleeps, and waits for the completion with the
// same tag (spin, then futex on the completion ring's tail). While it waits it also
// watches the socket, so a daemon that died ends the call with DISCONNECTED instead of a
// hang.
#include "kvtier/kvtier.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <chrono>
#include <climits>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "formats/contract.h"
#include "formats/keys.h"
#include "formats/wire.h"

namespace w = kvtier::wire;

struct kvtier_client {
  int sock = -1;
  uint8_t* ring = nullptr;
  uint64_t ring_bytes = 0;
  w::RingRegionHeader hdr;
  w::RingView<w::RequestEntry> req;
  w::RingView<w::CompletionEntry> cmp;
  uint8_t* data = nullptr;
  uint8_t* host = nullptr;
  uint64_t host_bytes = 0;
  w::AttachReply reply;
  std::mutex mu;
  uint64_t next_tag = 1;
  bool broken = false;
  kvtier_transport transport = KVTIER_TRANSPORT_RING;
  uint32_t timeout_ms = 60000;
  uint32_t spin_us = 50;
  void* hbm_ptr = nullptr;
};

namespace {

using Clock = std::chrono::steady_clock;

thread_local std::string g_last_error;

kvtier_status Fail(kvtier_status s, std::string msg) {
  g_last_error = std::move(msg);
  return s;
}
kvtier_status Ok() {
  g_last_error.clear();
  return KVTIER_OK;
}
kvtier_status FromStatus(const kvtier::Status& s) {
  if (s.ok()) return Ok();
  return Fail(static_cast<kvtier_status>(s.code()), s.ToString());
}

void FutexWait(uint32_t* addr, uint32_t expected, long timeout_ns) {
  timespec ts{timeout_ns / 1000000000L, timeout_ns % 1000000000L};
  ::syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void FutexWake(uint32_t* addr) { ::syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

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

kvtier::Status ToContract(const kvtier_contract_desc* d, kvtier::ScaleContract* c) {
  if (d == nullptr) return kvtier::Status::Invalid("contract description is NULL");
  if (d->model_id == nullptr) return kvtier::Status::Invalid("contract model_id is NULL");
  c->model_id = d->model_id;
  c->model_revision = d->model_revision ? d->model_revision : "";
  c->tokenizer_revision = d->tokenizer_revision ? d->tokenizer_revision : "";
  c->geometry = kvtier::Geometry{d->num_layers, d->num_kv_heads, d->head_dim, d->block_tokens};
  c->tp_rank = d->tp_rank;
  c->tp_size = d->tp_size == 0 ? 1 : d->tp_size;
  if (d->kv_format > 2) return kvtier::Status::Invalid("kv_format " + std::to_string(d->kv_format) + " unknown");
  if (d->scale_rule > 1) return kvtier::Status::Invalid("scale_rule " + std::to_string(d->scale_rule) + " unknown");
  if (d->v_scale_swizzle > 1 || d->reserved != 0) return kvtier::Status::Invalid("contract flag bytes malformed");
  c->format = static_cast<kvtier::KvFormat>(d->kv_format);
  c->scale_rule = static_cast<kvtier::nvfp4::ScaleRule>(d->scale_rule);
  c->v_scale_swizzle = d->v_scale_swizzle != 0;
  if (d->num_layers == 0 || d->num_layers > 1024) {
    return kvtier::Status::Invalid("num_layers " + std::to_string(d->num_layers) + " not in [1, 1024]");
  }
  c->SetUnitScales();
  if (d->k_scales) c->k_scales.assign(d->k_scales, d->k_scales + d->num_layers);
  if (d->v_scales) c->v_scales.assign(d->v_scales, d->v_scales + d->num_layers);
  return c->Validate();
}

// One request/completion exchange. `in` goes to the daemon; up to out_cap bytes of its
// output land in `out`. Caller holds c->mu.
kvtier_status Call(kvtier_client* c, w::RequestEntry req, const void* in, size_t in_len, void* out,
                   size_t out_cap, w::CompletionEntry* done) {
  if (c->broken) return Fail(KVTIER_DISCONNECTED, "connection to kvtierd is closed");
  req.tag = c->next_tag++;
  req.in_len = static_cast<uint32_t>(in_len);
  const size_t want_out = std::max<size_t>(out_cap, 256);  // room for an error message
  w::CompletionEntry cmp;
  std::string body;
  if (c->transport == KVTIER_TRANSPORT_SOCKET) {
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
      c->broken = true;
      return Fail(KVTIER_DISCONNECTED, "kvtierd closed the connection");
    }
    if (!w::ValidateControlHeader(rh).ok() || rh.type != static_cast<uint16_t>(w::ControlType::kCompletion) ||
        rh.length < sizeof cmp) {
      c->broken = true;
      return Fail(KVTIER_IO_ERROR, "malformed reply from kvtierd");
    }
    std::vector<uint8_t> payload(rh.length);
    if (!ReadAll(c->sock, payload.data(), payload.size())) {
      c->broken = true;
      return Fail(KVTIER_DISCONNECTED, "kvtierd closed the connection");
    }
    std::memcpy(&cmp, payload.data(), sizeof cmp);
    body.assign(reinterpret_cast<const char*>(payload.data() + sizeof cmp), payload.size() - sizeof cmp);
    if (cmp.tag != req.tag) {
      c->broken = true;
      return Fail(KVTIER_IO_ERROR, "reply tag mismatch");
    }
  } else {
    const uint64_t out_off = (in_len + 7) / 8 * 8;
    if (out_off + want_out > c->hdr.data_bytes) {
      return Fail(KVTIER_INVALID, "request needs " + std::to_string(out_off + want_out) +
                                      " bytes of the ring data area, which has " +
                                      std::to_string(c->hdr.data_bytes) + " (split it)");
    }
    req.in_off = 0;
    req.out_off = static_cast<uint32_t>(out_off);
    req.out_len = static_cast<uint32_t>(want_out);
    if (in_len) std::memcpy(c->data, in, in_len);
    const auto deadline = Clock::now() + std::chrono::milliseconds(c->timeout_ms);
    while (!c->req.TryPush(req)) {  // full only with stale requests of a timed-out call
      if (Clock::now() > deadline) return Fail(KVTIER_TIMEOUT, "request ring stayed full");
      CpuRelax();
    }
    if (c->req.ConsumerSleeping()) FutexWake(c->req.tail_word());
    const auto spin_end = Clock::now() + std::chrono::microseconds(c->spin_us);
    bool got = false;
    uint32_t spins = 0;
    c->cmp.SetConsumerCpu(::sched_getcpu());
    while (!got) {
      uint32_t n = 0;
      if (!c->cmp.Available(&n)) {
        c->broken = true;
        return Fail(KVTIER_IO_ERROR, "completion ring indices are corrupt");
      }
      if (n > 0) {
        c->cmp.Pop(&cmp);
        if (cmp.tag == req.tag) got = true;  // else: a stale completion; skip it
        continue;
      }
      const auto now = Clock::now();
      if (now < spin_end) {
        // Bounded spin, then futex sleep. Yield now and then only while the daemon's ring
        // thread last ran on this same CPU (it cannot answer while we spin here); else
        // never: a yield gives the CPU to any runnable task for a whole CFS slice (wire.h).
        CpuRelax();
        if ((++spins & 63) == 0) {
          const int cpu = ::sched_getcpu();
          c->cmp.SetConsumerCpu(cpu);
          if (cpu >= 0 && cpu == c->req.ConsumerCpu()) ::sched_yield();
        }
        continue;
      }
      if (now > deadline) {
        c->broken = true;  // its out region may still be written later: retire the client
        return Fail(KVTIER_TIMEOUT, "no completion within " + std::to_string(c->timeout_ms) + " ms");
      }
      c->cmp.SetSleeping(true);
      const uint32_t tail = c->cmp.LoadTail();
      uint32_t m = 0;
      if (c->cmp.Available(&m) && m == 0) FutexWait(c->cmp.tail_word(), tail, 20'000'000L);
      c->cmp.SetSleeping(false);
      if (c->cmp.Available(&m) && m == 0 && PeerClosed(c->sock)) {
        c->broken = true;
        return Fail(KVTIER_DISCONNECTED, "kvtierd closed the connection");
      }
    }
    const size_t room = req.out_len;
    const size_t nbody = std::min<size_t>(std::max<size_t>(cmp.out_bytes, cmp.msg_len), room);
    body.assign(reinterpret_cast<const char*>(c->data + req.out_off), nbody);
  }
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

#define KVTIER_GUARD_BEGIN try {
#define KVTIER_GUARD_END                                                  \
  }                                                                      \
  catch (const std::bad_alloc&) {                                        \
    return Fail(KVTIER_REJECTED, "out of memory");                       \
  }                                                                      \
  catch (...) {                                                          \
    return Fail(KVTIER_INVALID, "internal error (exception)");           \
  }

kvtier_status CheckClient(const kvtier_client* c) {
  if (c == nullptr) return Fail(KVTIER_INVALID, "client is NULL");
  return KVTIER_OK;
}

void Teardown(kvtier_client* c) {
  if (c->ring) ::munmap(c->ring, c->ring_bytes);
  if (c->host) ::munmap(c->host, c->host_bytes);
  if (c->sock >= 0) ::close(c->sock);
#if KVTIER_HAVE_CUDA
  if (c->hbm_ptr) cudaIpcCloseMemHandle(c->hbm_ptr);
#endif
  delete c;
}

}  // namespace

extern "C" {

const char* kvtier_status_name(kvtier_status s) {
  switch (s) {
    case KVTIER_OK: return "OK";
    case KVTIER_NOT_FOUND: return "NOT_FOUND";
    case KVTIER_REJECTED: return "REJECTED";
    case KVTIER_RETRY: return "RETRY";
    case KVTIER_IO_ERROR: return "IO_ERROR";
    case KVTIER_CORRUPT: return "CORRUPT";
    case KVTIER_INVALID: return "INVALID";
    case KVTIER_UNSUPPORTED: return "UNSUPPORTED";
    case KVTIER_DISCONNECTED: return "DISCONNECTED";
    case KVTIER_TIMEOUT: return "TIMEOUT";
  }
  return "UNKNOWN";
}

const char* kvtier_last_error(void) { return g_last_error.c_str(); }
uint32_t kvtier_protocol_version(void) { return w::kProtocolVersion; }

const char* kvtier_version(void) { return KVTIER_VERSION_STRING; }

kvtier_status kvtier_connect(const char* socket_path, const kvtier_connect_options* opts,
                             kvtier_client** out) {
  KVTIER_GUARD_BEGIN
  if (socket_path == nullptr || out == nullptr) return Fail(KVTIER_INVALID, "socket_path and out are required");
  *out = nullptr;
  sockaddr_un addr{};
  if (std::strlen(socket_path) >= sizeof addr.sun_path) return Fail(KVTIER_INVALID, "socket path too long");
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, socket_path);
  auto* c = new kvtier_client();
  if (opts) {
    if (opts->timeout_ms) c->timeout_ms = opts->timeout_ms;
    if (opts->spin_us) c->spin_us = opts->spin_us;
  }
  c->sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->sock < 0 || ::connect(c->sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const std::string err = std::strerror(errno);
    Teardown(c);
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
  if (!WriteAll(c->sock, msg, sizeof msg)) {
    Teardown(c);
    return Fail(KVTIER_IO_ERROR, "attach: send failed");
  }
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
  do {
    got = ::recvmsg(c->sock, &mh, MSG_CMSG_CLOEXEC);
  } while (got < 0 && errno == EINTR);
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
    close_fds();
    Teardown(c);
    return Fail(KVTIER_DISCONNECTED, "attach: kvtierd closed the connection");
  }
  w::ControlHeader rh;
  std::memcpy(&rh, buf, sizeof rh);
  std::memcpy(&c->reply, buf + sizeof rh, sizeof c->reply);
  const w::AttachReply& r = c->reply;
  if (!w::ValidateControlHeader(rh).ok() || rh.type != static_cast<uint16_t>(w::ControlType::kAttachReply) ||
      rh.length != sizeof(w::AttachReply)) {
    close_fds();
    Teardown(c);
    return Fail(KVTIER_IO_ERROR, "attach: malformed reply");
  }
  if (r.status != 0) {
    char m[sizeof r.message + 1] = {};
    std::memcpy(m, r.message, sizeof r.message);
    const kvtier_status s = (r.status >= 1 && r.status <= 7) ? static_cast<kvtier_status>(r.status) : KVTIER_IO_ERROR;
    close_fds();
    Teardown(c);
    return Fail(s, std::string("attach refused: ") + m);
  }
  const bool has_host = (r.flags & w::kReplyHasHost) != 0;
  if (fds.size() != r.num_fds || fds.size() != (has_host ? 2u : 1u)) {
    close_fds();
    Teardown(c);
    return Fail(KVTIER_IO_ERROR, "attach: expected " + std::to_string(has_host ? 2 : 1) + " fds, got " +
                                     std::to_string(fds.size()));
  }
  struct stat st;
  if (::fstat(fds[0], &st) != 0 || static_cast<uint64_t>(st.st_size) != r.ring_bytes) {
    close_fds();
    Teardown(c);
    return Fail(KVTIER_IO_ERROR, "attach: ring region size mismatch");
  }
  void* p = ::mmap(nullptr, r.ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
  if (p == MAP_FAILED) {
    const std::string err = std::strerror(errno);
    close_fds();
    Teardown(c);
    return Fail(KVTIER_IO_ERROR, "attach: mmap ring region: " + err);
  }
  c->ring = static_cast<uint8_t*>(p);
  c->ring_bytes = r.ring_bytes;
  std::memcpy(&c->hdr, c->ring, sizeof c->hdr);
  kvtier::Status hs = w::CheckRingHeader(c->hdr, c->ring_bytes);
  if (!hs.ok()) {
    close_fds();
    Teardown(c);
    return Fail(KVTIER_IO_ERROR, "attach: " + hs.ToString());
  }
  c->req = w::RequestRing(c->ring, c->hdr);
  c->cmp = w::CompletionRing(c->ring, c->hdr);
  c->data = c->ring + c->hdr.data_offset;
  if (has_host) {
    if (::fstat(fds[1], &st) != 0 || static_cast<uint64_t>(st.st_size) < r.host_arena_bytes) {
      close_fds();
      Teardown(c);
      return Fail(KVTIER_IO_ERROR, "attach: host arena size mismatch");
    }
    p = ::mmap(nullptr, r.host_arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fds[1], 0);
    if (p == MAP_FAILED) {
      const std::string err = std::strerror(errno);
      close_fds();
      Teardown(c);
      return Fail(KVTIER_IO_ERROR, "attach: mmap host arena: " + err);
    }
    c->host = static_cast<uint8_t*>(p);
    c->host_bytes = r.host_arena_bytes;
  }
  close_fds();  // the mappings stay
  *out = c;
  return Ok();
  KVTIER_GUARD_END
}

void kvtier_close(kvtier_client* c) {
  if (c != nullptr) Teardown(c);
}

kvtier_status kvtier_set_transport(kvtier_client* c, kvtier_transport t) {
  if (CheckClient(c)) return KVTIER_INVALID;
  if (t != KVTIER_TRANSPORT_RING && t != KVTIER_TRANSPORT_SOCKET) return Fail(KVTIER_INVALID, "unknown transport");
  std::lock_guard<std::mutex> l(c->mu);
  c->transport = t;
  return Ok();
}

uint64_t kvtier_client_id(const kvtier_client* c) { return c ? c->reply.client_id : 0; }
uint64_t kvtier_slot_bytes(const kvtier_client* c) { return c ? c->reply.slot_bytes : 0; }

void* kvtier_host_arena(const kvtier_client* c, uint64_t* bytes) {
  if (bytes) *bytes = c ? c->host_bytes : 0;
  return c ? c->host : nullptr;
}

kvtier_status kvtier_hbm_ipc_handle(const kvtier_client* c, uint8_t out[64]) {
  if (CheckClient(c) || out == nullptr) return Fail(KVTIER_INVALID, "client and out are required");
  if (!(c->reply.flags & w::kReplyHasHbm)) return Fail(KVTIER_UNSUPPORTED, "the daemon has no HBM tier");
  std::memcpy(out, c->reply.hbm_ipc_handle, 64);
  return Ok();
}

kvtier_status kvtier_hbm_open(kvtier_client* c, void** dev_ptr) {
  if (CheckClient(c) || dev_ptr == nullptr) return Fail(KVTIER_INVALID, "client and dev_ptr are required");
  if (!(c->reply.flags & w::kReplyHasHbm)) return Fail(KVTIER_UNSUPPORTED, "the daemon has no HBM tier");
#if KVTIER_HAVE_CUDA
  std::lock_guard<std::mutex> l(c->mu);
  if (c->hbm_ptr == nullptr) {
    cudaIpcMemHandle_t h;
    static_assert(sizeof h == 64, "cudaIpcMemHandle_t is 64 bytes");
    std::memcpy(&h, c->reply.hbm_ipc_handle, sizeof h);
    const cudaError_t e = cudaIpcOpenMemHandle(&c->hbm_ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      c->hbm_ptr = nullptr;
      return Fail(KVTIER_IO_ERROR, std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(e));
    }
  }
  *dev_ptr = c->hbm_ptr;
  return Ok();
#else
  return Fail(KVTIER_UNSUPPORTED, "libkvtier was built without CUDA");
#endif
}

kvtier_status kvtier_contract_id(const kvtier_contract_desc* d, uint64_t* id) {
  KVTIER_GUARD_BEGIN
  if (id == nullptr) return Fail(KVTIER_INVALID, "id is NULL");
  kvtier::ScaleContract c;
  kvtier::Status s = ToContract(d, &c);
  if (!s.ok()) return FromStatus(s);
  *id = c.Id();
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_contract_block_bytes(const kvtier_contract_desc* d, uint64_t* bytes) {
  KVTIER_GUARD_BEGIN
  if (bytes == nullptr) return Fail(KVTIER_INVALID, "bytes is NULL");
  kvtier::ScaleContract c;
  kvtier::Status s = ToContract(d, &c);
  if (!s.ok()) return FromStatus(s);
  *bytes = c.block_bytes();
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_register_contract(kvtier_client* c, const kvtier_contract_desc* d,
                                       uint64_t* contract_id) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  kvtier::ScaleContract sc;
  kvtier::Status s = ToContract(d, &sc);
  if (!s.ok()) return FromStatus(s);
  const auto bytes = sc.Serialize();
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kRegisterContract);
  req.count = static_cast<uint32_t>(bytes.size());
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  kvtier_status st = Call(c, req, bytes.data(), bytes.size(), nullptr, 0, &cmp);
  if (st != KVTIER_OK) return st;
  if (cmp.value != sc.Id()) return Fail(KVTIER_IO_ERROR, "daemon returned a different contract id");
  if (contract_id) *contract_id = cmp.value;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_key_chain(uint64_t contract_id, const uint32_t* tokens, size_t n_tokens,
                               uint32_t block_tokens, kvtier_key* out, size_t out_cap, size_t* n_keys) {
  KVTIER_GUARD_BEGIN
  if (block_tokens == 0) return Fail(KVTIER_INVALID, "block_tokens must be > 0");
  if (n_tokens > 0 && tokens == nullptr) return Fail(KVTIER_INVALID, "tokens is NULL");
  const size_t n = n_tokens / block_tokens;
  if (n_keys) *n_keys = n;
  if (n > out_cap || (n > 0 && out == nullptr)) {
    return Fail(KVTIER_INVALID, "out has room for " + std::to_string(out_cap) + " keys, " +
                                    std::to_string(n) + " needed");
  }
  const auto keys = kvtier::KeyChain(contract_id, std::span<const uint32_t>(tokens, n_tokens), block_tokens);
  for (size_t i = 0; i < n; ++i) out[i] = kvtier_key{keys[i].hi, keys[i].lo};
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_lookup(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys, size_t n,
                            kvtier_lookup_result* result, uint8_t* tiers_out) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (keys == nullptr || n == 0 || result == nullptr) return Fail(KVTIER_INVALID, "keys, n > 0 and result are required");
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many keys");
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kLookup);
  req.count = static_cast<uint32_t>(n);
  req.contract_id = contract_id;
  std::vector<uint8_t> tiers_buf;
  uint8_t* tout = tiers_out;
  if (tout == nullptr) {
    tiers_buf.resize(n);
    tout = tiers_buf.data();
  }
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  kvtier_status st = Call(c, req, keys, n * sizeof(kvtier_key), tout, n, &cmp);
  if (st != KVTIER_OK) return st;
  result->hit_blocks = cmp.count;
  result->est_seconds_to_hbm = cmp.est_seconds;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_acquire(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys, size_t n,
                             kvtier_tier target, uint64_t* lease, kvtier_slot* slots_out, size_t* n_slots) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (keys == nullptr || n == 0 || lease == nullptr || slots_out == nullptr || n_slots == nullptr) {
    return Fail(KVTIER_INVALID, "keys, n > 0, lease, slots_out and n_slots are required");
  }
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many keys");
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kAcquire);
  req.count = static_cast<uint32_t>(n);
  req.contract_id = contract_id;
  req.tier = static_cast<uint8_t>(target);
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  *lease = 0;
  *n_slots = 0;
  kvtier_status st = Call(c, req, keys, n * sizeof(kvtier_key), slots_out, n * sizeof(kvtier_slot), &cmp);
  if (st != KVTIER_OK) return st;
  *lease = cmp.value;
  *n_slots = cmp.count;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_alloc(kvtier_client* c, uint64_t contract_id, size_t n, kvtier_tier target,
                           uint64_t* lease, kvtier_slot* slots_out) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (n == 0 || lease == nullptr || slots_out == nullptr) return Fail(KVTIER_INVALID, "n > 0, lease and slots_out are required");
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many slots");
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kAlloc);
  req.count = static_cast<uint32_t>(n);
  req.contract_id = contract_id;
  req.tier = static_cast<uint8_t>(target);
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  *lease = 0;
  kvtier_status st = Call(c, req, nullptr, 0, slots_out, n * sizeof(kvtier_slot), &cmp);
  if (st != KVTIER_OK) return st;
  if (cmp.count != n) return Fail(KVTIER_IO_ERROR, "alloc returned a different slot count");
  *lease = cmp.value;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_commit(kvtier_client* c, uint64_t contract_id, uint64_t lease,
                            const kvtier_commit_item* items, size_t n, size_t* n_committed) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (n_committed) *n_committed = 0;
  if (items == nullptr || n == 0) return Fail(KVTIER_INVALID, "items and n > 0 are required");
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many items");
  std::vector<w::CommitItem> wi(n);
  for (size_t i = 0; i < n; ++i) {
    wi[i].slot = items[i].slot.slot;
    wi[i].tier = items[i].slot.tier;
    wi[i].key = w::WireKey{items[i].key.hi, items[i].key.lo};
    wi[i].parent = w::WireKey{items[i].parent.hi, items[i].parent.lo};
  }
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kCommit);
  req.count = static_cast<uint32_t>(n);
  req.contract_id = contract_id;
  req.lease_id = lease;
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  kvtier_status st = Call(c, req, wi.data(), n * sizeof(w::CommitItem), nullptr, 0, &cmp);
  if (n_committed) *n_committed = cmp.count;
  return st;
  KVTIER_GUARD_END
}

kvtier_status kvtier_release(kvtier_client* c, uint64_t lease) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kRelease);
  req.lease_id = lease;
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  return Call(c, req, nullptr, 0, nullptr, 0, &cmp);
  KVTIER_GUARD_END
}

kvtier_status kvtier_prefetch(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys, size_t n,
                              kvtier_tier target) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (keys == nullptr || n == 0 || n > UINT32_MAX) return Fail(KVTIER_INVALID, "keys and n > 0 are required");
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kPrefetch);
  req.count = static_cast<uint32_t>(n);
  req.contract_id = contract_id;
  req.tier = static_cast<uint8_t>(target);
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  return Call(c, req, keys, n * sizeof(kvtier_key), nullptr, 0, &cmp);
  KVTIER_GUARD_END
}

kvtier_status kvtier_stats(kvtier_client* c, kvtier_tier_stats* out, size_t cap, size_t* n) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (out == nullptr || cap == 0 || n == nullptr) return Fail(KVTIER_INVALID, "out, cap > 0 and n are required");
  const uint32_t want = static_cast<uint32_t>(std::min<size_t>(cap, 8));
  std::vector<w::WireTierStats> ws(want);
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kStats);
  req.count = want;
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  kvtier_status st = Call(c, req, nullptr, 0, ws.data(), want * sizeof(w::WireTierStats), &cmp);
  if (st != KVTIER_OK) return st;
  *n = std::min<size_t>(cmp.count, want);
  // The wire record is the C ABI record (formats/wire.h): no conversion.
  std::copy(ws.begin(), ws.begin() + static_cast<std::ptrdiff_t>(*n), out);
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_ping(kvtier_client* c) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kNop);
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  return Call(c, req, nullptr, 0, nullptr, 0, &cmp);
  KVTIER_GUARD_END
}


// ---- operator requests ---------------------------------------------------------------

// Keys go out, and slots and the operator records come back, as the caller's C arrays:
// every field of each must sit where the wire record (formats/wire.h) puts it.
#define KVT_SAME_FIELD(c_rec, w_rec, f)                                                              \
  static_assert(offsetof(c_rec, f) == offsetof(w_rec, f) &&                                          \
                    sizeof(static_cast<c_rec*>(nullptr)->f) == sizeof(static_cast<w_rec*>(nullptr)->f), \
                #c_rec "." #f " differs from the wire");
#define KVT_KEY(f) KVT_SAME_FIELD(kvtier_key, w::WireKey, f)
#define KVT_SLOT(f) KVT_SAME_FIELD(kvtier_slot, w::WireSlot, f)
#define KVT_BLOCK(f) KVT_SAME_FIELD(kvtier_block_info, w::AdminBlockInfo, f)
#define KVT_VERIFY(f) KVT_SAME_FIELD(kvtier_verify_report, w::AdminVerifyReport, f)
#define KVT_CONTRACT(f) KVT_SAME_FIELD(kvtier_contract_info, w::AdminContractInfo, f)
static_assert(sizeof(kvtier_key) == sizeof(w::WireKey) && sizeof(kvtier_slot) == sizeof(w::WireSlot));
static_assert(sizeof(kvtier_block_info) == sizeof(w::AdminBlockInfo));
static_assert(sizeof(kvtier_verify_report) == sizeof(w::AdminVerifyReport));
static_assert(sizeof(kvtier_contract_info) == sizeof(w::AdminContractInfo));
KVT_KEY(hi) KVT_KEY(lo)
KVT_SLOT(tier) KVT_SLOT(from_tier) KVT_SLOT(slot)
KVT_BLOCK(contract_id) KVT_BLOCK(key) KVT_BLOCK(parent) KVT_BLOCK(bytes) KVT_BLOCK(where) KVT_BLOCK(uses)
KVT_BLOCK(hbm_slot) KVT_BLOCK(host_slot) KVT_BLOCK(pins_hbm) KVT_BLOCK(pins_host) KVT_BLOCK(nvme_record)
KVT_BLOCK(nvme_hits) KVT_BLOCK(payload_xxh3) KVT_BLOCK(header_xxh3)
KVT_VERIFY(total) KVT_VERIFY(checked) KVT_VERIFY(ok) KVT_VERIFY(corrupt) KVT_VERIFY(missing) KVT_VERIFY(io_errors)
KVT_CONTRACT(contract_id) KVT_CONTRACT(block_bytes) KVT_CONTRACT(blocks) KVT_CONTRACT(contract_bytes)
#undef KVT_KEY
#undef KVT_SLOT
#undef KVT_BLOCK
#undef KVT_VERIFY
#undef KVT_CONTRACT
#undef KVT_SAME_FIELD

static kvtier_status Admin(kvtier_client* c, const w::AdminRequest& a, void* out, size_t out_cap,
                           w::CompletionEntry* cmp) {
  if (CheckClient(c)) return KVTIER_INVALID;
  kvtier::Status v = w::ValidateAdminRequest(a);
  if (!v.ok()) return Fail(KVTIER_INVALID, v.message());
  if (out_cap > UINT32_MAX) out_cap = UINT32_MAX;
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kAdmin);
  std::lock_guard<std::mutex> l(c->mu);
  return Call(c, req, &a, sizeof a, out, out_cap, cmp);
}

kvtier_status kvtier_list_contracts(kvtier_client* c, uint64_t offset, uint32_t limit, void* out,
                                    size_t out_cap, size_t* out_bytes, uint32_t* n, uint64_t* total) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr || out_bytes == nullptr || n == nullptr || total == nullptr) {
    return Fail(KVTIER_INVALID, "out, out_bytes, n and total are required");
  }
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kListContracts);
  a.offset = offset;
  a.limit = limit;
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, out, out_cap, &cmp);
  if (st != KVTIER_OK) return st;
  *out_bytes = cmp.out_bytes;
  *n = cmp.count;
  *total = cmp.value;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_list_blocks(kvtier_client* c, uint64_t contract_id, kvtier_tier tier, uint64_t offset,
                                 uint32_t limit, kvtier_block_info* out, uint32_t* n, uint64_t* total) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr || n == nullptr || total == nullptr) return Fail(KVTIER_INVALID, "out, n and total are required");
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kListBlocks);
  a.contract_id = contract_id;
  a.tier = static_cast<uint8_t>(tier);
  a.offset = offset;
  a.limit = limit;
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, out, size_t{limit} * sizeof(kvtier_block_info), &cmp);
  if (st != KVTIER_OK) return st;
  *n = std::min<uint32_t>(cmp.count, limit);
  *total = cmp.value;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_inspect(kvtier_client* c, uint64_t contract_id, kvtier_key key, kvtier_block_info* out) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr) return Fail(KVTIER_INVALID, "out is required");
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kInspect);
  a.contract_id = contract_id;
  a.key = {key.hi, key.lo};
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, out, sizeof *out, &cmp);
  if (st != KVTIER_OK) return st;
  if (cmp.count != 1) return Fail(KVTIER_IO_ERROR, "inspect reply holds no block");
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_verify_nvme(kvtier_client* c, uint64_t offset, uint32_t limit, kvtier_verify_report* out) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr) return Fail(KVTIER_INVALID, "out is required");
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kVerifyNvme);
  a.offset = offset;
  a.limit = limit;
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, out, sizeof *out, &cmp);
  if (st != KVTIER_OK) return st;
  if (cmp.count != 1) return Fail(KVTIER_IO_ERROR, "verify reply holds no report");
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_evict(kvtier_client* c, uint64_t contract_id, kvtier_key key) {
  KVTIER_GUARD_BEGIN
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kEvictKey);
  a.contract_id = contract_id;
  a.key = {key.hi, key.lo};
  w::CompletionEntry cmp;
  return Admin(c, a, nullptr, 0, &cmp);
  KVTIER_GUARD_END
}

kvtier_status kvtier_evict_contract(kvtier_client* c, uint64_t contract_id, uint64_t* evicted, uint64_t* skipped) {
  KVTIER_GUARD_BEGIN
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kEvictContract);
  a.contract_id = contract_id;
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, nullptr, 0, &cmp);
  if (st != KVTIER_OK) return st;
  if (evicted) *evicted = cmp.value;
  if (skipped) *skipped = cmp.count;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_flush(kvtier_client* c) { return kvtier_flush_to(c, KVTIER_TIER_NVME); }

kvtier_status kvtier_flush_to(kvtier_client* c, kvtier_tier to) {
  KVTIER_GUARD_BEGIN
  if (to != KVTIER_TIER_HOST && to != KVTIER_TIER_NVME) {
    return Fail(KVTIER_INVALID, "kvtier_flush_to: target must be KVTIER_TIER_HOST or KVTIER_TIER_NVME");
  }
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kFlush);
  a.tier = static_cast<uint8_t>(to);
  w::CompletionEntry cmp;
  return Admin(c, a, nullptr, 0, &cmp);
  KVTIER_GUARD_END
}

kvtier_status kvtier_reload_config(kvtier_client* c, char* msg, size_t msg_cap) {
  KVTIER_GUARD_BEGIN
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kReloadConfig);
  std::vector<char> buf(1024);
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, buf.data(), buf.size(), &cmp);
  if (st != KVTIER_OK) return st;
  if (msg != nullptr && msg_cap > 0) {
    const size_t n = std::min<size_t>(cmp.out_bytes, msg_cap - 1);
    std::memcpy(msg, buf.data(), n);
    msg[n] = '\0';
  }
  return Ok();
  KVTIER_GUARD_END
}

}  // extern "C"
