// libkvtier's asynchronous acquire: kvtier_acquire_async pushes one Op::kAcquireAsync
// request whose input and output live in the upper half of the ring's data area, and
// returns. The daemon writes the slots of the leading blocks as they become ready and
// then AcquireProgress.ready (formats/wire.h); kvtier_acquire_async_ready reads it. The
// completion is taken off the completion ring by whichever of the client's threads
// reads that ring first: a synchronous call waiting for its own completion, or the op's
// watcher thread, which polls it while no call holds the client. Either one copies the
// slots out, signals the op's eventfd and hands the data area back.
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>

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

// Marks op finished and wakes whoever waits on it. Caller holds op->mu.
void MarkFinished(kvtier_acquire_op* op) {
  op->finished = true;
  const uint64_t one = 1;
  if (op->efd >= 0) (void)!::write(op->efd, &one, sizeof one);
  op->cv.notify_all();
}

void Watch(kvtier_acquire_op* op) {
  kvtier_client* c = op->c;
  const auto deadline = Clock::now() + std::chrono::milliseconds(op->deadline_ms.load());
  while (true) {
    {
      std::lock_guard<std::mutex> l(c->mu);
      if (c->async != op) return;  // finished (by a call on the client, or abandoned)
      uint32_t n = 0;
      while (c->async == op && c->cmp.Available(&n) && n > 0) {
        w::CompletionEntry e;
        c->cmp.Pop(&e);
        if (e.tag == op->tag) FinishAsync(c, e);  // otherwise a stale completion; skip it
      }
      if (c->async != op) return;
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
    }
    // Polling, not a futex sleep: a synchronous call may sleep on the ring meanwhile.
    std::this_thread::sleep_for(std::chrono::microseconds(100));
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

uint64_t SyncDataBytes(const kvtier_client* c) { return c->async ? AsyncBase(c) : c->hdr.data_bytes; }

void FinishAsync(kvtier_client* c, const w::CompletionEntry& cmp) {
  kvtier_acquire_op* op = c->async;
  if (op == nullptr) return;
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
  c->async = nullptr;
  MarkFinished(op);
}

void AbandonAsync(kvtier_client* c, kvtier_status s, const std::string& why) {
  kvtier_acquire_op* op = c->async;
  if (op == nullptr) return;
  std::lock_guard<std::mutex> l(op->mu);
  op->status = s;
  op->error = why;
  op->slots.clear();
  op->ready = 0;
  c->async = nullptr;
  MarkFinished(op);
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
  // Each watcher now sees that its op is not c->async and returns.
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
  if (c->async != nullptr) {
    return refuse(KVTIER_REJECTED,
                  "an asynchronous acquire is already in flight on this client (one at a time): wait for it "
                  "(kvtier_acquire_async_wait) or free it first");
  }
  if (c->transport != KVTIER_TRANSPORT_RING) {
    return refuse(KVTIER_UNSUPPORTED, "asynchronous acquire needs the ring transport");
  }
  if (c->reply.protocol_version < 4) {
    return refuse(KVTIER_UNSUPPORTED, "kvtierd speaks protocol " + std::to_string(c->reply.protocol_version) +
                                          ", asynchronous acquire needs 4");
  }
  const uint64_t base = AsyncBase(c);
  const uint64_t in_len = AsyncInBytes(n);
  const uint64_t out_off = base + (in_len + 7) / 8 * 8;
  const uint64_t out_len = AsyncOutBytes(n);
  if (out_off + out_len > c->hdr.data_bytes) {
    return refuse(KVTIER_INVALID, "asynchronous acquire of " + std::to_string(n) + " keys needs " +
                                      std::to_string(out_off + out_len - base) +
                                      " bytes of the ring data area's upper half, which has " +
                                      std::to_string(c->hdr.data_bytes - base) + " (split it)");
  }
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
  op->off = out_off;
  op->deadline_ms = c->timeout_ms;
  c->async = op.get();
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
