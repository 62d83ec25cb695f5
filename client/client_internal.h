// libkvtier internals shared by its three parts: attach.cc (the handshake that maps the
// ring region and the host arena), transport.cc (one request/completion exchange over the
// rings or the socket) and client.cc (the C ABI of client/include/kvtier/kvtier.h).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/status.h"
#include "formats/wire.h"
#include "kvtier/kvtier.h"

// A contract this client registered: what the token-level calls need (block_tokens) and
// the canonical bytes to register it again.
struct RegisteredContract {
  uint32_t block_tokens = 0;
  uint64_t block_bytes = 0;
  std::vector<uint8_t> bytes;
  bool shared = false;  // registered in the shared namespace (the id is its shared handle)
  uint64_t host_slot_bytes = 0;  // its host slot class's slot size (kvtier_contract_slot)
  uint64_t hbm_slot_bytes = 0;   // its HBM slot class's (0: no HBM tier, or unknown)
  double fill = 0.0;             // block_bytes / host_slot_bytes
};

// One asynchronous acquire (async.cc). Its request and reply use a region of the upper
// half of the ring's data area, [region, region + region_len), its out part from `off`
// on; `ready` is read there while the acquire is in flight. Several may be in flight,
// each in its own region. `mu` guards the fields below it; a client's mu is taken before
// an op's, never after.
struct kvtier_acquire_op {
  kvtier_client* c = nullptr;   // NULL once kvtier_close let go of it
  uint64_t tag = 0;
  uint32_t n = 0;               // keys asked for
  uint64_t region = 0;          // the request's region in the data area (while in flight)
  uint64_t region_len = 0;
  uint64_t off = 0;             // the out region's offset in the data area
  uint32_t signalled = 0;       // ready blocks the eventfd was written for (the watcher's; c->mu)
  int efd = -1;                 // eventfd: written once per ready step and once when finished
  uint64_t fork_generation = 0;  // ForkGeneration() when it was made: a forked child differs
  std::atomic<uint32_t> deadline_ms{0};
  std::thread watcher;          // moves the completion off the ring when nobody else does
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;
  bool taken = false;           // kvtier_acquire_async_result handed the lease over
  kvtier_status status = KVTIER_OK;
  std::string error;
  uint64_t lease = 0;
  std::vector<kvtier_slot> slots;  // the final slots (finished) or the ready ones copied so far
  size_t ready = 0;
};

// One attached client. `mu` serialises requests (one in flight per client) and guards
// every field below it; the fields above it are set by the attach and read-only after.
struct kvtier_client {
  int sock = -1;                 // the control socket (stays open for the client's life)
  uint8_t* ring = nullptr;       // mapped ring region
  uint64_t ring_bytes = 0;
  kvtier::wire::RingRegionHeader hdr;
  kvtier::wire::RingView<kvtier::wire::RequestEntry> req;
  kvtier::wire::RingView<kvtier::wire::CompletionEntry> cmp;
  uint8_t* data = nullptr;       // the ring region's data area
  // The host window (NULL without a host tier): the arena (host_arena_bytes, read-only)
  // and right after it this client's staging area (writable); host_bytes in all.
  uint8_t* host = nullptr;
  uint64_t host_bytes = 0;
  uint64_t host_arena_bytes = 0;
  int host_fd = -1;              // the host arena's memfd (kvtier_host_arena_fd)
  int staging_fd = -1;           // the staging area's memfd (kvtier_host_staging_fd)
  bool host_private = false;     // the arena's part of the window is unmapped (kReplyHostPrivate)
  // ... but for these parts (kReplyHostParts, protocol 6): its tenant's, read-only.
  kvtier::wire::HostPartTable host_parts;
  int part_fds[kvtier::wire::kMaxWireHostParts] = {-1, -1};  // their memfds (kvtier_host_parts)
  uint64_t fork_generation = 0;  // ForkGeneration() at connect: a forked child differs
  kvtier::wire::AttachReply reply;
  // The host tier's granule and slot classes (protocol 5: sent after the reply; older
  // daemons: one class of reply.slot_bytes, granule slot_bytes). HostSlot() reads it.
  kvtier::wire::SlotClassTable host_classes;
  // The HBM tier's (protocol 7; older daemons: one class, granule slot_bytes, arena_bytes
  // 0 = unknown; no HBM tier: all 0).
  kvtier::wire::HbmGeometry hbm;
  std::mutex mu;
  std::string socket_path;       // what kvtier_reconnect attaches to again
  std::string name;
  bool has_gpu = false;
  bool auto_reconnect = false;   // kvtier_set_auto_reconnect
  uint64_t attaches = 0;         // successful attaches (kvtier_attach_generation)
  uint64_t next_tag = 1;
  std::unordered_map<uint64_t, RegisteredContract> contracts;  // by contract id
  bool broken = false;           // the connection is given up; every call fails at once
  std::string broken_reason;     // why, in one line (the daemon's reason when it gave one)
  kvtier_transport transport = KVTIER_TRANSPORT_RING;
  uint32_t timeout_ms = 60000;
  uint32_t spin_us = 50;
  void* hbm_ptr = nullptr;
  std::vector<kvtier_acquire_op*> async;  // the asynchronous acquires in flight
  std::vector<kvtier_acquire_op*> ops;  // every handle not yet freed (kvtier_close lets go of them)
};

namespace kvtier::lib {

// Where host slot s is in the client's window (arena, then staging area): s * granule,
// the one place that says so. False for a slot whose smallest class would pass the end of
// the window (classes made per contract: the granule is the smallest slot), and for an
// arena slot where the arena is not mapped (a daemon with tenants; but for the parts of it
// this client mapped).
inline bool HostSlot(const kvtier_client* c, uint32_t s, uint64_t* offset) {
  const uint64_t g = c->host_classes.granule;
  if (g == 0 || c->host == nullptr) return false;
  const uint64_t least = c->host_classes.count > 0 ? c->host_classes.class_bytes[0] : g;
  const uint64_t off = uint64_t{s} * g;
  if (off >= c->host_bytes || least > c->host_bytes - off) return false;
  if (c->host_private && off < c->host_arena_bytes) {
    // An arena slot: readable only inside a part this client mapped.
    bool in = false;
    for (uint32_t i = 0; i < c->host_parts.count && !in; ++i) {
      const auto& p = c->host_parts.parts[i];
      in = off >= p.offset && off - p.offset < p.bytes && least <= p.offset + p.bytes - off;
    }
    if (!in) return false;
  }
  *offset = off;
  return true;
}

// Sets the calling thread's kvtier_last_error() and returns s.
kvtier_status Fail(kvtier_status s, std::string msg);
kvtier_status Ok();
kvtier_status FromStatus(const Status& s);

// attach.cc: connects to socket_path, attaches and maps what the reply passes. On
// failure everything it opened is closed again and `c` is as it was.
kvtier_status Attach(const char* socket_path, const kvtier_connect_options* opts, kvtier_client* c);
// Unmaps and closes what Attach opened (the daemon then releases the client's leases).
void Detach(kvtier_client* c);
// How many forks this process descends from since libkvtier first asked (a
// pthread_atfork child handler counts them): a client made before a fork is the
// parent's, and a call from the child fails at once instead of sharing its ring.
uint64_t ForkGeneration();

// transport.cc: whole-buffer socket I/O (false when the peer is gone), and one request/completion exchange on c's current transport. `in` goes to
// the daemon; up to out_cap bytes of its output land in `out`. Caller holds c->mu.
bool WriteAll(int fd, const void* p, size_t n);
bool ReadAll(int fd, void* p, size_t n);
kvtier_status Call(kvtier_client* c, wire::RequestEntry req, const void* in, size_t in_len, void* out,
                   size_t out_cap, wire::CompletionEntry* done);

// The data area a synchronous request may use: all of it, or the lower half while
// asynchronous acquires hold regions of the upper one. Caller holds c->mu.
uint64_t SyncDataBytes(const kvtier_client* c);
// Ends the asynchronous acquire in flight whose tag is cmp.tag with `cmp` from the
// completion ring; false when none has it (a stale completion). Caller holds c->mu; the
// op's out region is read before it leaves c->async.
bool FinishAsync(kvtier_client* c, const wire::CompletionEntry& cmp);
// Ends every asynchronous acquire in flight with status s and text why, without a
// completion (the connection is given up or closed). Caller holds c->mu.
void AbandonAsync(kvtier_client* c, kvtier_status s, const std::string& why);

// kvtier_close's part: ends the acquire in flight, stops its watcher and lets go of it
// (the handle stays valid until kvtier_acquire_async_free). Caller does not hold c->mu.
void ReleaseAsyncAtClose(kvtier_client* c);

// client.cc: attaches c again (a new socket, ring and arena mapping) and registers the
// contracts c registered before. Caller holds c->mu. On failure c stays given up.
kvtier_status Reconnect(kvtier_client* c);

}  // namespace kvtier::lib

#define KVTIER_GUARD_BEGIN try {
#define KVTIER_GUARD_END                                                      \
  }                                                                          \
  catch (const std::bad_alloc&) {                                            \
    return ::kvtier::lib::Fail(KVTIER_REJECTED, "out of memory");            \
  }                                                                          \
  catch (...) {                                                              \
    return ::kvtier::lib::Fail(KVTIER_INVALID, "internal error (exception)"); \
  }
