// libkvtier's asynchronous acquire: kvtier_acquire_async pushes one Op::kAcquireAsync
// request whose input and output live in a region of the upper half of the ring's data
// area, and returns; several may be in flight at once, each in its own region (first
// fit), up to what the upper half holds and the daemon allows
// (daemon.max_async_acquires_per_client). The daemon writes the slots of the leading
// blocks as they become ready, then AcquireProgress.ready, then bumps and wakes
// AcquireProgress.events (formats/wire.h); kvtier_acquire_async_ready reads them. Each op
// has a watcher thread that sleeps on `events` (a shared futex, no polling), writes the
// op's eventfd once per ready step, and takes completions off the completion ring while
// no call holds the client. A completion is taken by whichever of the client's threads
// reads the ring first (a synchronous call waiting for its own, or a watcher); either one
// finds the op by its tag, copies the slots out, signals the op's eventfd and hands the
// region back.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "client/client_internal.h"
#include "formats/ring_wait.h"

namespace kvtier::lib {

namespace w = kvtier::wire;

namespace {

using Clock = std::chrono::steady_clock;

// Where the asynchronous acquire's request starts: the upper half, 8-byte aligned.
uint64_t AsyncBase(const kvtier_client* c) { return c->hdr.data_bytes / 2 / 8 * 8; }

// Bytes the request of n keys needs from AsyncBase on: its input, then its output (the
// progress header, n slots, and room for an error message after the header).
uint64_t AsyncInBytes(uint64_t n) { return sizeof(w::AcquireAsyncHeader) + n * sizeof(w::WireKey); }
uint64_t AsyncOutBytes(uint64_t n) {
  return sizeof(w::AcquireProgress) + std::max<uint64_t>(n * sizeof(w::WireSlot), 256);
}

// First fit of `len` bytes (8-byte aligned) in the upper half among the regions of the
// acquires in flight. Caller holds c->mu.
bool FindRegion(const kvtier_client* c, uint64_t len, uint64_t* off) {
  std::vector<std::pair<uint64_t, uint64_t>> used;
  for (const kvtier_acquire_op* op : c->async) used.emplace_back(op->region, op->region + op->region_len);
  std::sort(used.begin(), used.end());
  uint64_t at = AsyncBase(c);
  for (const auto& [b, e] : used) {
    if (at + len <= b) break;
    at = std::max(at, (e + 7) / 8 * 8);
  }
  if (at + len > c->hdr.data_bytes) return false;
  *off = at;
  return true;
}

bool InFlight(const kvtier_client* c, const kvtier_acquire_op* op) {
  return std::find(c->async.begin(), c->async.end(), op) != c->async.end();
}

void Signal(kvtier_acquire_op* op) {
  const uint64_t one = 1;
  if (op->efd >= 0) (void)!::write(op->efd, &one, sizeof one);
}

// Marks op finished and wakes whoever waits on it. Caller holds op->mu.
void MarkFinished(kvtier_acquire_op* op) {
  op->finished = true;
  Signal(op);
  op->cv.notify_all();
}

void Watch(kvtier_acquire_op* op) {
  kvtier_client* c = op->c;
  const auto deadline = Clock::now() + std::chrono::milliseconds(op->deadline_ms.load());
  while (true) {
    uint32_t events = 0;
    bool done = false;
    // The op's out region, mapped while the op is in flight: a close or reconnect ends
    // the op under c->mu before it unmaps (a futex sleep on an unmapped word returns).
    w::AcquireProgress* p = nullptr;
    {
      std::lock_guard<std::mutex> l(c->mu);
      if (!InFlight(c, op)) return;  // finished (by a call on the client, or abandoned)
      p = reinterpret_cast<w::AcquireProgress*>(c->data + op->off);
      uint32_t n = 0;
      while (InFlight(c, op) && c->cmp.Available(&n) && n > 0) {
        w::CompletionEntry e;
        c->cmp.Pop(&e);
        (void)FinishAsync(c, e);  // this op's, another's, or a stale completion (skipped)
      }
      if (!InFlight(c, op)) return;
      uint32_t m = 0;
      if (!c->cmp.Available(&m)) {
        c->broken = true;
        c->broken_reason = "completion ring indices are corrupt";
        AbandonAsync(c, KVTIER_IO_ERROR, c->broken_reason);
        return;
      }
      if (Clock::now() > deadline) {
        c->broken = true;
        c->broken_reason = "no completion of the asynchronous acquire within " + std::to_string(c->timeout_ms) +
                           " ms: the connection is given up (kvtierd may be hung); kvtier_reconnect attaches "
                           "again, its leases are gone";
        AbandonAsync(c, KVTIER_TIMEOUT, c->broken_reason);
        return;
      }
      events = std::atomic_ref<uint32_t>(p->events).load(std::memory_order_acquire);
      const uint32_t ready = std::min(std::atomic_ref<uint32_t>(p->ready).load(std::memory_order_acquire), op->n);
      done = std::atomic_ref<uint32_t>(p->done).load(std::memory_order_acquire) != 0;
      if (ready > op->signalled) {  // a ready step: the engine's event loop hears of it
        op->signalled = ready;
        Signal(op);
      }
    }
    if (done) {
      // The completion follows `done` at once; a synchronous call may be sleeping on the
      // completion ring meanwhile, so this thread does not sleep there too.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    } else {
      // Until the daemon bumps `events` (a ready step or the end); bounded, for the
      // deadline and for a daemon that never bumps it.
      w::FutexWait(&p->events, events, 1'000'000L);
    }
  }
}

kvtier_status CheckOp(const kvtier_acquire_op* op) {
  if (op == nullptr) return Fail(KVTIER_INVALID, "acquire handle is NULL");
  if (op->fork_generation != ForkGeneration()) {
    return Fail(KVTIER_INVALID, "kvtier acquire handle used after fork: connect again in the child");
  }
  return KVTIER_OK;
}

// In a forked child the watcher thread does not exist (and a lock it held stays held):
// the handle's thread object is left alone, never joined, and the handle never freed.
void ForsakeInChild(kvtier_acquire_op* op) {
  if (op->watcher.joinable()) new std::thread(std::move(op->watcher));  // never destroyed
  op->c = nullptr;
}

}  // namespace

uint64_t SyncDataBytes(const kvtier_client* c) { return c->async.empty() ? c->hdr.data_bytes : AsyncBase(c); }

bool FinishAsync(kvtier_client* c, const w::CompletionEntry& cmp) {
  auto it = std::find_if(c->async.begin(), c->async.end(), [&](const kvtier_acquire_op* o) { return o->tag == cmp.tag; });
  if (it == c->async.end()) return false;
  kvtier_acquire_op* op = *it;
  const uint8_t* out = c->data + op->off;
  std::lock_guard<std::mutex> l(op->mu);
  if (cmp.status != 0) {
    const size_t room = AsyncOutBytes(op->n) - sizeof(w::AcquireProgress);
    const std::string msg(reinterpret_cast<const char*>(out + sizeof(w::AcquireProgress)),
                          std::min<size_t>(cmp.msg_len, room));
    const int code = cmp.status;
    op->status = (code >= 1 && code <= 7) ? static_cast<kvtier_status>(code) : KVTIER_IO_ERROR;
    op->error = std::string("kvtierd: acquire_async: ") +
                kvtier::StatusCodeName(static_cast<kvtier::StatusCode>(code)) + ": " + msg;
    op->slots.clear();
    op->ready = 0;
  } else if (cmp.count > op->n || (cmp.count > 0 && cmp.value == 0)) {
    op->status = KVTIER_IO_ERROR;
    op->error = "acquire_async completion claims " + std::to_string(cmp.count) + " slots of " + std::to_string(op->n);
  } else {
    op->status = KVTIER_OK;
    op->lease = cmp.value;
    op->slots.resize(cmp.count);
    if (cmp.count) std::memcpy(op->slots.data(), out + sizeof(w::AcquireProgress), cmp.count * sizeof(kvtier_slot));
    op->ready = cmp.count;
  }
  c->async.erase(it);
  MarkFinished(op);
  return true;
}

void AbandonAsync(kvtier_client* c, kvtier_status s, const std::string& why) {
  for (kvtier_acquire_op* op : std::exchange(c->async, {})) {
    std::lock_guard<std::mutex> l(op->mu);
    op->status = s;
    op->error = why;
    op->slots.clear();
    op->ready = 0;
    MarkFinished(op);
  }
}

void ReleaseAsyncAtClose(kvtier_client* c) {
  if (c->fork_generation != ForkGeneration()) {
    for (kvtier_acquire_op* op : c->ops) ForsakeInChild(op);
    c->ops.clear();
    return;
  }
  std::vector<kvtier_acquire_op*> ops;
  {
    std::lock_guard<std::mutex> l(c->mu);
    AbandonAsync(c, KVTIER_DISCONNECTED, "the client was closed while the acquire was in flight");
    ops.swap(c->ops);
  }
  // Each watcher now sees that its op is not in c->async and returns.
  for (kvtier_acquire_op* op : ops) {
    if (op->watcher.joinable()) op->watcher.join();
    std::lock_guard<std::mutex> l(op->mu);
    op->c = nullptr;
  }
}

}  // namespace kvtier::lib

using namespace kvtier::lib;  // NOLINT

extern "C" {

kvtier_status kvtier_acquire_async(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys, size_t n,
                                   kvtier_tier target, uint32_t chunk_blocks, kvtier_acquire_op** out) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr) return Fail(KVTIER_INVALID, "out is required");
  *out = nullptr;
  if (c == nullptr) return Fail(KVTIER_INVALID, "client is NULL");
  if (c->fork_generation != ForkGeneration()) {
    return Fail(KVTIER_INVALID, "kvtier client used after fork: connect again in the child");
  }
  if (n > 0 && keys == nullptr) return Fail(KVTIER_INVALID, "keys is required");
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many keys");
  auto op = std::make_unique<kvtier_acquire_op>();
  op->efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (op->efd < 0) return Fail(KVTIER_IO_ERROR, std::string("eventfd: ") + std::strerror(errno));
  op->n = static_cast<uint32_t>(n);
  op->c = c;
  op->fork_generation = c->fork_generation;
  std::lock_guard<std::mutex> l(c->mu);
  if (n == 0) {  // 0 hits, finished at once, as kvtier_acquire answers
    std::lock_guard<std::mutex> ol(op->mu);
    MarkFinished(op.get());
    c->ops.push_back(op.get());
    *out = op.release();
    return Ok();
  }
  if (c->broken && c->auto_reconnect) {
    const kvtier_status rs = Reconnect(c);
    if (rs != KVTIER_OK) {
      ::close(op->efd);
      return rs;
    }
  }
  auto refuse = [&](kvtier_status s, std::string why) {
    ::close(op->efd);
    return Fail(s, std::move(why));
  };
  if (c->broken) {
    return refuse(KVTIER_DISCONNECTED,
                  "connection to kvtierd is closed (" + c->broken_reason + "): kvtier_reconnect attaches again");
  }
  if (c->transport != KVTIER_TRANSPORT_RING) {
    return refuse(KVTIER_UNSUPPORTED, "asynchronous acquire needs the ring transport");
  }
  if (c->reply.protocol_version < 4) {
    return refuse(KVTIER_UNSUPPORTED, "kvtierd speaks protocol " + std::to_string(c->reply.protocol_version) +
                                          ", asynchronous acquire needs 4");
  }
  const uint64_t in_len = AsyncInBytes(n);
  const uint64_t out_len = AsyncOutBytes(n);
  const uint64_t region_len = (in_len + 7) / 8 * 8 + out_len;
  const uint64_t half = c->hdr.data_bytes - AsyncBase(c);
  if (region_len > half) {
    return refuse(KVTIER_INVALID, "asynchronous acquire of " + std::to_string(n) + " keys needs " +
                                      std::to_string(region_len) +
                                      " bytes of the ring data area's upper half, which has " +
                                      std::to_string(half) + " (split it)");
  }
  uint64_t base = 0;
  if (!FindRegion(c, region_len, &base)) {
    return refuse(KVTIER_REJECTED, std::to_string(c->async.size()) +
                                       " asynchronous acquires in flight hold the ring data area's upper half: "
                                       "wait for one (kvtier_acquire_async_wait) or ask for fewer keys");
  }
  const uint64_t out_off = base + (in_len + 7) / 8 * 8;
  w::AcquireAsyncHeader h;
  h.chunk_blocks = chunk_blocks;
  std::memcpy(c->data + base, &h, sizeof h);
  std::memcpy(c->data + base + sizeof h, keys, n * sizeof(kvtier_key));
  std::memset(c->data + out_off, 0, sizeof(w::AcquireProgress));
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kAcquireAsync);
  req.count = static_cast<uint32_t>(n);
  req.contract_id = contract_id;
  req.tier = static_cast<uint8_t>(target);
  req.tag = c->next_tag++;
  req.in_off = static_cast<uint32_t>(base);
  req.in_len = static_cast<uint32_t>(in_len);
  req.out_off = static_cast<uint32_t>(out_off);
  req.out_len = static_cast<uint32_t>(out_len);
  std::atomic_thread_fence(std::memory_order_release);
  if (!c->req.TryPush(req)) {
    return refuse(KVTIER_RETRY, "request ring is full: try again");
  }
  kvtier::wire::WakeConsumer(c->req);
  op->tag = req.tag;
  op->region = base;
  op->region_len = region_len;
  op->off = out_off;
  op->deadline_ms = c->timeout_ms;
  c->async.push_back(op.get());
  c->ops.push_back(op.get());
  op->watcher = std::thread(Watch, op.get());
  *out = op.release();
  return Ok();
  KVTIER_GUARD_END
}

int kvtier_acquire_async_fd(const kvtier_acquire_op* op) { return op ? op->efd : -1; }

kvtier_status kvtier_acquire_async_ready(kvtier_acquire_op* op, kvtier_slot* slots_out, size_t cap,
                                         size_t* ready) {
  KVTIER_GUARD_BEGIN
  if (CheckOp(op)) return KVTIER_INVALID;
  if (ready == nullptr) return Fail(KVTIER_INVALID, "ready is required");
  if (cap > 0 && slots_out == nullptr) return Fail(KVTIER_INVALID, "slots_out is required when cap > 0");
  std::lock_guard<std::mutex> l(op->mu);
  if (!op->finished && op->c != nullptr) {
    // In flight: the out region is ours until FinishAsync (which takes op->mu) runs.
    const uint8_t* out = op->c->data + op->off;
    auto* p = const_cast<w::AcquireProgress*>(reinterpret_cast<const w::AcquireProgress*>(out));
    const uint32_t now = std::min(std::atomic_ref<uint32_t>(p->ready).load(std::memory_order_acquire), op->n);
    if (now > op->ready) {
      op->slots.resize(now);
      std::memcpy(op->slots.data() + op->ready, out + sizeof(w::AcquireProgress) + op->ready * sizeof(kvtier_slot),
                  (now - op->ready) * sizeof(kvtier_slot));
      op->ready = now;
    }
  }
  *ready = op->ready;
  const size_t k = std::min(cap, op->ready);
  if (k) std::memcpy(slots_out, op->slots.data(), k * sizeof(kvtier_slot));
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_acquire_async_wait(kvtier_acquire_op* op, int timeout_ms) {
  KVTIER_GUARD_BEGIN
  if (CheckOp(op)) return KVTIER_INVALID;
  std::unique_lock<std::mutex> l(op->mu);
  if (timeout_ms < 0) {
    op->cv.wait(l, [&] { return op->finished; });
  } else if (!op->cv.wait_for(l, std::chrono::milliseconds(timeout_ms), [&] { return op->finished; })) {
    return Fail(KVTIER_RETRY, "the acquire is still in flight after " + std::to_string(timeout_ms) + " ms");
  }
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_acquire_async_result(kvtier_acquire_op* op, uint64_t* lease, kvtier_slot* slots_out,
                                          size_t* n_slots) {
  KVTIER_GUARD_BEGIN
  if (CheckOp(op)) return KVTIER_INVALID;
  if (lease == nullptr || n_slots == nullptr) return Fail(KVTIER_INVALID, "lease and n_slots are required");
  if (op->n > 0 && slots_out == nullptr) return Fail(KVTIER_INVALID, "slots_out is required");
  std::unique_lock<std::mutex> l(op->mu);
  op->cv.wait(l, [&] { return op->finished; });
  *lease = 0;
  *n_slots = 0;
  if (op->status != KVTIER_OK) return Fail(op->status, op->error);
  if (op->taken) return Fail(KVTIER_INVALID, "the result of this acquire was already taken");
  op->taken = true;
  *lease = op->lease;
  *n_slots = op->slots.size();
  if (!op->slots.empty()) std::memcpy(slots_out, op->slots.data(), op->slots.size() * sizeof(kvtier_slot));
  return Ok();
  KVTIER_GUARD_END
}

void kvtier_acquire_async_free(kvtier_acquire_op* op) {
  if (op == nullptr) return;
  if (op->fork_generation != ForkGeneration()) {  // the parent's handle: close the child's fd only
    ForsakeInChild(op);
    if (op->efd >= 0) ::close(op->efd);
    op->efd = -1;
    return;
  }
  kvtier_client* c = nullptr;
  {
    std::unique_lock<std::mutex> l(op->mu);
    // The daemon cannot take an acquire back: wait for it, then release what it leased.
    op->cv.wait(l, [&] { return op->finished; });
    c = op->c;
  }
  if (op->watcher.joinable()) op->watcher.join();
  if (c != nullptr) {
    if (op->status == KVTIER_OK && !op->taken && op->lease != 0 && c->fork_generation == ForkGeneration()) {
      (void)kvtier_release(c, op->lease);
    }
    std::lock_guard<std::mutex> l(c->mu);
    c->ops.erase(std::remove(c->ops.begin(), c->ops.end(), op), c->ops.end());
  }
  if (op->efd >= 0) ::close(op->efd);
  delete op;
}

}  // extern "C"
