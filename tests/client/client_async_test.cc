// kvtier_acquire_async against a real kvtierd, with the blocks on NVMe only (stored,
// flushed, daemon restarted): readiness only grows and its slots are the final ones,
// the result is the blocking acquire's (slots and bytes), the eventfd turns readable
// at the end, a second asynchronous acquire is refused while one is in flight, and
// freeing or closing while it is in flight is safe and leaves no pin behind.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
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
  DaemonProcess d;
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
  // A second one while the first is in flight: refused, saying why.
  kvtier_acquire_op* second = nullptr;
  const kvtier_status s2 = kvtier_acquire_async(c, st.cid, st.keys.data(), kBlocks, KVTIER_TIER_HOST, 4, &second);
  if (s2 == KVTIER_REJECTED) {
    EXPECT_EQ(second, nullptr);
    EXPECT_NE(LastError().find("already in flight"), std::string::npos) << LastError();
  } else {
    // The first finished before the second call: then the second is an ordinary one.
    ASSERT_EQ(s2, KVTIER_OK) << LastError();
    ASSERT_EQ(kvtier_acquire_async_wait(op, 0), KVTIER_OK);
    kvtier_acquire_async_free(second);
  }
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
  const uint8_t* arena = static_cast<const uint8_t*>(kvtier_host_arena(c, nullptr));
  ASSERT_NE(arena, nullptr);
  const uint64_t slot_bytes = kvtier_slot_bytes(c);
  std::vector<uint8_t> async_bytes;
  for (size_t i = 0; i < kBlocks; ++i) {
    const uint8_t* b = arena + slots[i].slot * slot_bytes;
    async_bytes.insert(async_bytes.end(), b, b + kBlockBytes);
    EXPECT_EQ(b[0], static_cast<uint8_t>(i + 1)) << i;
    EXPECT_EQ(b[kBlockBytes - 1], static_cast<uint8_t>(i + 1)) << i;
  }
  // The result is the result's to release; freeing the handle then releases nothing.
  kvtier_acquire_async_free(op);
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK) << LastError();
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
    const uint8_t* b = arena + slots2[i].slot * slot_bytes;
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
  for (int i = 0; i < 200 && MetricValue(d.Metrics(), "kvtier_leases") != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_leases"), 0) << d.Metrics();
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
  EXPECT_EQ(reply.protocol_version, 4u);
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
