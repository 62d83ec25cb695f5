// kvtier_acquire_async against a real kvtierd, with the blocks on NVMe only (stored,
// flushed, daemon restarted): readiness only grows and its slots are the final ones,
// the result is the blocking acquire's (slots and bytes), the eventfd turns readable per
// ready step and at the end, several asynchronous acquires are in flight at once up to the
// daemon's limit, and freeing or closing while one is in flight is safe and leaves no pin
// behind.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier.hpp"
#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

std::string LastError() { return kvtier_last_error(); }

// An environment variable for the object's lifetime (a daemon started meanwhile inherits it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

constexpr size_t kBlocks = 48;
constexpr size_t kBlockBytes = 576;  // SmallContract(): 2 layers x 288 bytes

kvtier_client* Connect(const std::string& socket) {
  kvtier_connect_options o{};
  o.name = "async";
  kvtier_client* c = nullptr;
  if (kvtier_connect(socket.c_str(), &o, &c) != KVTIER_OK) return nullptr;
  return c;
}

struct Stored {
  uint64_t cid = 0;
  std::vector<kvtier_key> keys;
};

// Stores kBlocks blocks (block i filled with i + 1), flushes them to NVMe and restarts
// the daemon, so that every block is on NVMe only.
void StoreOnNvme(DaemonProcess& d, Stored* out) {
  kvtier_client* c = Connect(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  const auto desc = SmallContract();
  ASSERT_EQ(kvtier_register_contract(c, &desc, &out->cid), KVTIER_OK) << LastError();
  std::vector<uint32_t> tokens(16 * kBlocks);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7 + 3);
  std::vector<std::vector<uint8_t>> bytes(kBlocks);
  std::vector<const void*> blocks(kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) {
    bytes[i].assign(kBlockBytes, static_cast<uint8_t>(i + 1));
    blocks[i] = bytes[i].data();
  }
  size_t stored = 0;
  ASSERT_EQ(kvtier_store_tokens(c, out->cid, tokens.data(), tokens.size(), blocks.data(), &stored), KVTIER_OK)
      << LastError();
  ASSERT_EQ(stored, kBlocks);
  ASSERT_EQ(kvtier_flush(c), KVTIER_OK) << LastError();
  out->keys.resize(kBlocks);
  size_t n = 0;
  ASSERT_EQ(kvtier_key_chain(out->cid, tokens.data(), tokens.size(), 16, out->keys.data(), kBlocks, &n), KVTIER_OK);
  ASSERT_EQ(n, kBlocks);
  kvtier_close(c);
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start()) << d.log();
}

bool FdReadable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

TEST(ClientAsync, ReadinessGrowsAndResultEqualsBlockingAcquire) {
  DaemonConfig cfg;
  // Two acquires of all 48 blocks in flight at once hold them twice: past the default share.
  cfg.daemon_extra = "max_tier_share_per_client = 1.0\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  Stored st;
  ASSERT_NO_FATAL_FAILURE(StoreOnNvme(d, &st));
  kvtier_client* c = Connect(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  kvtier_acquire_op* op = nullptr;
  ASSERT_EQ(kvtier_acquire_async(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, 4, &op), KVTIER_OK)
      << LastError();
  ASSERT_NE(op, nullptr);
  const int fd = kvtier_acquire_async_fd(op);
  ASSERT_GE(fd, 0);
  // A second one while the first is in flight: accepted, in its own region.
  kvtier_acquire_op* second = nullptr;
  ASSERT_EQ(kvtier_acquire_async(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, 4, &second), KVTIER_OK)
      << LastError();
  // Synchronous calls go on while it is in flight.
  EXPECT_EQ(kvtier_ping(c), KVTIER_OK) << LastError();
  std::vector<size_t> seen;
  std::vector<kvtier_slot> early(kBlocks);
  std::vector<std::vector<kvtier_slot>> snapshots;
  bool finished = false;
  while (true) {
    size_t ready = 0;
    ASSERT_EQ(kvtier_acquire_async_ready(op, early.data(), early.size(), &ready), KVTIER_OK) << LastError();
    ASSERT_LE(ready, kBlocks);
    if (seen.empty() || ready != seen.back()) {
      seen.push_back(ready);
      snapshots.emplace_back(early.begin(), early.begin() + static_cast<ptrdiff_t>(ready));
    }
    if (finished) break;
    // Read once more after the end: the last reading above may predate it.
    finished = kvtier_acquire_async_wait(op, 0) == KVTIER_OK;
    if (!finished) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  EXPECT_TRUE(FdReadable(fd, 0)) << "the eventfd is readable once the acquire finished";
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_LT(seen[i - 1], seen[i]) << "readiness never shrinks";
  std::string steps;
  for (size_t v : seen) steps += " " + std::to_string(v);
  RecordProperty("ready_steps", steps);
  std::printf("ready steps seen:%s\n", steps.c_str());
  uint64_t lease = 0;
  size_t n = 0;
  std::vector<kvtier_slot> slots(kBlocks);
  ASSERT_EQ(kvtier_acquire_async_result(op, &lease, slots.data(), &n), KVTIER_OK) << LastError();
  ASSERT_EQ(n, kBlocks);
  ASSERT_NE(lease, 0u);
  EXPECT_EQ(seen.back(), kBlocks);
  // Every ready prefix seen on the way is a prefix of the result.
  for (const auto& snap : snapshots) {
    for (size_t i = 0; i < snap.size(); ++i) {
      EXPECT_EQ(snap[i].slot, slots[i].slot) << i;
      EXPECT_EQ(snap[i].tier, slots[i].tier) << i;
    }
  }
  for (size_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(slots[i].tier, KVTIER_TIER_HOST) << i;
    EXPECT_EQ(slots[i].from_tier, KVTIER_TIER_NVME) << i;
  }
  ASSERT_NE(kvtier_host_arena(c, nullptr), nullptr);
  std::vector<uint8_t> async_bytes;
  for (size_t i = 0; i < kBlocks; ++i) {
    const auto* b = static_cast<const uint8_t*>(kvtier_host_slot(c, slots[i].slot));
    async_bytes.insert(async_bytes.end(), b, b + kBlockBytes);
    EXPECT_EQ(b[0], static_cast<uint8_t>(i + 1)) << i;
    EXPECT_EQ(b[kBlockBytes - 1], static_cast<uint8_t>(i + 1)) << i;
  }
  // The result is the result's to release; freeing the handle then releases nothing.
  kvtier_acquire_async_free(op);
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK) << LastError();
  // The second one got the same blocks.
  {
    uint64_t lease3 = 0;
    size_t n3 = 0;
    std::vector<kvtier_slot> slots3(kBlocks);
    ASSERT_EQ(kvtier_acquire_async_result(second, &lease3, slots3.data(), &n3), KVTIER_OK) << LastError();
    ASSERT_EQ(n3, kBlocks);
    for (size_t i = 0; i < kBlocks; ++i) EXPECT_EQ(slots3[i].slot, slots[i].slot) << i;
    EXPECT_EQ(kvtier_release(c, lease3), KVTIER_OK);
    kvtier_acquire_async_free(second);
  }
  // The blocking acquire now finds the same blocks (in host) in the same slots.
  uint64_t lease2 = 0;
  size_t n2 = 0;
  std::vector<kvtier_slot> slots2(kBlocks);
  ASSERT_EQ(kvtier_acquire(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, &lease2, slots2.data(), &n2),
            KVTIER_OK)
      << LastError();
  ASSERT_EQ(n2, kBlocks);
  std::vector<uint8_t> sync_bytes;
  for (size_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(slots2[i].slot, slots[i].slot) << i;
    EXPECT_EQ(slots2[i].tier, slots[i].tier) << i;
    const auto* b = static_cast<const uint8_t*>(kvtier_host_slot(c, slots2[i].slot));
    sync_bytes.insert(sync_bytes.end(), b, b + kBlockBytes);
  }
  EXPECT_EQ(async_bytes, sync_bytes);
  EXPECT_EQ(kvtier_release(c, lease2), KVTIER_OK) << LastError();
  // A prefix with a miss in the middle: both answer the same shorter prefix.
  std::vector<kvtier_key> gap = st.keys;
  gap[10] = kvtier_key{99, 99};
  ASSERT_EQ(kvtier_acquire_async(c, st.cid, gap.data(), kBlocks, KVTIER_TIER_HOST, 4, &op), KVTIER_OK) << LastError();
  ASSERT_EQ(kvtier_acquire_async_result(op, &lease, slots.data(), &n), KVTIER_OK) << LastError();
  EXPECT_EQ(n, 10u);
  kvtier_acquire_async_free(op);
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK) << LastError();
  ASSERT_EQ(kvtier_acquire(c, st.cid, gap.data(), kBlocks, KVTIER_TIER_HOST, &lease2, slots2.data(), &n2),
            KVTIER_OK);
  EXPECT_EQ(n2, 10u);
  EXPECT_EQ(kvtier_release(c, lease2), KVTIER_OK) << LastError();
  // An unknown contract: the error of the blocking acquire, from the handle.
  ASSERT_EQ(kvtier_acquire_async(c, 0x1234, st.keys.data(), 4, KVTIER_TIER_HOST, 0, &op), KVTIER_OK);
  EXPECT_EQ(kvtier_acquire_async_result(op, &lease, slots.data(), &n), KVTIER_NOT_FOUND);
  EXPECT_NE(LastError().find("not registered"), std::string::npos) << LastError();
  kvtier_acquire_async_free(op);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Several asynchronous acquires in flight on one client, each restoring a third of the
// blocks from NVMe: each result is its keys' blocks. With the daemon's limit at 2, a third
// sent while two are in flight finishes REJECTED, naming the config key (rounds, because
// whether the first two are still in flight when the third arrives is timing: the limit
// must show in at least one round, and never let a third through beside two).
TEST(ClientAsync, SeveralInFlightUpToTheDaemonsLimit) {
  DaemonConfig cfg;
  cfg.daemon_extra = "max_async_acquires_per_client = 2\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  Stored st;
  ASSERT_NO_FATAL_FAILURE(StoreOnNvme(d, &st));
  kvtier_client* c = Connect(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  uint64_t ab = 0;
  const auto* arena = static_cast<const uint8_t*>(kvtier_host_arena(c, &ab));
  const uint64_t sb = kvtier_slot_bytes(c);
  constexpr size_t kPart = kBlocks / 3;
  int refused_rounds = 0;
  for (int round = 0; round < 20 && refused_rounds == 0; ++round) {
    if (round > 0) {  // back to NVMe only
      ASSERT_EQ(kvtier_flush(c), KVTIER_OK) << LastError();
    }
    kvtier_acquire_op* ops[3] = {};
    for (size_t k = 0; k < 3; ++k) {
      ASSERT_EQ(kvtier_acquire_async(c, st.cid, st.keys.data() + k * kPart, kPart, KVTIER_TIER_HOST, 1, &ops[k]),
                KVTIER_OK)
          << LastError();
    }
    int ok = 0;
    for (size_t k = 0; k < 3; ++k) {
      uint64_t lease = 0;
      size_t n = 0;
      std::vector<kvtier_slot> slots(kPart);
      const kvtier_status s = kvtier_acquire_async_result(ops[k], &lease, slots.data(), &n);
      if (s == KVTIER_REJECTED) {
        EXPECT_EQ(k, 2u) << "refused while fewer than 2 were in flight";
        EXPECT_NE(LastError().find("daemon.max_async_acquires_per_client"), std::string::npos) << LastError();
        ++refused_rounds;
      } else {
        ASSERT_EQ(s, KVTIER_OK) << LastError();
        ASSERT_EQ(n, kPart);
        ++ok;
        for (size_t i = 0; i < n; ++i) {
          EXPECT_EQ(arena[slots[i].slot * sb], static_cast<uint8_t>(k * kPart + i + 1)) << k << "/" << i;
        }
        EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK) << LastError();
      }
      kvtier_acquire_async_free(ops[k]);
    }
    EXPECT_GE(ok, 2);
  }
  EXPECT_GT(refused_rounds, 0) << "three asynchronous acquires ran at once against a limit of 2 in every round";
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The eventfd turns readable per ready step, not only at the end: an event loop that
// polls it, reads it and asks _ready sees leading blocks before the acquire finished
// (rounds, because a restore may also land in one step; it must show in at least one).
// The test daemon holds each ready step published before the end for 100 ms
// (KVTIER_TEST_DELAY_POINT): on a loaded machine the client may otherwise be scheduled
// only after the whole restore, which says nothing about the wake-ups.
TEST(ClientAsync, EventfdWakesPerReadyStep) {
  ScopedEnv delay("KVTIER_TEST_DELAY_POINT", "Session::AcquireStep:Ready=100");
  DaemonConfig cfg;
  cfg.binary = "kvtierd-test";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  Stored st;
  ASSERT_NO_FATAL_FAILURE(StoreOnNvme(d, &st));
  kvtier_client* c = Connect(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  int early_rounds = 0;
  for (int round = 0; round < 20 && early_rounds == 0; ++round) {
    if (round > 0) {
      ASSERT_EQ(kvtier_flush(c), KVTIER_OK) << LastError();
    }
    kvtier_acquire_op* op = nullptr;
    ASSERT_EQ(kvtier_acquire_async(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, 1, &op), KVTIER_OK)
        << LastError();
    const int fd = kvtier_acquire_async_fd(op);
    size_t last = 0;
    while (true) {
      ASSERT_TRUE(FdReadable(fd, 10000)) << "no wake-up within 10 s";
      uint64_t count = 0;
      ASSERT_EQ(::read(fd, &count, sizeof count), static_cast<ssize_t>(sizeof count));
      const bool finished = kvtier_acquire_async_wait(op, 0) == KVTIER_OK;
      size_t ready = 0;
      ASSERT_EQ(kvtier_acquire_async_ready(op, nullptr, 0, &ready), KVTIER_OK) << LastError();
      EXPECT_GE(ready, last);
      last = ready;
      if (finished) break;
      EXPECT_GT(ready, 0u) << "woken while in flight with nothing ready";
      ++early_rounds;
    }
    EXPECT_EQ(last, kBlocks);
    uint64_t lease = 0;
    size_t n = 0;
    std::vector<kvtier_slot> slots(kBlocks);
    ASSERT_EQ(kvtier_acquire_async_result(op, &lease, slots.data(), &n), KVTIER_OK) << LastError();
    EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
    kvtier_acquire_async_free(op);
  }
  EXPECT_GT(early_rounds, 0) << "the eventfd turned readable only when the acquire had finished";
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

TEST(ClientAsync, FreeAndCloseWhileInFlightAreSafe) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Stored st;
  ASSERT_NO_FATAL_FAILURE(StoreOnNvme(d, &st));
  kvtier_client* c = Connect(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  // Freed at once: the lease it made is released, nothing stays pinned.
  kvtier_acquire_op* op = nullptr;
  ASSERT_EQ(kvtier_acquire_async(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, 4, &op), KVTIER_OK)
      << LastError();
  kvtier_acquire_async_free(op);
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_leases"), 0) << d.Metrics();
  // Closed while in flight: the handle answers DISCONNECTED and is still freed.
  kvtier_client* c2 = Connect(d.socket());
  ASSERT_NE(c2, nullptr) << LastError();
  ASSERT_EQ(kvtier_acquire_async(c2, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, 4, &op), KVTIER_OK)
      << LastError();
  kvtier_close(c2);
  ASSERT_EQ(kvtier_acquire_async_wait(op, 1000), KVTIER_OK);
  EXPECT_TRUE(FdReadable(kvtier_acquire_async_fd(op), 0));
  uint64_t lease = 0;
  size_t n = 0;
  std::vector<kvtier_slot> slots(kBlocks);
  const kvtier_status rs = kvtier_acquire_async_result(op, &lease, slots.data(), &n);
  if (rs != KVTIER_OK) {
    EXPECT_EQ(rs, KVTIER_DISCONNECTED) << LastError();
    EXPECT_NE(LastError().find("closed"), std::string::npos) << LastError();
  }
  kvtier_acquire_async_free(op);
  // The daemon released what the closed client held; the first client still works.
  uint64_t lease2 = 0;
  ASSERT_EQ(kvtier_acquire(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, &lease2, slots.data(), &n),
            KVTIER_OK)
      << LastError();
  EXPECT_EQ(n, kBlocks);
  EXPECT_EQ(kvtier_release(c, lease2), KVTIER_OK);
  // c2's session ends on the daemon's closer thread, after its in-flight acquire finished
  // and its leases were released: kvtier_clients drops to 1 then (however long a loaded
  // machine takes), and from then on no lease of c2's may remain.
  ASSERT_EQ(d.WaitMetric("kvtier_clients", 1, 60000), 1) << d.Metrics();
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_leases"), 0) << d.Metrics() << d.log();
  // The socket transport cannot carry it.
  ASSERT_EQ(kvtier_set_transport(c, KVTIER_TRANSPORT_SOCKET), KVTIER_OK);
  EXPECT_EQ(kvtier_acquire_async(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, 4, &op), KVTIER_UNSUPPORTED);
  EXPECT_EQ(op, nullptr);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A forked child's calls on the parent's handle fail at once; its free and close leave
// the parent's acquire alone.
TEST(ClientAsync, ForkedChildLeavesTheParentsAcquireAlone) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Stored st;
  ASSERT_NO_FATAL_FAILURE(StoreOnNvme(d, &st));
  kvtier_client* c = Connect(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  kvtier_acquire_op* op = nullptr;
  ASSERT_EQ(kvtier_acquire_async(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, 4, &op), KVTIER_OK)
      << LastError();
  const pid_t pid = ::fork();
  if (pid == 0) {
    size_t ready = 0;
    int rc = 0;
    if (kvtier_acquire_async_ready(op, nullptr, 0, &ready) != KVTIER_INVALID) rc |= 1;
    if (std::string(kvtier_last_error()).find("after fork") == std::string::npos) rc |= 2;
    if (kvtier_acquire_async_wait(op, 0) != KVTIER_INVALID) rc |= 4;
    kvtier_acquire_async_free(op);
    kvtier_close(c);
    ::_exit(rc);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  uint64_t lease = 0;
  size_t n = 0;
  std::vector<kvtier_slot> slots(kBlocks);
  ASSERT_EQ(kvtier_acquire_async_result(op, &lease, slots.data(), &n), KVTIER_OK) << LastError();
  EXPECT_EQ(n, kBlocks);
  kvtier_acquire_async_free(op);
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK) << LastError();
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// Op::kAcquireAsync on the wire: a header with reserved bits is an error answered after
// the progress header (which stays zero), not a strike; a sound request with a miss
// answers 0 slots, no lease.
TEST(ClientAsync, WireRequestChecks) {
  DaemonConfig cfg;
  cfg.max_bad_requests = 2;
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = Connect(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK) << LastError();
  RawClient raw;
  wire::AttachReply reply;
  ASSERT_TRUE(raw.Attach(d.socket(), &reply));
  ASSERT_EQ(reply.status, 0);
  EXPECT_EQ(reply.protocol_version, wire::kProtocolVersion);
  const wire::WireKey key{5, 6};
  for (int round = 0; round < 3; ++round) {  // more than max_bad_requests
    wire::AcquireAsyncHeader h;
    h.chunk_blocks = 4;
    h.reserved = 1;
    std::memcpy(raw.data(), &h, sizeof h);
    std::memcpy(raw.data() + sizeof h, &key, sizeof key);
    std::memset(raw.data() + 4096, 0, 256);
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kAcquireAsync);
    e.tag = 10 + static_cast<uint64_t>(round);
    e.count = 1;
    e.tier = wire::kTierHost;
    e.contract_id = cid;
    e.in_off = 0;
    e.in_len = sizeof h + sizeof key;
    e.out_off = 4096;
    e.out_len = 256;
    wire::CompletionEntry done;
    ASSERT_TRUE(raw.Submit(e, &done)) << d.log();
    EXPECT_EQ(done.status, static_cast<int32_t>(StatusCode::kInvalid));
    const std::string msg(reinterpret_cast<const char*>(raw.data() + 4096 + sizeof(wire::AcquireProgress)),
                          done.msg_len);
    EXPECT_NE(msg.find("reserved"), std::string::npos) << msg;
    wire::AcquireProgress p;
    std::memcpy(&p, raw.data() + 4096, sizeof p);
    EXPECT_EQ(p.ready, 0u);
  }
  {
    wire::AcquireAsyncHeader h;
    std::memcpy(raw.data(), &h, sizeof h);
    std::memcpy(raw.data() + sizeof h, &key, sizeof key);
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kAcquireAsync);
    e.tag = 20;
    e.count = 1;
    e.tier = wire::kTierHost;
    e.contract_id = cid;
    e.in_len = sizeof h + sizeof key;
    e.out_off = 4096;
    e.out_len = 256;
    wire::CompletionEntry done;
    ASSERT_TRUE(raw.Submit(e, &done)) << d.log();
    EXPECT_EQ(done.status, 0);
    EXPECT_EQ(done.count, 0u);
    EXPECT_EQ(done.value, 0u);
    wire::AcquireProgress p;
    std::memcpy(&p, raw.data() + 4096, sizeof p);
    EXPECT_EQ(p.ready, 0u);
    EXPECT_EQ(p.done, 1u);
  }
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_clients_disconnected_total{reason=\"misbehaved\"}"), 0);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The C++ wrapper: AsyncAcquire is move-only RAII, Result() gives a ScopedLease.
TEST(ClientAsync, CppWrapper) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Stored st;
  ASSERT_NO_FATAL_FAILURE(StoreOnNvme(d, &st));
  kvtier::client::Client c;
  ASSERT_TRUE(c.Connect(d.socket()).ok()) << LastError();
  kvtier::client::AsyncAcquire op;
  ASSERT_TRUE(c.AcquireAsync(st.cid, st.keys, KVTIER_TIER_HOST, &op, 8).ok()) << LastError();
  ASSERT_TRUE(op);
  kvtier::client::AsyncAcquire moved = std::move(op);
  EXPECT_FALSE(op);
  EXPECT_GE(moved.fd(), 0);
  ASSERT_TRUE(moved.Wait(-1).ok()) << LastError();
  size_t ready = 0;
  std::vector<kvtier_slot> early;
  ASSERT_TRUE(moved.Ready(&ready, &early).ok());
  EXPECT_EQ(ready, kBlocks);
  kvtier::client::ScopedLease lease;
  ASSERT_TRUE(moved.Result(&lease).ok()) << LastError();
  ASSERT_EQ(lease.size(), kBlocks);
  for (size_t i = 0; i < kBlocks; ++i) EXPECT_EQ(lease.slots()[i].slot, early[i].slot) << i;
  EXPECT_TRUE(lease.Release().ok());
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_leases"), 0) << d.Metrics();
  c.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

}  // namespace
}  // namespace kvtier::testing
