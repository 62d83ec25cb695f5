// kvtierd + clients as real processes: the daemon binary from KVTIER_BIN_DIR on a temp
// config (host + NVMe tiers, no GPU), clients made with fork() that attach through
// libkvtier, plus a raw client that writes malformed entries straight into its ring.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlockBytes = 576;  // SmallContract(): 2 layers x 288 bytes

std::vector<uint32_t> Tokens(size_t n, uint32_t seed) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = seed * 100003u + static_cast<uint32_t>(i) * 7919u;
  return t;
}

// Stores `keys` (a chain) under `contract`: alloc host slots, write, commit, release.
int StoreChain(kvtier_client* c, uint64_t contract, const std::vector<kvtier_key>& keys) {
  uint64_t lease = 0;
  std::vector<kvtier_slot> slots(keys.size());
  CHILD_CHECK(kvtier_alloc(c, contract, keys.size(), KVTIER_TIER_HOST, &lease, slots.data()) == KVTIER_OK);
  CHILD_CHECK(lease != 0);
  uint64_t arena_bytes = 0;
  auto* arena = static_cast<uint8_t*>(kvtier_host_arena(c, &arena_bytes));
  CHILD_CHECK(arena != nullptr);
  const uint64_t sb = kvtier_slot_bytes(c);
  std::vector<kvtier_commit_item> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    CHILD_CHECK(slots[i].tier == KVTIER_TIER_HOST);
    CHILD_CHECK((slots[i].slot + 1ull) * sb <= arena_bytes);
    FillBlock(arena + slots[i].slot * sb, kBlockBytes, contract, keys[i]);
    items[i].slot = slots[i];
    items[i].key = keys[i];
    items[i].parent = i == 0 ? kvtier_key{0, 0} : keys[i - 1];
  }
  size_t done = 0;
  CHILD_CHECK(kvtier_commit(c, contract, lease, items.data(), items.size(), &done) == KVTIER_OK);
  CHILD_CHECK(done == keys.size());
  CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
  return 0;
}

// Acquires `keys` into host and checks every block's bytes; expects `want_hits` blocks.
int AcquireAndCheck(kvtier_client* c, uint64_t contract, const std::vector<kvtier_key>& keys,
                    size_t want_hits) {
  uint64_t lease = 0;
  size_t n = 0;
  std::vector<kvtier_slot> slots(keys.size());
  CHILD_CHECK(kvtier_acquire(c, contract, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease,
                             slots.data(), &n) == KVTIER_OK);
  CHILD_CHECK(n == want_hits);
  uint64_t arena_bytes = 0;
  auto* arena = static_cast<uint8_t*>(kvtier_host_arena(c, &arena_bytes));
  const uint64_t sb = kvtier_slot_bytes(c);
  for (size_t i = 0; i < n; ++i) {
    CHILD_CHECK(slots[i].tier == KVTIER_TIER_HOST);
    CHILD_CHECK(CheckBlock(arena + slots[i].slot * sb, kBlockBytes, contract, keys[i]));
  }
  if (n > 0) CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
  else CHILD_CHECK(lease == 0);
  return 0;
}

kvtier_client* Connect(const std::string& sock, const char* name) {
  kvtier_connect_options o{};
  o.name = name;
  o.timeout_ms = 10000;
  kvtier_client* c = nullptr;
  if (kvtier_connect(sock.c_str(), &o, &c) != KVTIER_OK) {
    std::fprintf(stderr, "connect: %s\n", kvtier_last_error());
    return nullptr;
  }
  return c;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(d_.Start()) << d_.log(); }
  void TearDown() override {
    if (d_.Alive()) {
      EXPECT_EQ(d_.Stop(), 0) << d_.log();
    }
  }
  // KilledClientLosesItsLeases lets one client lease the whole host tier.
  static DaemonConfig WholeTierShare() {
    DaemonConfig c;
    c.daemon_extra = "max_tier_share_per_client = 1.0\n";
    return c;
  }
  DaemonProcess d_{WholeTierShare()};
};

TEST_F(DaemonTest, AttachStoreLookupAcquireReleaseAcrossProcesses) {
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  const auto tokens = Tokens(16 * 8 + 5, 1);  // 8 full blocks
  std::vector<kvtier_key> keys(8);
  size_t nk = 0;
  ASSERT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), keys.size(), &nk), KVTIER_OK);
  ASSERT_EQ(nk, 8u);

  Child writer([&] {
    kvtier_client* c = Connect(d_.socket(), "writer");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(id == cid);
    CHILD_CHECK(StoreChain(c, cid, keys) == 0);
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(writer.Wait(), 0) << d_.log();

  // Three readers at once, each a separate process with its own rings.
  std::vector<std::unique_ptr<Child>> readers;
  for (int r = 0; r < 3; ++r) {
    readers.push_back(std::make_unique<Child>([&, r] {
      kvtier_client* c = Connect(d_.socket(), "reader");
      CHILD_CHECK(c != nullptr);
      uint64_t id = 0;
      CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);  // idempotent
      // The cached prefix of a longer prompt: 8 hits, then a miss.
      const auto longer = Tokens(16 * 12, 1);
      std::vector<kvtier_key> lk(12);
      size_t n = 0;
      CHILD_CHECK(kvtier_key_chain(cid, longer.data(), longer.size(), 16, lk.data(), lk.size(), &n) == KVTIER_OK);
      kvtier_lookup_result lr{};
      std::vector<uint8_t> tiers(12);
      CHILD_CHECK(kvtier_lookup(c, cid, lk.data(), lk.size(), &lr, tiers.data()) == KVTIER_OK);
      CHILD_CHECK(lr.hit_blocks == 8);
      for (int i = 0; i < 8; ++i) CHILD_CHECK(tiers[i] == KVTIER_TIER_HOST);
      for (int i = 8; i < 12; ++i) CHILD_CHECK(tiers[i] == KVTIER_TIER_NONE);
      CHILD_CHECK(lr.est_seconds_to_hbm >= 0.0);
      for (int rep = 0; rep < 20; ++rep) CHILD_CHECK(AcquireAndCheck(c, cid, lk, 8) == 0);
      // The same through the socket transport gives the same answer.
      CHILD_CHECK(kvtier_set_transport(c, KVTIER_TRANSPORT_SOCKET) == KVTIER_OK);
      kvtier_lookup_result lr2{};
      CHILD_CHECK(kvtier_lookup(c, cid, lk.data(), lk.size(), &lr2, nullptr) == KVTIER_OK);
      CHILD_CHECK(lr2.hit_blocks == 8);
      CHILD_CHECK(AcquireAndCheck(c, cid, lk, 8) == 0);
      (void)r;
      kvtier_close(c);
      return 0;
    }));
  }
  for (auto& r : readers) EXPECT_EQ(r->Wait(), 0) << d_.log();

  // Every lease was released; the blocks are still cached.
  EXPECT_EQ(d_.WaitMetric("kvtier_leases", 0), 0);
  EXPECT_EQ(d_.WaitMetric("kvtier_clients", 0), 0);
  const std::string m = d_.Metrics();
  EXPECT_EQ(MetricValue(m, "kvtier_tier_blocks{tier=\"host\"}"), 8) << m;
  EXPECT_GT(MetricValue(m, "kvtier_request_duration_seconds_count{op=\"lookup\",transport=\"ring\"}"), 0);
  EXPECT_GT(MetricValue(m, "kvtier_request_duration_seconds_count{op=\"lookup\",transport=\"socket\"}"), 0);
  EXPECT_EQ(MetricValue(m, "kvtier_clients_attached_total"), 4);
}

TEST_F(DaemonTest, KilledClientLosesItsLeases) {
  const auto desc = SmallContract();
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  // 64 host slots: the victim takes every one of them.
  Child victim([&] {
    kvtier_client* c = Connect(d_.socket(), "victim");
    CHILD_CHECK(c != nullptr);
    uint64_t cid = 0, lease = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &cid) == KVTIER_OK);
    std::vector<kvtier_slot> slots(64);
    CHILD_CHECK(kvtier_alloc(c, cid, 64, KVTIER_TIER_HOST, &lease, slots.data()) == KVTIER_OK);
    char b = 1;
    CHILD_CHECK(::write(ready[1], &b, 1) == 1);
    ::pause();  // hold the lease until killed
    return 0;
  });
  char b;
  ASSERT_EQ(::read(ready[0], &b, 1), 1);
  EXPECT_EQ(MetricValue(d_.Metrics(), "kvtier_leased_slots"), 64);

  kvtier_client* c = Connect(d_.socket(), "survivor");
  ASSERT_NE(c, nullptr);
  uint64_t cid = 0, lease = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  std::vector<kvtier_slot> slots(64);
  // The tier is full of leased slots: nothing to give.
  EXPECT_NE(kvtier_alloc(c, cid, 1, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK);

  victim.Kill(SIGKILL);
  EXPECT_EQ(victim.Wait(), 128 + SIGKILL);
  EXPECT_EQ(d_.WaitMetric("kvtier_leases", 0), 0) << d_.log();
  // All 64 slots are free again.
  kvtier_status s = KVTIER_RETRY;
  for (int i = 0; i < 200 && s != KVTIER_OK; ++i) {
    s = kvtier_alloc(c, cid, 64, KVTIER_TIER_HOST, &lease, slots.data());
    if (s != KVTIER_OK) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(s, KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  // A lease is never released twice, and never by another client.
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_NOT_FOUND);
  kvtier_close(c);
  EXPECT_GE(MetricValue(d_.Metrics(), "kvtier_clients_disconnected_total{reason=\"closed\"}"), 1);
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST_F(DaemonTest, TwoContractsSideBySideNeverAlias) {
  const auto da = SmallContract("test/model-a");
  auto db = SmallContract("test/model-a");
  const float scales[2] = {0.5f, 0.5f};
  db.k_scales = scales;  // only the K scales differ: another contract
  kvtier_client* c = Connect(d_.socket(), "two");
  ASSERT_NE(c, nullptr);
  uint64_t ca = 0, cb = 0;
  ASSERT_EQ(kvtier_register_contract(c, &da, &ca), KVTIER_OK);
  ASSERT_EQ(kvtier_register_contract(c, &db, &cb), KVTIER_OK);
  ASSERT_NE(ca, cb);
  // The very same raw keys under both contracts.
  std::vector<kvtier_key> keys;
  for (uint64_t i = 1; i <= 6; ++i) keys.push_back(kvtier_key{0xabc000 + i, 0x123 * i});
  ASSERT_EQ(StoreChain(c, ca, keys), 0);
  kvtier_lookup_result lr{};
  ASSERT_EQ(kvtier_lookup(c, cb, keys.data(), keys.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 0u) << "contract B sees contract A's blocks";
  ASSERT_EQ(StoreChain(c, cb, keys), 0);
  ASSERT_EQ(kvtier_lookup(c, ca, keys.data(), keys.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 6u);
  ASSERT_EQ(kvtier_lookup(c, cb, keys.data(), keys.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 6u);
  // Each contract's acquire returns its own bytes (FillBlock mixes the contract id in).
  EXPECT_EQ(AcquireAndCheck(c, ca, keys, 6), 0);
  EXPECT_EQ(AcquireAndCheck(c, cb, keys, 6), 0);
  // Acquire both at once: no slot is shared.
  uint64_t la = 0, lb = 0;
  size_t na = 0, nb = 0;
  std::vector<kvtier_slot> sa(6), sb(6);
  ASSERT_EQ(kvtier_acquire(c, ca, keys.data(), 6, KVTIER_TIER_HOST, &la, sa.data(), &na), KVTIER_OK);
  ASSERT_EQ(kvtier_acquire(c, cb, keys.data(), 6, KVTIER_TIER_HOST, &lb, sb.data(), &nb), KVTIER_OK);
  for (size_t i = 0; i < na; ++i) {
    for (size_t j = 0; j < nb; ++j) EXPECT_NE(sa[i].slot, sb[j].slot);
  }
  EXPECT_EQ(kvtier_release(c, la), KVTIER_OK);
  EXPECT_EQ(kvtier_release(c, lb), KVTIER_OK);
  // A contract that was never registered is refused, not converted.
  auto dc = SmallContract("test/never-registered");
  uint64_t cc = 0;
  ASSERT_EQ(kvtier_contract_id(&dc, &cc), KVTIER_OK);
  EXPECT_EQ(kvtier_lookup(c, cc, keys.data(), keys.size(), &lr, nullptr), KVTIER_NOT_FOUND);
  kvtier_close(c);
}

TEST_F(DaemonTest, ContractThatDoesNotFitTheSlotsIsRefused) {
  kvtier_client* c = Connect(d_.socket(), "big");
  ASSERT_NE(c, nullptr);
  auto big = SmallContract("test/big");
  big.num_layers = 80;  // 80 x 288 bytes > 4 KiB slots
  uint64_t id = 0;
  const kvtier_status s = kvtier_register_contract(c, &big, &id);
  EXPECT_TRUE(s == KVTIER_UNSUPPORTED || s == KVTIER_REJECTED) << kvtier_status_name(s);
  EXPECT_NE(std::string(kvtier_last_error()).find("register_contract"), std::string::npos)
      << kvtier_last_error();
  // The client and the daemon carry on.
  EXPECT_EQ(kvtier_ping(c), KVTIER_OK);
  kvtier_close(c);
}

// Malformed ring entries from one client get error completions; the client is cut off
// after max_bad_requests (4 here); a well-behaved client is served throughout.
TEST_F(DaemonTest, MalformedRingMessagesAreRefused) {
  const auto desc = SmallContract();
  kvtier_client* good = Connect(d_.socket(), "good");
  ASSERT_NE(good, nullptr);
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(good, &desc, &cid), KVTIER_OK);
  std::vector<kvtier_key> keys{{1, 2}, {3, 4}};
  ASSERT_EQ(StoreChain(good, cid, keys), 0);
  uint64_t good_lease = 0;
  size_t n = 0;
  std::vector<kvtier_slot> gs(2);
  ASSERT_EQ(kvtier_acquire(good, cid, keys.data(), 2, KVTIER_TIER_HOST, &good_lease, gs.data(), &n), KVTIER_OK);

  RawClient raw;
  wire::AttachReply reply;
  ASSERT_TRUE(raw.Attach(d_.socket(), &reply));
  ASSERT_EQ(reply.status, 0);
  const uint32_t data_bytes = static_cast<uint32_t>(raw.header().data_bytes);

  struct Case {
    const char* what;
    wire::RequestEntry e;
    int want;  // StatusCode
  };
  std::vector<Case> cases;
  auto lookup = [&](uint32_t count) {
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kLookup);
    e.count = count;
    e.contract_id = cid;
    e.in_len = count * 16;
    e.out_off = 4096;
    e.out_len = 4096;
    return e;
  };
  {
    wire::RequestEntry e = lookup(2);
    e.op = 42;
    cases.push_back({"unknown op", e, 6});
  }
  {
    wire::RequestEntry e = lookup(2);
    e.in_off = data_bytes - 8;  // runs past the data area
    cases.push_back({"in region out of bounds", e, 6});
  }
  {
    wire::RequestEntry e = lookup(2);
    e.contract_id = 0x1234;  // not registered
    cases.push_back({"unknown contract", e, 1});
  }
  {
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kRelease);
    e.lease_id = good_lease;  // another client's lease
    e.out_off = 4096;
    e.out_len = 256;
    cases.push_back({"someone else's lease", e, 1});
  }
  // Not-found answers are not malformed: only the two Invalid cases count as bad so far.
  uint64_t tag = 100;
  for (auto& cs : cases) {
    cs.e.tag = ++tag;
    wire::CompletionEntry c;
    ASSERT_TRUE(raw.Submit(cs.e, &c)) << cs.what;
    EXPECT_EQ(c.tag, cs.e.tag) << cs.what;
    EXPECT_EQ(c.status, cs.want) << cs.what;
    if (cs.e.out_off + cs.e.out_len <= data_bytes && c.msg_len > 0) {
      std::string msg(reinterpret_cast<char*>(raw.data() + cs.e.out_off), c.msg_len);
      EXPECT_FALSE(msg.empty()) << cs.what;
    }
  }
  // The good client's lease survived the attempt to release it from outside.
  EXPECT_EQ(kvtier_release(good, good_lease), KVTIER_OK);
  // A valid request from the raw client still works.
  {
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kNop);
    e.tag = 7777;
    wire::CompletionEntry c;
    ASSERT_TRUE(raw.Submit(e, &c));
    EXPECT_EQ(c.tag, 7777u);
    EXPECT_EQ(c.status, 0);
  }
  // Two more malformed entries reach max_bad_requests (4): the daemon disconnects it.
  for (int i = 0; i < 2; ++i) {
    wire::RequestEntry e = lookup(2);
    e.flags = 0xff;
    e.tag = 9000 + i;
    wire::CompletionEntry c;
    ASSERT_TRUE(raw.Submit(e, &c));
    EXPECT_EQ(c.status, 6);
  }
  EXPECT_TRUE(raw.WaitSocketClosed(5000));
  EXPECT_GE(MetricValue(d_.Metrics(), "kvtier_clients_disconnected_total{reason=\"misbehaved\"}"), 1);
  // The good client is unaffected.
  kvtier_lookup_result lr{};
  EXPECT_EQ(kvtier_lookup(good, cid, keys.data(), 2, &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 2u);
  kvtier_close(good);
}

// Random bytes as ring entries (half of them with in-range regions so that they get
// past the bounds checks and reach the operations): every one gets a completion with its
// tag, the daemon survives, and another client is served throughout.
TEST(DaemonFuzz, RandomRingEntriesNeverCrashTheDaemon) {
  DaemonConfig cfg;
  cfg.max_bad_requests = 1000000;
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* good = Connect(d.socket(), "good");
  ASSERT_NE(good, nullptr);
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(good, &desc, &cid), KVTIER_OK);
  RawClient raw;
  wire::AttachReply reply;
  ASSERT_TRUE(raw.Attach(d.socket(), &reply));
  ASSERT_EQ(reply.status, 0);
  const uint32_t data_bytes = static_cast<uint32_t>(raw.header().data_bytes);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(::getpid());
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  // Random junk in the data area too (keys, items, contract bytes).
  for (uint32_t i = 0; i + 8 <= data_bytes; i += 8) {
    const uint64_t v = next();
    std::memcpy(raw.data() + i, &v, 8);
  }
  int ok = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    wire::RequestEntry e;
    uint64_t words[8];
    for (auto& w : words) w = next();
    std::memcpy(&e, words, sizeof e);
    if (i % 2 == 0) {  // plausible: a real op, sane count, regions inside the data area
      e.op = static_cast<uint16_t>(1 + next() % wire::kMaxOp);
      e.flags = 0;
      std::memset(e.reserved, 0, sizeof e.reserved);
      e.count = static_cast<uint32_t>(next() % 64);
      e.contract_id = (next() % 2) ? cid : e.contract_id;
      e.tier = static_cast<uint8_t>(next() % 3);
      e.in_off = static_cast<uint32_t>((next() % (data_bytes / 2)) & ~7u);
      e.in_len = static_cast<uint32_t>(wire::RequiredInBytes(e));
      e.out_off = static_cast<uint32_t>((data_bytes / 2 + next() % (data_bytes / 4)) & ~7u);
      e.out_len = 4096;
    }
    e.tag = 1000000 + static_cast<uint64_t>(i);
    wire::CompletionEntry c;
    ASSERT_TRUE(raw.Submit(e, &c)) << "no completion for entry " << i << "\n" << d.log();
    ASSERT_EQ(c.tag, e.tag);
    (c.status == 0 ? ok : refused)++;
  }
  EXPECT_GT(refused, 1000);
  EXPECT_TRUE(d.Alive());
  EXPECT_EQ(kvtier_ping(good), KVTIER_OK);
  raw.Close();  // whatever the random allocs leased goes back with the socket
  EXPECT_EQ(d.WaitMetric("kvtier_leases", 0), 0);
  std::vector<kvtier_key> keys{{77, 1}};
  EXPECT_EQ(StoreChain(good, cid, keys), 0);
  kvtier_close(good);
  EXPECT_EQ(d.Stop(), 0) << d.log();
  std::printf("random entries: %d answered OK, %d refused\n", ok, refused);
}

TEST_F(DaemonTest, CorruptRingIndicesDisconnectOnlyThatClient) {
  kvtier_client* good = Connect(d_.socket(), "good");
  ASSERT_NE(good, nullptr);
  RawClient raw;
  wire::AttachReply reply;
  ASSERT_TRUE(raw.Attach(d_.socket(), &reply));
  ASSERT_EQ(reply.status, 0);
  raw.request_control()->tail = raw.request_control()->head + 100000;
  ::syscall(SYS_futex, &raw.request_control()->tail, 1 /*FUTEX_WAKE*/, 1, nullptr, nullptr, 0);
  EXPECT_TRUE(raw.WaitSocketClosed(5000));
  EXPECT_EQ(kvtier_ping(good), KVTIER_OK);
  kvtier_close(good);
}

// Protocol 1 (before WireSlot.from_tier) would read acquire replies with the source tier
// in a byte it expects to be zero; protocol 2 (152-byte WireTierStats, before the remote
// tier's error counters) would read stats with the wrong stride. The daemon refuses both
// at attach. Protocols 3 (before Op::kAcquireAsync) and 4 (a writable host arena) are
// still served, at their version, without the host arena (they would map it writable).
// Protocols 5 (before host parts), 6 (before WireTierStats.slab_moves and the HBM
// table), 7 (before CompletionEntry.cached_replaced and cached_disputed) and 8 (before
// slot sizes per contract; this daemon's classes are fixed at start) are served as the
// current one.
TEST_F(DaemonTest, OlderProtocolVersionIsRefused) {
  static_assert(wire::kProtocolVersion == 9, "update this test with the next protocol change");
  for (uint32_t version : {3u, 4u}) {
    RawClient old;
    wire::AttachReply reply;
    ASSERT_TRUE(old.Attach(d_.socket(), &reply, version));
    EXPECT_EQ(reply.status, 0) << reply.message;
    EXPECT_EQ(reply.protocol_version, version);
    EXPECT_EQ(reply.flags & wire::kReplyHasHost, 0u) << version;
    EXPECT_EQ(reply.num_fds, 1u) << version;
    EXPECT_EQ(old.host_classes().count, 0u);  // no table: the reply of its version
  }
  for (uint32_t version : {5u, 6u, 7u, 8u, wire::kProtocolVersion}) {
    RawClient v5;
    wire::AttachReply reply;
    ASSERT_TRUE(v5.Attach(d_.socket(), &reply, version));
    EXPECT_EQ(reply.status, 0) << reply.message;
    EXPECT_EQ(reply.protocol_version, version);
    EXPECT_NE(reply.flags & wire::kReplyHasStaging, 0u);
    EXPECT_EQ(reply.num_fds, 3u);
    EXPECT_GT(reply.staging_slots, 0u);
    ASSERT_EQ(v5.host_classes().count, 1u);  // one class: the granule is the slot
    EXPECT_EQ(v5.host_classes().class_bytes[0], reply.slot_bytes);
    EXPECT_EQ(v5.host_classes().granule, reply.slot_bytes);
  }
  for (uint32_t version : {1u, 2u}) {
    RawClient old;
    wire::AttachReply reply;
    ASSERT_TRUE(old.Attach(d_.socket(), &reply, version));
    EXPECT_EQ(reply.status, static_cast<int32_t>(StatusCode::kUnsupported)) << version;
    EXPECT_NE(std::string(reply.message).find("protocol version"), std::string::npos) << reply.message;
    EXPECT_TRUE(old.WaitSocketClosed(5000));
  }
}

TEST_F(DaemonTest, WrongProtocolVersionIsRefused) {
  RawClient old;
  wire::AttachReply reply;
  ASSERT_TRUE(old.Attach(d_.socket(), &reply, wire::kProtocolVersion + 1));
  EXPECT_EQ(reply.status, static_cast<int32_t>(StatusCode::kUnsupported));
  EXPECT_NE(std::string(reply.message).find("protocol version"), std::string::npos) << reply.message;
  EXPECT_EQ(reply.num_fds, 0u);
  EXPECT_TRUE(old.WaitSocketClosed(5000));

  // An attached client whose socket request carries another version gets an error
  // completion and stays attached.
  RawClient raw;
  ASSERT_TRUE(raw.Attach(d_.socket(), &reply));
  ASSERT_EQ(reply.status, 0);
  wire::RequestEntry e;
  e.op = static_cast<uint16_t>(wire::Op::kNop);
  e.tag = 55;
  wire::CompletionEntry c;
  std::string body;
  ASSERT_TRUE(raw.SocketRequest(e, nullptr, 0, wire::kProtocolVersion + 1, &c, &body));
  EXPECT_EQ(c.tag, 55u);
  EXPECT_EQ(c.status, static_cast<int32_t>(StatusCode::kUnsupported));
  EXPECT_NE(body.find("protocol version"), std::string::npos) << body;
  ASSERT_TRUE(raw.SocketRequest(e, nullptr, 0, wire::kProtocolVersion, &c, &body));
  EXPECT_EQ(c.status, 0);

  kvtier_client* good = Connect(d_.socket(), "good");
  ASSERT_NE(good, nullptr);
  EXPECT_EQ(kvtier_ping(good), KVTIER_OK);
  kvtier_close(good);
}

TEST_F(DaemonTest, MetricsEndpoint) {
  int status = 0;
  const std::string m = HttpGet(d_.metrics_port(), "/metrics", &status);
  EXPECT_EQ(status, 200);
  for (const char* series :
       {"kvtier_tier_capacity_bytes{tier=\"host\"}", "kvtier_tier_capacity_bytes{tier=\"nvme\"}",
        "kvtier_tier_used_bytes{tier=\"host\"}", "kvtier_tier_hits_total{tier=\"host\"}",
        "kvtier_tier_misses_total{tier=\"host\"}", "kvtier_tier_promotions_total{tier=\"host\"}",
        "kvtier_tier_demotions_total{tier=\"host\"}", "kvtier_tier_bytes_read_total{tier=\"nvme\"}",
        "kvtier_tier_checksum_failures_total{tier=\"nvme\"}",
        "kvtier_tier_evictions_total{tier=\"host\",reason=\"demoted\"}", "kvtier_clients",
        "kvtier_leases"}) {
    EXPECT_GE(MetricValue(m, series), 0) << series << "\n" << m;
  }
  EXPECT_EQ(MetricValue(m, "kvtier_tier_capacity_bytes{tier=\"host\"}"), 256 * 1024);
  HttpGet(d_.metrics_port(), "/nope", &status);
  EXPECT_EQ(status, 404);
}

TEST_F(DaemonTest, SighupReloadsEvictionSettingsWithoutDroppingBlocks) {
  const auto desc = SmallContract();
  kvtier_client* c = Connect(d_.socket(), "hup");
  ASSERT_NE(c, nullptr);
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  std::vector<kvtier_key> keys{{11, 1}, {12, 2}, {13, 3}};
  ASSERT_EQ(StoreChain(c, cid, keys), 0);

  std::string cfg = ReadText(d_.config_path());
  const size_t p = cfg.find("policy = \"prefix-lru\"");
  ASSERT_NE(p, std::string::npos);
  cfg.replace(p, 21, "policy = \"lru\"\nhigh_watermark = 0.9\nlow_watermark = 0.6");
  WriteText(d_.config_path(), cfg);
  d_.Signal(SIGHUP);
  EXPECT_EQ(d_.WaitMetric("kvtier_config_reloads_total{result=\"ok\"}", 1), 1) << d_.log();
  EXPECT_NE(d_.log().find("host policy lru, watermarks 0.6/0.9"), std::string::npos) << d_.log();
  kvtier_lookup_result lr{};
  ASSERT_EQ(kvtier_lookup(c, cid, keys.data(), keys.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 3u);
  EXPECT_EQ(AcquireAndCheck(c, cid, keys, 3), 0);

  // A broken config on SIGHUP changes nothing and the daemon keeps serving.
  WriteText(d_.config_path(), cfg + "\n[tiers.host]\nbogus = 1\n");
  d_.Signal(SIGHUP);
  EXPECT_EQ(d_.WaitMetric("kvtier_config_reloads_total{result=\"failed\"}", 1), 1) << d_.log();
  EXPECT_EQ(kvtier_ping(c), KVTIER_OK);
  ASSERT_EQ(kvtier_lookup(c, cid, keys.data(), keys.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 3u);
  kvtier_close(c);
}

TEST(DaemonLifecycle, SigtermDrainsAndExitsCleanly) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  const auto desc = SmallContract();
  kvtier_client* c = Connect(d.socket(), "held");
  ASSERT_NE(c, nullptr);
  uint64_t cid = 0, lease = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  std::vector<kvtier_slot> slots(4);
  ASSERT_EQ(kvtier_alloc(c, cid, 4, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK);
  EXPECT_EQ(d.Stop(), 0) << d.log();
  const std::string log = d.log();
  EXPECT_NE(log.find("draining"), std::string::npos) << log;
  EXPECT_NE(log.find("released 1 leases"), std::string::npos) << log;
  EXPECT_NE(log.find("kvtierd stopped"), std::string::npos) << log;
  // The client notices instead of hanging.
  const kvtier_status s = kvtier_ping(c);
  EXPECT_TRUE(s == KVTIER_DISCONNECTED || s == KVTIER_IO_ERROR) << kvtier_status_name(s);
  kvtier_close(c);
  EXPECT_FALSE(d.CanConnect());
}

TEST(DaemonLifecycle, RestartOnTheSameFoldersServesOnlyCorrectBytes) {
  DaemonConfig cfg;
  cfg.extra = "";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  const auto desc = SmallContract();
  std::vector<kvtier_key> keys{{21, 1}, {22, 2}};
  {
    kvtier_client* c = Connect(d.socket(), "w");
    ASSERT_NE(c, nullptr);
    uint64_t cid = 0;
    ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
    ASSERT_EQ(StoreChain(c, cid, keys), 0);
    kvtier_close(c);
  }
  // Flushing is the tiers' business; what the daemon guarantees is a clean shutdown and
  // a restart on the same folders. Whatever is served afterwards must be the right bytes.
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = Connect(d.socket(), "r");
  ASSERT_NE(c, nullptr);
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  kvtier_lookup_result lr{};
  ASSERT_EQ(kvtier_lookup(c, cid, keys.data(), keys.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(AcquireAndCheck(c, cid, keys, lr.hit_blocks), 0);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// NVMe admission in a running kvtierd: a chain R used twice, a chain S used once, then a
// flood F of single-use chains pushes them out of the host tier. A write budget of far
// more than all of it (so the budget itself refuses nothing): always writes every demoted
// block; reuse writes R (used twice), refuses S and F by its pace rule (the day's spent
// share is ahead of its elapsed share), and writes S when it is offered a second time;
// reuse with no budget writes every block, as always does (second-hit would not).
struct AdmissionCase {
  const char* admission;
  const char* budget;
  bool refuses_first_offers;
};
void PrintTo(const AdmissionCase& c, std::ostream* os) { *os << c.admission << ", budget " << c.budget; }

class DaemonAdmission : public ::testing::TestWithParam<AdmissionCase> {
 protected:
  // Stores `keys` as one chain, waiting for host slots while demotions run.
  static int Store(kvtier_client* c, uint64_t cid, const std::vector<kvtier_key>& keys) {
    uint64_t lease = 0;
    std::vector<kvtier_slot> slots(keys.size());
    CHILD_CHECK(kvtier_alloc_wait(c, cid, keys.size(), KVTIER_TIER_HOST, 5000, &lease, slots.data()) == KVTIER_OK);
    uint64_t arena_bytes = 0;
    auto* arena = static_cast<uint8_t*>(kvtier_host_arena(c, &arena_bytes));
    const uint64_t sb = kvtier_slot_bytes(c);
    std::vector<kvtier_commit_item> items(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      FillBlock(arena + slots[i].slot * sb, kBlockBytes, cid, keys[i]);
      items[i] = {slots[i], keys[i], i == 0 ? kvtier_key{0, 0} : keys[i - 1]};
    }
    size_t done = 0;
    CHILD_CHECK(kvtier_commit(c, cid, lease, items.data(), items.size(), &done) == KVTIER_OK);
    CHILD_CHECK(done == keys.size());
    CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
    return 0;
  }
  static std::vector<kvtier_key> Chain(uint64_t base, size_t n) {
    std::vector<kvtier_key> k(n);
    for (size_t i = 0; i < n; ++i) k[i] = kvtier_key{base + i, base ^ 0x5a5a};
    return k;
  }
  // How many of `keys` the tier `t` holds (each looked up alone).
  static size_t CountIn(kvtier_client* c, uint64_t cid, const std::vector<kvtier_key>& keys, uint8_t t) {
    size_t n = 0;
    for (const kvtier_key& k : keys) {
      kvtier_lookup_result lr{};
      uint8_t tier = KVTIER_TIER_NONE;
      if (kvtier_lookup(c, cid, &k, 1, &lr, &tier) == KVTIER_OK && lr.hit_blocks == 1 && tier == t) ++n;
    }
    return n;
  }
  // Waits until the NVMe tier's blocks and refusals and the host tier's evictions stop
  // changing (the mover has written or refused every demotion).
  static void WaitQuiet(const DaemonProcess& d) {
    std::string last;
    int same = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (same < 10 && std::chrono::steady_clock::now() < deadline) {
      const std::string m = d.Metrics();
      std::string now;
      for (const char* s : {"kvtier_tier_blocks{tier=\"nvme\"}", "kvtier_tier_admission_rejects_total{tier=\"nvme\"}",
                            "kvtier_tier_evictions_total{tier=\"host\",reason=\"demoted\"}",
                            "kvtier_tier_evictions_total{tier=\"host\",reason=\"dropped\"}"}) {
        now += std::to_string(MetricValue(m, s)) + " ";
      }
      same = now == last ? same + 1 : 0;
      last = now;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
};

TEST_P(DaemonAdmission, ReuseTakesLikelyBlocksAndRefusesFirstOffersAheadOfThePace) {
  const AdmissionCase& p = GetParam();
  DaemonConfig cfg;
  cfg.nvme_capacity = "8MiB";  // holds every block: NVMe evicts nothing
  cfg.extra = std::string("admission = \"") + p.admission + "\"\ndaily_write_budget = \"" + p.budget + "\"\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  const auto desc = SmallContract();
  kvtier_client* c = Connect(d.socket(), "admission");
  ASSERT_NE(c, nullptr);
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
  const auto r = Chain(1000, 8), s = Chain(2000, 8);
  ASSERT_EQ(Store(c, cid, r), 0);
  ASSERT_EQ(AcquireAndCheck(c, cid, r, 8), 0);  // R: used twice
  ASSERT_EQ(Store(c, cid, s), 0);
  std::vector<kvtier_key> flood;
  for (uint64_t k = 0; k < 12; ++k) {  // 96 blocks into a host tier of 64
    const auto f = Chain(10000 + 100 * k, 8);
    ASSERT_EQ(Store(c, cid, f), 0);
    if (k < 2) flood.insert(flood.end(), f.begin(), f.end());  // the first out
  }
  WaitQuiet(d);
  const std::string m = d.Metrics();
  const double rejects = MetricValue(m, "kvtier_tier_admission_rejects_total{tier=\"nvme\"}");
  EXPECT_EQ(CountIn(c, cid, r, KVTIER_TIER_NVME), 8u) << m << d.log();
  if (p.refuses_first_offers) {
    EXPECT_EQ(CountIn(c, cid, s, KVTIER_TIER_NVME), 0u) << m;
    EXPECT_EQ(CountIn(c, cid, s, KVTIER_TIER_HOST), 0u) << "S was demoted and refused";
    EXPECT_EQ(CountIn(c, cid, flood, KVTIER_TIER_NVME), 0u) << m;
    EXPECT_GE(rejects, 8 + 16) << m;
    EXPECT_LT(MetricValue(m, "kvtier_tier_bytes_written_total{tier=\"nvme\"}"), 32 * 1024 * 1024)
        << "the refusals are the rule's, not the budget's";
    // Offered a second time, S is written.
    ASSERT_EQ(Store(c, cid, s), 0);
    for (uint64_t k = 0; k < 12; ++k) ASSERT_EQ(Store(c, cid, Chain(20000 + 100 * k, 8)), 0);
    WaitQuiet(d);
    EXPECT_EQ(CountIn(c, cid, s, KVTIER_TIER_NVME), 8u) << d.Metrics();
    EXPECT_EQ(AcquireAndCheck(c, cid, s, 8), 0);  // and served with its bytes
  } else {
    EXPECT_EQ(CountIn(c, cid, s, KVTIER_TIER_NVME), 8u) << m;
    EXPECT_EQ(CountIn(c, cid, flood, KVTIER_TIER_NVME), flood.size()) << m;
    EXPECT_EQ(rejects, 0) << m;
  }
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

INSTANTIATE_TEST_SUITE_P(Modes, DaemonAdmission,
                         ::testing::Values(AdmissionCase{"always", "32MiB", false},
                                           AdmissionCase{"reuse", "0", false},
                                           AdmissionCase{"reuse", "32MiB", true}),
                         [](const ::testing::TestParamInfo<AdmissionCase>& i) {
                           return std::string(i.param.admission) + (i.param.budget[0] == '0' ? "NoBudget" : "Budget");
                         });

}  // namespace
}  // namespace kvtier::testing

namespace kvtier::testing {
namespace {

// The threads of process `pid` named `comm`, each with its nice value (/proc/PID/task).
std::vector<int> NiceOfThreadsNamed(pid_t pid, const std::string& comm) {
  std::vector<int> nices;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& t : std::filesystem::directory_iterator(task)) {
    std::ifstream c(t.path() / "comm");
    std::string name;
    std::getline(c, name);
    if (name != comm) continue;
    std::ifstream s(t.path() / "stat");
    const std::string stat((std::istreambuf_iterator<char>(s)), std::istreambuf_iterator<char>());
    std::istringstream f(stat.substr(stat.rfind(')') + 2));
    std::string tok;
    for (int field = 3; f >> tok; ++field) {
      if (field == 19) {  // nice
        nices.push_back(std::stoi(tok));
        break;
      }
    }
  }
  return nices;
}

// Acquires and releases of more than 1,024 blocks, blocking and asynchronous, on the shipped
// default (daemon.bulk_nice = 10) and with bulk_nice = 0: the same blocks with the same
// bytes either way, every pin given back; with 10 the steps run on a thread of the
// client's own named kvtier-bulk at the daemon's nice value plus 10, counted in
// kvtier_bulk_requests_total; with 0 there is no such thread.
class DaemonBulk : public ::testing::TestWithParam<int> {};

TEST_P(DaemonBulk, BigAcquiresAndReleasesServeTheRightBytesOnTheBulkThread) {
  const int bulk_nice = GetParam();
  DaemonConfig cfg;
  cfg.host_capacity = "16MiB";  // 4096 slots of 4 KiB: the chain stays under the watermarks
  cfg.daemon_extra = "max_tier_share_per_client = 1.0\n" +
                     (bulk_nice >= 0 ? "bulk_nice = " + std::to_string(bulk_nice) + "\n" : std::string());
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  const auto desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  constexpr size_t kBlocks = 2000;  // 7 steps of 256 and one of 208: 4 in place, 4 on the bulk thread
  const auto tokens = Tokens(16 * kBlocks, 7);
  std::vector<kvtier_key> keys(kBlocks);
  size_t nk = 0;
  ASSERT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), keys.size(), &nk), KVTIER_OK);
  ASSERT_EQ(nk, kBlocks);
  kvtier_client* c = Connect(d.socket(), "bulk");
  ASSERT_NE(c, nullptr);
  uint64_t id = 0;
  ASSERT_EQ(kvtier_register_contract(c, &desc, &id), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(StoreChain(c, cid, keys), 0) << d.log();
  for (int rep = 0; rep < 3; ++rep) ASSERT_EQ(AcquireAndCheck(c, cid, keys, kBlocks), 0) << d.log();

  // Asynchronously, in steps of 100 blocks: the same bytes as a blocking acquire.
  kvtier_acquire_op* op = nullptr;
  ASSERT_EQ(kvtier_acquire_async(c, cid, keys.data(), kBlocks, KVTIER_TIER_HOST, 100, &op), KVTIER_OK)
      << kvtier_last_error();
  uint64_t lease = 0;
  size_t n = 0;
  std::vector<kvtier_slot> slots(kBlocks);
  ASSERT_EQ(kvtier_acquire_async_result(op, &lease, slots.data(), &n), KVTIER_OK) << kvtier_last_error();
  kvtier_acquire_async_free(op);
  ASSERT_EQ(n, kBlocks);
  uint64_t arena_bytes = 0;
  auto* arena = static_cast<const uint8_t*>(kvtier_host_arena(c, &arena_bytes));
  const uint64_t sb = kvtier_slot_bytes(c);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(slots[i].tier, KVTIER_TIER_HOST);
    ASSERT_TRUE(CheckBlock(arena + slots[i].slot * sb, kBlockBytes, cid, keys[i])) << "block " << i;
  }

  // While the client is attached, its bulk thread is there (with bulk_nice > 0).
  errno = 0;
  const int daemon_nice = ::getpriority(PRIO_PROCESS, static_cast<id_t>(d.pid()));
  ASSERT_EQ(errno, 0);
  const std::vector<int> bulk_threads = NiceOfThreadsNamed(d.pid(), "kvtier-bulk");
  if (bulk_nice == 0) {
    EXPECT_TRUE(bulk_threads.empty());
  } else {
    const int want = std::min(daemon_nice + (bulk_nice < 0 ? 10 : bulk_nice), 19);
    EXPECT_EQ(bulk_threads, std::vector<int>{want});
  }
  ASSERT_EQ(kvtier_release(c, lease), KVTIER_OK) << kvtier_last_error();

  // Through the socket: the same bytes, every step in place on the daemon's io thread,
  // which never waits for another thread (nothing more on the bulk thread).
  ASSERT_EQ(kvtier_set_transport(c, KVTIER_TRANSPORT_SOCKET), KVTIER_OK);
  ASSERT_EQ(AcquireAndCheck(c, cid, keys, kBlocks), 0) << d.log();
  ASSERT_EQ(kvtier_set_transport(c, KVTIER_TRANSPORT_RING), KVTIER_OK);

  // The store's release, three blocking acquires, one asynchronous, and their releases.
  const std::string m = d.Metrics();
  EXPECT_EQ(MetricValue(m, "kvtier_bulk_requests_total"), bulk_nice == 0 ? 0 : 9) << m;
  EXPECT_LE(MetricValue(m, "kvtier_bulk_takeovers_total"), MetricValue(m, "kvtier_bulk_requests_total"));
  EXPECT_EQ(MetricValue(m, "kvtier_leases"), 0) << m;
  EXPECT_EQ(MetricValue(m, "kvtier_tier_pinned_blocks{tier=\"host\"}"), 0) << m;
  EXPECT_EQ(MetricValue(m, "kvtier_tier_blocks{tier=\"host\"}"), kBlocks) << m;
  // A lease of the whole chain left held at disconnect is released by the daemon.
  ASSERT_EQ(kvtier_acquire(c, cid, keys.data(), kBlocks, KVTIER_TIER_HOST, &lease, slots.data(), &n), KVTIER_OK);
  ASSERT_EQ(n, kBlocks);
  kvtier_close(c);
  EXPECT_EQ(d.WaitMetric("kvtier_tier_pinned_blocks{tier=\"host\"}", 0), 0) << d.log();
  EXPECT_EQ(d.WaitMetric("kvtier_clients", 0), 0);
  // The session goes (and its thread with it) once its leases are released.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!NiceOfThreadsNamed(d.pid(), "kvtier-bulk").empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(NiceOfThreadsNamed(d.pid(), "kvtier-bulk").empty()) << "the bulk thread outlived its client";
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// -1: the shipped default (no bulk_nice key).
INSTANTIATE_TEST_SUITE_P(Nice, DaemonBulk, ::testing::Values(-1, 0, 19),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return p.param < 0 ? std::string("Default") : "Nice" + std::to_string(p.param);
                         });

}  // namespace
}  // namespace kvtier::testing
