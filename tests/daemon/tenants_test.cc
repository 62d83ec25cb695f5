// Peer credentials, admin rights, tenant namespaces and quotas, with clients as real
// processes under other uids: the test runs as root (CI does) and forks children that
// drop to uids and gids of their own (setgroups, setgid, setuid) before they attach, so
// the daemon sees them through SO_PEERCRED as it would see another user's engine.
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "formats/contract.h"
#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlockBytes = 576;  // SmallContract(): 2 layers x 288 bytes
// uids / gids the children take. Nothing needs them in /etc/passwd: the kernel takes any.
constexpr uint32_t kUidA = 64001, kUidB = 64002, kUidC = 64003;
constexpr uint32_t kGidA = 64101, kGidB = 64102, kGidC = 64103;

#define SKIP_UNLESS_ROOT()                                                          \
  do {                                                                              \
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients under other uids"; \
  } while (0)

// In a child: becomes uid/gid (with `extra` as its supplementary groups). False on failure.
bool BecomeUser(uint32_t uid, uint32_t gid, const std::vector<gid_t>& extra = {}) {
  return ::setgroups(extra.size(), extra.data()) == 0 && ::setgid(gid) == 0 && ::setuid(uid) == 0;
}

kvtier_client* Connect(const std::string& sock, const char* name, kvtier_status* st = nullptr) {
  kvtier_connect_options o{};
  o.name = name;
  o.timeout_ms = 10000;
  kvtier_client* c = nullptr;
  const kvtier_status s = kvtier_connect(sock.c_str(), &o, &c);
  if (st) *st = s;
  return s == KVTIER_OK ? c : nullptr;
}

std::vector<kvtier_key> Chain(uint64_t contract, size_t n, uint32_t seed) {
  std::vector<uint32_t> tokens(n * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = seed * 100003u + static_cast<uint32_t>(i) * 7919u;
  std::vector<kvtier_key> keys(n);
  size_t got = 0;
  if (kvtier_key_chain(contract, tokens.data(), tokens.size(), 16, keys.data(), n, &got) != KVTIER_OK || got != n) {
    return {};
  }
  return keys;
}

int StoreChain(kvtier_client* c, uint64_t contract, const std::vector<kvtier_key>& keys) {
  uint64_t lease = 0;
  std::vector<kvtier_slot> slots(keys.size());
  // Waits out passing pressure (RETRY: another tenant's blocks being demoted), as an engine does.
  CHILD_CHECK(kvtier_alloc_wait(c, contract, keys.size(), KVTIER_TIER_HOST, 5000, &lease, slots.data()) == KVTIER_OK);
  CHILD_CHECK(kvtier_host_arena(c, nullptr) != nullptr);
  std::vector<kvtier_commit_item> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c, slots[i].slot)), kBlockBytes, contract, keys[i]);
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

size_t Hits(kvtier_client* c, uint64_t contract, const std::vector<kvtier_key>& keys) {
  kvtier_lookup_result r{};
  if (kvtier_lookup(c, contract, keys.data(), keys.size(), &r, nullptr) != KVTIER_OK) return SIZE_MAX;
  return r.hit_blocks;
}

size_t CountLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

DaemonConfig Config(const std::string& extra) {
  DaemonConfig c;
  c.extra = extra;
  return c;
}

// The socket is opened to everyone (mode 0666) so that the kernel lets every uid connect
// and only the daemon's own checks decide.
const char* kOpenSocket = "[security]\nsocket_mode = \"0666\"\n";

// ---- peer credentials -------------------------------------------------------------------

TEST(PeerCredentials, AttachOfAnUnlistedUidIsRefusedWithOneLine) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(kOpenSocket));
  ASSERT_TRUE(d.Start()) << d.log();
  Child child([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_status st = KVTIER_OK;
    kvtier_client* c = Connect(d.socket(), "stranger", &st);
    CHILD_CHECK(c == nullptr);
    CHILD_CHECK(st == KVTIER_REJECTED);
    CHILD_CHECK(std::string(kvtier_last_error()).find("permission denied") != std::string::npos);
    CHILD_CHECK(std::string(kvtier_last_error()).find("uid 64001") != std::string::npos);
    return 0;
  });
  EXPECT_EQ(child.Wait(), 0) << d.log();
  // The daemon's own uid still attaches; the refusal left one log line and one count.
  kvtier_client* c = Connect(d.socket(), "owner");
  ASSERT_NE(c, nullptr) << kvtier_last_error();
  kvtier_close(c);
  EXPECT_EQ(d.WaitMetric("kvtier_access_denied_total", 1), 1);
  EXPECT_EQ(CountLines(d.log(), "attach refused: Rejected: permission denied: uid 64001"), 1u) << d.log();
  EXPECT_EQ(d.Stop(), 0);
}

TEST(PeerCredentials, AttachUidsAndGroupsAdmitEngines) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(std::string(kOpenSocket) + "attach_uids = [64001]\nattach_gids = [64103]\n"));
  ASSERT_TRUE(d.Start()) << d.log();
  auto attach_as = [&](uint32_t uid, uint32_t gid, std::vector<gid_t> extra, bool want) {
    Child child([&] {
      CHILD_CHECK(BecomeUser(uid, gid, extra));
      kvtier_client* c = Connect(d.socket(), "engine");
      CHILD_CHECK((c != nullptr) == want);
      if (c) kvtier_close(c);
      return 0;
    });
    return child.Wait();
  };
  EXPECT_EQ(attach_as(kUidA, kGidA, {}, true), 0);       // listed uid
  EXPECT_EQ(attach_as(kUidB, kGidC, {}, true), 0);       // listed primary group
  EXPECT_EQ(attach_as(kUidB, kGidB, {kGidC}, true), 0);  // listed supplementary group
  EXPECT_EQ(attach_as(kUidB, kGidB, {}, false), 0);      // neither
  EXPECT_EQ(d.Stop(), 0);
}

TEST(PeerCredentials, AdminActionsNeedAdminRightsAndChangeNothingWhenRefused) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(std::string(kOpenSocket) + "attach_uids = [64001, 64002]\nadmin_uids = [64002]\n"));
  ASSERT_TRUE(d.Start()) << d.log();
  // The daemon's own uid stores a chain.
  kvtier_client* owner = Connect(d.socket(), "owner");
  ASSERT_NE(owner, nullptr) << kvtier_last_error();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(owner, &desc, &cid), KVTIER_OK);
  const auto keys = Chain(cid, 4, 1);
  ASSERT_EQ(StoreChain(owner, cid, keys), 0);

  Child engine([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "engine");
    CHILD_CHECK(c != nullptr);
    // An engine: lookups work, every admin action is refused with one clear line.
    CHILD_CHECK(Hits(c, cid, keys) == keys.size());
    auto refused = [&](kvtier_status s) {
      return s == KVTIER_REJECTED && std::string(kvtier_last_error()).find("permission denied") != std::string::npos;
    };
    kvtier_block_info b[8];
    uint32_t n = 0;
    uint64_t total = 0;
    CHILD_CHECK(refused(kvtier_list_blocks(c, 0, KVTIER_TIER_NONE, 0, 8, b, &n, &total)));
    std::vector<uint8_t> buf(65536);
    size_t bytes = 0;
    CHILD_CHECK(refused(kvtier_list_contracts(c, 0, 16, buf.data(), buf.size(), &bytes, &n, &total)));
    CHILD_CHECK(refused(kvtier_inspect(c, cid, keys[0], b)));
    CHILD_CHECK(refused(kvtier_evict(c, cid, keys[3])));
    uint64_t ev = 0, sk = 0;
    CHILD_CHECK(refused(kvtier_evict_contract(c, cid, &ev, &sk)));
    CHILD_CHECK(refused(kvtier_flush(c)));
    char msg[256];
    CHILD_CHECK(refused(kvtier_reload_config(c, msg, sizeof msg)));
    // Nothing changed.
    CHILD_CHECK(Hits(c, cid, keys) == keys.size());
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(engine.Wait(), 0) << d.log();

  Child admin([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "operator");
    CHILD_CHECK(c != nullptr);
    kvtier_block_info b[8];
    uint32_t n = 0;
    uint64_t total = 0;
    CHILD_CHECK(kvtier_list_blocks(c, 0, KVTIER_TIER_NONE, 0, 8, b, &n, &total) == KVTIER_OK);
    CHILD_CHECK(total == keys.size());
    CHILD_CHECK(kvtier_evict(c, cid, keys[3]) == KVTIER_OK);
    kvtier_close(c);
    return 0;
  });
  const pid_t admin_pid = admin.pid();
  EXPECT_EQ(admin.Wait(), 0) << d.log();
  EXPECT_EQ(Hits(owner, cid, keys), 3u);
  kvtier_close(owner);
  const std::string log = d.log();
  // Refusals: one rate-limited line for the burst; the count has every one.
  EXPECT_EQ(d.WaitMetric("kvtier_access_denied_total", 7), 7);
  EXPECT_GE(CountLines(log, "audit: client"), 3u) << log;
  EXPECT_EQ(CountLines(log, ": refused: permission denied"), 1u) << log;
  // The operator's actions, with its uid and pid and what changed.
  EXPECT_NE(log.find("uid 64002 gid 64102 pid " + std::to_string(admin_pid)), std::string::npos) << log;
  EXPECT_NE(log.find("asked ls offset 0 limit 8: ok"), std::string::npos) << log;
  EXPECT_NE(log.find("asked evict contract " + std::string(ContractIdHex(cid)) + " key "), std::string::npos) << log;
  EXPECT_NE(log.find(": ok; evicted block "), std::string::npos) << log;
  EXPECT_EQ(d.Stop(), 0);
}

TEST(PeerCredentials, SocketOwnerGroupAndModeComeFromTheConfig) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config("[security]\nsocket_owner = \"64001\"\nsocket_group = \"64102\"\nsocket_mode = 0o640\n"));
  ASSERT_TRUE(d.Start()) << d.log();
  struct stat st{};
  ASSERT_EQ(::lstat(d.socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(st.st_uid, kUidA);
  EXPECT_EQ(st.st_gid, kGidB);
  EXPECT_EQ(d.Stop(), 0);
}

TEST(PeerCredentials, AnUnknownSocketOwnerStopsTheStart) {
  DaemonProcess d(Config("[security]\nsocket_owner = \"no-such-user-kvtier\"\n"));
  EXPECT_FALSE(d.Start());
  EXPECT_NE(d.log().find("security.socket_owner: no user \"no-such-user-kvtier\""), std::string::npos) << d.log();
}

// ---- tenants ------------------------------------------------------------------------------

// Two tenants, a (uid A) and b (uid B, a tenant admin), and the daemon's uid as operator.
std::string TwoTenants(const std::string& a_extra = "", const std::string& b_extra = "") {
  return std::string(kOpenSocket) + "attach_uids = [64003]\n" +
         "[[tenants]]\nname = \"a\"\nuids = [64001]\n" + a_extra +
         "[[tenants]]\nname = \"b\"\nuids = [64002]\nadmin = true\n" + b_extra;
}

// The operator's view of the TierManager's contract ids (namespaced ones included).
std::vector<uint64_t> InternalIds(kvtier_client* c) {
  std::vector<uint8_t> buf(1 << 16);
  size_t bytes = 0;
  uint32_t n = 0;
  uint64_t total = 0;
  std::vector<uint64_t> ids;
  if (kvtier_list_contracts(c, 0, 64, buf.data(), buf.size(), &bytes, &n, &total) != KVTIER_OK) return ids;
  size_t pos = 0;
  for (uint32_t i = 0; i < n; ++i) {
    kvtier_contract_info ci;
    std::memcpy(&ci, buf.data() + pos, sizeof ci);
    ids.push_back(ci.contract_id);
    pos += sizeof ci + (ci.contract_bytes + 7) / 8 * 8;
  }
  return ids;
}

const kvtier_tenant_counters* Find(const std::vector<kvtier_tenant_counters>& v, const char* name) {
  for (const auto& t : v) {
    if (std::string(t.name) == name) return &t;
  }
  return nullptr;
}

std::vector<kvtier_tenant_counters> TenantStats(kvtier_client* c) {
  std::vector<kvtier_tenant_counters> v(16);
  size_t n = 0;
  if (kvtier_tenant_stats(c, v.data(), v.size(), &n) != KVTIER_OK) n = 0;
  v.resize(n);
  return v;
}

TEST(Tenants, TheSameBlockUnderTwoTenantsIsTwoBlocksAndNeverACrossHit) {
  SKIP_UNLESS_ROOT();
  DaemonConfig cfg = Config(TwoTenants());
  cfg.daemon_extra = "metrics_tenants = true\n";  // the per-tenant series checked at the end
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  const auto keys = Chain(cid, 6, 7);
  Child a([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(id == cid);  // a tenant's clients keep their own ids
    CHILD_CHECK(StoreChain(c, cid, keys) == 0);
    CHILD_CHECK(Hits(c, cid, keys) == keys.size());
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(a.Wait(), 0) << d.log();
  // The operator (daemon's uid) sees a's contract under its namespaced id only.
  kvtier_client* op = Connect(d.socket(), "operator");
  ASSERT_NE(op, nullptr);
  const auto internal = InternalIds(op);
  ASSERT_EQ(internal.size(), 1u);
  EXPECT_NE(internal[0], cid);
  // An operator may name it by that id (to export it); the implicit tenant's engines
  // (uid C) miss a's blocks under the public id and under a's internal id alike.
  EXPECT_EQ(Hits(op, internal[0], keys), keys.size());
  Child c([&] {
    CHILD_CHECK(BecomeUser(kUidC, kGidC));
    kvtier_client* cl = Connect(d.socket(), "c");
    CHILD_CHECK(cl != nullptr);
    CHILD_CHECK(Hits(cl, internal[0], keys) == SIZE_MAX);
    CHILD_CHECK(std::string(kvtier_last_error()).find("is not registered") != std::string::npos);
    uint64_t mine = 0;
    CHILD_CHECK(kvtier_register_contract(cl, &desc, &mine) == KVTIER_OK);
    CHILD_CHECK(Hits(cl, cid, keys) == 0);
    kvtier_close(cl);
    return 0;
  });
  ASSERT_EQ(c.Wait(), 0) << d.log();
  Child b([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    // Same model, same prompt: a miss, for lookup, acquire and prefetch alike.
    CHILD_CHECK(Hits(c, cid, keys) == 0);
    uint64_t lease = 0;
    size_t n = 9;
    std::vector<kvtier_slot> slots(keys.size());
    CHILD_CHECK(kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) ==
                KVTIER_OK);
    CHILD_CHECK(n == 0 && lease == 0);
    CHILD_CHECK(kvtier_prefetch(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST) == KVTIER_OK);
    // a's TierManager id is not b's to name either.
    CHILD_CHECK(Hits(c, internal[0], keys) == SIZE_MAX);
    // b stores the same chain: its own two... six blocks, next to a's.
    CHILD_CHECK(StoreChain(c, cid, keys) == 0);
    CHILD_CHECK(Hits(c, cid, keys) == keys.size());
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(b.Wait(), 0) << d.log();
  kvtier_block_info blocks[64];
  uint32_t n = 0;
  uint64_t total = 0;
  ASSERT_EQ(kvtier_list_blocks(op, 0, KVTIER_TIER_NONE, 0, 64, blocks, &n, &total), KVTIER_OK);
  EXPECT_EQ(total, 2 * keys.size());  // a's six and b's six: two namespaces, two sets of blocks
  const auto ts = TenantStats(op);
  ASSERT_EQ(ts.size(), 4u);  // default, a, b, shared
  ASSERT_NE(Find(ts, "a"), nullptr);
  ASSERT_NE(Find(ts, "b"), nullptr);
  EXPECT_EQ(Find(ts, "a")->blocks[1], keys.size());
  EXPECT_EQ(Find(ts, "b")->blocks[1], keys.size());
  EXPECT_EQ(Find(ts, "b")->lookup_hits, keys.size());  // its own, after storing: none of a's
  EXPECT_EQ(Find(ts, "b")->lookup_keys, 2 * keys.size());
  EXPECT_EQ(Find(ts, "default")->lookup_hits, keys.size());  // the operator's lookup; c's found nothing
  kvtier_close(op);
  const std::string m = d.Metrics();
  EXPECT_EQ(MetricValue(m, "kvtier_tenant_blocks{tenant=\"a\",tier=\"host\"}"), keys.size()) << m;
  EXPECT_EQ(MetricValue(m, "kvtier_tenant_lookup_hits_total{tenant=\"b\"}"), keys.size()) << m;
  EXPECT_EQ(d.Stop(), 0);
}

// Where `needle` occurs in memory this process shares with others: every readable
// MAP_SHARED mapping (/proc/self/maps, 's') and every fd that mmap can map read-only (an fd
// the daemon sent and the client never mapped counts too). Not its private memory, where
// the test itself holds the needle. One line per place found.
std::string FindInSharedMemory(const std::vector<uint8_t>& needle) {
  std::string found;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    unsigned long lo = 0, hi = 0;
    char perms[5] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %4s", &lo, &hi, perms) != 3) continue;
    if (perms[0] != 'r' || perms[3] != 's') continue;
    if (::memmem(reinterpret_cast<const void*>(lo), hi - lo, needle.data(), needle.size()) != nullptr) {
      found += "mapping " + line + "\n";
    }
  }
  std::vector<int> fds;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    fds.push_back(std::atoi(e.path().filename().c_str()));
  }
  for (int fd : fds) {
    struct stat st{};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) continue;
    void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) continue;
    if (::memmem(p, static_cast<size_t>(st.st_size), needle.data(), needle.size()) != nullptr) {
      found += "fd " + std::to_string(fd) + "\n";
    }
    ::munmap(p, static_cast<size_t>(st.st_size));
  }
  return found;
}

TEST(Tenants, ATenantCanReadNoOtherTenantsBlockBytesByAnyMapping) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(TwoTenants()));
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  const auto a_keys = Chain(cid, 4, 11);
  const auto b_keys = Chain(cid, 4, 12);
  // a stores its blocks and stays attached, holding them acquired (in host, pinned).
  int go[2], ready[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(ready), 0);
  Child a([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(StoreChain(c, cid, a_keys) == 0);
    uint64_t lease = 0;
    size_t n = 0;
    std::vector<kvtier_slot> slots(a_keys.size());
    CHILD_CHECK(kvtier_acquire(c, cid, a_keys.data(), a_keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) ==
                KVTIER_OK);
    CHILD_CHECK(n == a_keys.size());
    for (size_t i = 0; i < n; ++i) {  // a reads its own blocks (copies of them)
      CHILD_CHECK(CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, slots[i].slot)), kBlockBytes, cid,
                             a_keys[i]));
    }
    // The same through an asynchronous acquire in steps of one block, a key named twice:
    // copies too, one per block.
    std::vector<kvtier_key> twice = a_keys;
    twice.push_back(a_keys[0]);
    kvtier_acquire_op* op = nullptr;
    CHILD_CHECK(kvtier_acquire_async(c, cid, twice.data(), twice.size(), KVTIER_TIER_HOST, 1, &op) == KVTIER_OK);
    uint64_t lease2 = 0;
    size_t n2 = 0;
    std::vector<kvtier_slot> slots2(twice.size());
    CHILD_CHECK(kvtier_acquire_async_result(op, &lease2, slots2.data(), &n2) == KVTIER_OK);
    kvtier_acquire_async_free(op);
    CHILD_CHECK(n2 == twice.size());
    CHILD_CHECK(slots2[a_keys.size()].slot == slots2[0].slot);
    for (size_t i = 0; i < n2; ++i) {
      CHILD_CHECK(slots2[i].slot != slots[i % a_keys.size()].slot);  // a copy of its own for this lease
      CHILD_CHECK(CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, slots2[i].slot)), kBlockBytes, cid,
                             twice[i]));
    }
    CHILD_CHECK(kvtier_release(c, lease2) == KVTIER_OK);
    CHILD_CHECK(::write(ready[1], "r", 1) == 1);
    char ch = 0;
    CHILD_CHECK(::read(go[0], &ch, 1) == 1);  // until b has looked
    kvtier_close(c);
    return 0;
  });
  char ch = 0;
  ASSERT_EQ(::read(ready[0], &ch, 1), 1) << d.log();
  Child b([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(StoreChain(c, cid, b_keys) == 0);
    uint64_t lease = 0;
    size_t n = 0;
    std::vector<kvtier_slot> slots(b_keys.size());
    CHILD_CHECK(kvtier_acquire(c, cid, b_keys.data(), b_keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) ==
                KVTIER_OK);
    CHILD_CHECK(n == b_keys.size());
    std::vector<uint8_t> block(kBlockBytes);
    // The scan finds what b may read: its own blocks' bytes (in its staging area).
    for (size_t i = 0; i < n; ++i) {
      CHILD_CHECK(CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, slots[i].slot)), kBlockBytes, cid,
                             b_keys[i]));
      FillBlock(block.data(), block.size(), cid, b_keys[i]);
      CHILD_CHECK(!FindInSharedMemory(block).empty());
    }
    // And none of a's, by any mapping or fd it has.
    for (const auto& k : a_keys) {
      FillBlock(block.data(), block.size(), cid, k);
      const std::string where = FindInSharedMemory(block);
      if (!where.empty()) std::fprintf(stderr, "b finds a block of a's in:\n%s", where.c_str());
      CHILD_CHECK(where.empty());
    }
    // No arena fd and no arena mapping: an arena slot id reads as nothing.
    CHILD_CHECK(kvtier_host_arena_fd(c) == -1);
    CHILD_CHECK(kvtier_host_slot(c, 0) == nullptr);
    CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
    kvtier_close(c);
    return 0;
  });
  const int b_rc = b.Wait();
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  EXPECT_EQ(a.Wait(), 0) << d.log();
  EXPECT_EQ(b_rc, 0) << d.log();
  for (int fd : {go[0], go[1], ready[0], ready[1]}) ::close(fd);
}

// With host shares each tenant owns a part of the host tier (tiers.host.tenant_parts): a
// memfd its clients map read-only, holding its blocks only. A host acquire of a block
// there answers the arena slot (read in place, no copy); a block in the common pool (a
// tenant over its share borrows there) is copied into the staging area as before. No
// mapping or fd of b's shows a's bytes, and a's part reads as unmapped to b.
TEST(Tenants, ATenantReadsItsOwnPartInPlaceAndNoOtherTenantsBytes) {
  SKIP_UNLESS_ROOT();
  // 64 host slots of 4 KiB: a's part 32 (ids 0..31), b's 16 (32..47), the common pool 16.
  DaemonProcess d(Config(TwoTenants("host_share = 0.5\n", "host_share = 0.25\n")));
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  const auto a_keys = Chain(cid, 4, 31);
  const auto b_keys = Chain(cid, 24, 32);  // over b's 16: 8 or more in the common pool
  constexpr uint32_t kArenaSlots = 64;
  int go[2], ready[2];
  ASSERT_EQ(::pipe(go), 0);
  ASSERT_EQ(::pipe(ready), 0);
  Child a([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    int fd = -1;
    uint64_t off = 1, bytes = 0;
    CHILD_CHECK(kvtier_host_parts(c, 0, &fd, &off, &bytes) == 1);
    CHILD_CHECK(fd >= 0 && off == 0 && bytes == 32 * 4096);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(StoreChain(c, cid, a_keys) == 0);
    uint64_t lease = 0;
    size_t n = 0;
    std::vector<kvtier_slot> slots(a_keys.size());
    CHILD_CHECK(kvtier_acquire(c, cid, a_keys.data(), a_keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) ==
                KVTIER_OK);
    CHILD_CHECK(n == a_keys.size());
    for (size_t i = 0; i < n; ++i) {
      CHILD_CHECK(slots[i].slot < 32);  // the arena slot in a's part: no copy
      CHILD_CHECK(CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, slots[i].slot)), kBlockBytes, cid,
                             a_keys[i]));
    }
    CHILD_CHECK(kvtier_host_slot(c, 40) == nullptr);  // b's part
    CHILD_CHECK(kvtier_host_slot(c, 60) == nullptr);  // the common pool
    CHILD_CHECK(::write(ready[1], "r", 1) == 1);
    char ch = 0;
    CHILD_CHECK(::read(go[0], &ch, 1) == 1);  // until b has looked
    CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
    kvtier_close(c);
    return 0;
  });
  char ch = 0;
  ASSERT_EQ(::read(ready[0], &ch, 1), 1) << d.log();
  Child b([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    uint64_t off = 0, bytes = 0;
    CHILD_CHECK(kvtier_host_parts(c, 0, nullptr, &off, &bytes) == 1);
    CHILD_CHECK(off == 32 * 4096 && bytes == 16 * 4096);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    for (size_t i = 0; i < b_keys.size(); i += 8) {
      CHILD_CHECK(StoreChain(c, cid, std::vector<kvtier_key>(b_keys.begin() + i, b_keys.begin() + i + 8)) == 0);
    }
    uint64_t lease = 0;
    size_t n = 0;
    std::vector<kvtier_slot> slots(b_keys.size());
    CHILD_CHECK(kvtier_acquire(c, cid, b_keys.data(), b_keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) ==
                KVTIER_OK);
    CHILD_CHECK(n == b_keys.size());
    size_t in_place = 0, copied = 0;
    std::vector<uint8_t> block(kBlockBytes);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t s = slots[i].slot;
      CHILD_CHECK((s >= 32 && s < 48) || s >= kArenaSlots);  // its part, or a copy in its staging area
      ++(s < kArenaSlots ? in_place : copied);
      CHILD_CHECK(CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, s)), kBlockBytes, cid, b_keys[i]));
      FillBlock(block.data(), block.size(), cid, b_keys[i]);
      CHILD_CHECK(!FindInSharedMemory(block).empty());
    }
    CHILD_CHECK(in_place == 16 && copied == 8);
    for (const auto& k : a_keys) {
      FillBlock(block.data(), block.size(), cid, k);
      const std::string where = FindInSharedMemory(block);
      if (!where.empty()) std::fprintf(stderr, "b finds a block of a's in:\n%s", where.c_str());
      CHILD_CHECK(where.empty());
    }
    CHILD_CHECK(kvtier_host_arena_fd(c) == -1);
    CHILD_CHECK(kvtier_host_slot(c, 0) == nullptr);  // a's part
    CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
    kvtier_close(c);
    return 0;
  });
  const int b_rc = b.Wait();
  ASSERT_EQ(::write(go[1], "g", 1), 1);
  EXPECT_EQ(a.Wait(), 0) << d.log();
  EXPECT_EQ(b_rc, 0) << d.log();
  for (int fd : {go[0], go[1], ready[0], ready[1]}) ::close(fd);
}

TEST(Tenants, AHostAcquireWhoseCopiesFindNoRoomIsRejected) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(TwoTenants()));
  ASSERT_TRUE(d.Start({"--set", "tiers.host.staging_slots_per_client=3"})) << d.log();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  Child a([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    const auto keys = Chain(cid, 2, 21);
    CHILD_CHECK(StoreChain(c, cid, keys) == 0);
    uint64_t lease = 0, lease2 = 0;
    size_t n = 0;
    std::vector<kvtier_slot> slots(keys.size());
    CHILD_CHECK(kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) ==
                KVTIER_OK);
    CHILD_CHECK(n == 2);
    // 1 staging slot left: the copies of 2 blocks do not fit, and nothing is pinned for them.
    const kvtier_status s = kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease2,
                                           slots.data(), &n);
    CHILD_CHECK(s == KVTIER_REJECTED);
    CHILD_CHECK(std::string(kvtier_last_error()).find("staging_slots_per_client") != std::string::npos);
    CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
    // Released: the copies' slots are free again.
    CHILD_CHECK(kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease2, slots.data(), &n) ==
                KVTIER_OK);
    CHILD_CHECK(n == 2);
    CHILD_CHECK(kvtier_release(c, lease2) == KVTIER_OK);
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(a.Wait(), 0) << d.log();
}

TEST(Tenants, TheSharedNamespaceIsOneBlockForThoseWhoOptIn) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(TwoTenants()));
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  const uint64_t handle = SharedContractId(cid);
  ASSERT_NE(handle, cid);
  const auto shared_keys = Chain(handle, 4, 3);
  Child a([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t h = 0;
    CHILD_CHECK(kvtier_register_contract_shared(c, &desc, &h) == KVTIER_OK);
    CHILD_CHECK(h == handle);
    CHILD_CHECK(StoreChain(c, h, shared_keys) == 0);
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(a.Wait(), 0) << d.log();
  Child b([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    // Without opting in the handle names nothing of b's.
    CHILD_CHECK(Hits(c, handle, shared_keys) == SIZE_MAX);
    uint64_t h = 0;
    CHILD_CHECK(kvtier_register_contract_shared(c, &desc, &h) == KVTIER_OK);
    CHILD_CHECK(Hits(c, h, shared_keys) == shared_keys.size());  // a's blocks, read by b
    uint64_t lease = 0;
    size_t n = 0;
    std::vector<kvtier_slot> slots(shared_keys.size());
    CHILD_CHECK(kvtier_acquire(c, h, shared_keys.data(), shared_keys.size(), KVTIER_TIER_HOST, &lease, slots.data(),
                               &n) == KVTIER_OK);
    CHILD_CHECK(n == shared_keys.size());
    for (size_t i = 0; i < n; ++i) {
      CHILD_CHECK(CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, slots[i].slot)), kBlockBytes, h, shared_keys[i]));
    }
    CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
    // Its private namespace stays its own: the same contract, registered privately, is empty.
    uint64_t priv = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &priv) == KVTIER_OK);
    CHILD_CHECK(Hits(c, priv, Chain(priv, 4, 3)) == 0);
    // A tenant admin's listing never shows the shared pool (other tenants' prefixes).
    kvtier_block_info blocks[16];
    uint32_t nb = 0;
    uint64_t total = 9;
    CHILD_CHECK(kvtier_list_blocks(c, 0, KVTIER_TIER_NONE, 0, 16, blocks, &nb, &total) == KVTIER_OK);
    CHILD_CHECK(total == 0 && nb == 0);
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(b.Wait(), 0) << d.log();
  EXPECT_EQ(d.Stop(), 0);
}

// A tenant's contracts and the shared namespace's come back after a restart (flushed to
// NVMe) under the same ids, each with its blocks for the clients of its namespace only; a
// tenant's contract left unused is forgotten when its last client detaches, in
// contracts.kvc too, and does not come back.
TEST(Tenants, TenantContractsOutliveARestartAndUnusedOnesAreForgotten) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(TwoTenants()));
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  kvtier_contract_desc unused = SmallContract("tenants/unused");
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  const uint64_t handle = SharedContractId(cid);
  const auto keys = Chain(cid, 4, 11);
  const auto shared_keys = Chain(handle, 2, 12);
  Child a([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(StoreChain(c, cid, keys) == 0);
    CHILD_CHECK(kvtier_register_contract_shared(c, &desc, &id) == KVTIER_OK && id == handle);
    CHILD_CHECK(StoreChain(c, handle, shared_keys) == 0);
    CHILD_CHECK(kvtier_register_contract(c, &unused, &id) == KVTIER_OK);
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(a.Wait(), 0) << d.log();
  kvtier_client* op = Connect(d.socket(), "operator");
  ASSERT_NE(op, nullptr);
  std::vector<uint64_t> before = InternalIds(op);
  for (int i = 0; i < 100 && before.size() != 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    before = InternalIds(op);
  }
  ASSERT_EQ(before.size(), 2u) << "a's unused contract is still registered after a detached";
  ASSERT_EQ(kvtier_flush(op), KVTIER_OK);
  kvtier_close(op);
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start()) << d.log();
  op = Connect(d.socket(), "operator");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(InternalIds(op), before) << d.log();
  kvtier_close(op);
  Child a2([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(Hits(c, cid, keys) == keys.size());
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(a2.Wait(), 0) << d.log();
  Child b([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(Hits(c, cid, keys) == 0);  // a's blocks stay a's
    CHILD_CHECK(kvtier_register_contract_shared(c, &desc, &id) == KVTIER_OK && id == handle);
    CHILD_CHECK(Hits(c, handle, shared_keys) == shared_keys.size());
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(b.Wait(), 0) << d.log();
  EXPECT_EQ(d.Stop(), 0);
}

// A contract forgotten when its last client detaches leaves the owners' table with it:
// a tenant admin's listings walk that table, and a forgotten entry made its `ls`
// answer NOT_FOUND ("contract ... is not registered") for every later page.
TEST(Tenants, AForgottenContractLeavesTheTenantAdminsListings) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(TwoTenants()));
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  kvtier_contract_desc unused = SmallContract("tenants/forgotten");
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  const auto keys = Chain(cid, 3, 21);
  Child first([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &unused, &id) == KVTIER_OK);
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(first.Wait(), 0) << d.log();
  kvtier_client* op = Connect(d.socket(), "operator");
  ASSERT_NE(op, nullptr);
  for (int i = 0; i < 100 && !InternalIds(op).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(InternalIds(op).empty()) << "b's contract is still registered after its client detached";
  kvtier_close(op);
  Child second([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(StoreChain(c, cid, keys) == 0);
    kvtier_block_info blocks[8];
    uint32_t n = 0;
    uint64_t total = 0;
    CHILD_CHECK(kvtier_list_blocks(c, 0, KVTIER_TIER_NONE, 0, 8, blocks, &n, &total) == KVTIER_OK);
    CHILD_CHECK(total == keys.size() && n == keys.size());
    std::vector<uint8_t> buf(1 << 16);
    size_t bytes = 0;
    CHILD_CHECK(kvtier_list_contracts(c, 0, 16, buf.data(), buf.size(), &bytes, &n, &total) == KVTIER_OK);
    CHILD_CHECK(total == 1 && n == 1);
    // Registered again, the forgotten contract is b's again.
    CHILD_CHECK(kvtier_register_contract(c, &unused, &id) == KVTIER_OK);
    CHILD_CHECK(kvtier_list_contracts(c, 0, 16, buf.data(), buf.size(), &bytes, &n, &total) == KVTIER_OK);
    CHILD_CHECK(total == 2 && n == 2);
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(second.Wait(), 0) << d.log();
  EXPECT_EQ(d.Stop(), 0);
}

TEST(Tenants, ATenantAdminSeesAndEvictsOnlyItsOwnBlocks) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(Config(TwoTenants()));
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  const auto a_keys = Chain(cid, 5, 11);
  const auto b_keys = Chain(cid, 3, 12);
  Child a([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(StoreChain(c, cid, a_keys) == 0);
    // a is no admin: every admin action is refused, its own namespace or not.
    kvtier_block_info blocks[4];
    uint32_t n = 0;
    uint64_t total = 0;
    CHILD_CHECK(kvtier_list_blocks(c, 0, KVTIER_TIER_NONE, 0, 4, blocks, &n, &total) == KVTIER_REJECTED);
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(a.Wait(), 0) << d.log();
  Child b([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(StoreChain(c, cid, b_keys) == 0);
    kvtier_block_info blocks[16];
    uint32_t n = 0;
    uint64_t total = 0;
    // Listings: b's three blocks, under b's own contract id; paged alike.
    CHILD_CHECK(kvtier_list_blocks(c, 0, KVTIER_TIER_NONE, 0, 16, blocks, &n, &total) == KVTIER_OK);
    CHILD_CHECK(total == b_keys.size() && n == b_keys.size());
    for (uint32_t i = 0; i < n; ++i) CHILD_CHECK(blocks[i].contract_id == cid);
    CHILD_CHECK(kvtier_list_blocks(c, 0, KVTIER_TIER_NONE, 2, 16, blocks, &n, &total) == KVTIER_OK);
    CHILD_CHECK(total == b_keys.size() && n == 1);
    CHILD_CHECK(kvtier_list_blocks(c, cid, KVTIER_TIER_HOST, 0, 16, blocks, &n, &total) == KVTIER_OK);
    CHILD_CHECK(total == b_keys.size());
    std::vector<uint8_t> buf(1 << 16);
    size_t bytes = 0;
    CHILD_CHECK(kvtier_list_contracts(c, 0, 16, buf.data(), buf.size(), &bytes, &n, &total) == KVTIER_OK);
    CHILD_CHECK(total == 1 && n == 1);
    kvtier_contract_info ci;
    std::memcpy(&ci, buf.data(), sizeof ci);
    CHILD_CHECK(ci.contract_id == cid && ci.blocks[1] == b_keys.size());
    // a's keys: not cached, for inspect and evict, by any contract id.
    CHILD_CHECK(kvtier_inspect(c, 0, a_keys[0], blocks) == KVTIER_NOT_FOUND);
    CHILD_CHECK(kvtier_inspect(c, cid, a_keys[0], blocks) == KVTIER_NOT_FOUND);
    CHILD_CHECK(kvtier_evict(c, 0, a_keys[4]) == KVTIER_NOT_FOUND);
    CHILD_CHECK(kvtier_evict(c, cid, a_keys[4]) == KVTIER_NOT_FOUND);
    CHILD_CHECK(kvtier_inspect(c, 0, b_keys[0], blocks) == KVTIER_OK);
    CHILD_CHECK(blocks[0].contract_id == cid);
    // Evicting "the contract" evicts b's blocks only.
    uint64_t ev = 0, sk = 0;
    CHILD_CHECK(kvtier_evict_contract(c, cid, &ev, &sk) == KVTIER_OK);
    CHILD_CHECK(ev == b_keys.size());
    // Flush, verify and reload touch every tenant: operators only.
    CHILD_CHECK(kvtier_flush(c) == KVTIER_REJECTED);
    char msg[128];
    CHILD_CHECK(kvtier_reload_config(c, msg, sizeof msg) == KVTIER_REJECTED);
    // Its own counters, no one else's.
    kvtier_tenant_counters t[8];
    size_t nt = 0;
    CHILD_CHECK(kvtier_tenant_stats(c, t, 8, &nt) == KVTIER_OK);
    CHILD_CHECK(nt == 1 && std::string(t[0].name) == "b");
    // Tier statistics: the sizes and its own blocks, not the traffic of every tenant.
    kvtier_tier_stats st[8];
    size_t ns = 0;
    CHILD_CHECK(kvtier_stats(c, st, 8, &ns) == KVTIER_OK);
    for (size_t i = 0; i < ns; ++i) CHILD_CHECK(st[i].blocks == 0 && st[i].hits == 0 && st[i].misses == 0);
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(b.Wait(), 0) << d.log();
  // a's blocks are all there.
  Child a2([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(Hits(c, cid, a_keys) == a_keys.size());
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(a2.Wait(), 0) << d.log();
  EXPECT_NE(d.log().find("(own namespace): ok; evicted 3 blocks of contract"), std::string::npos) << d.log();
  EXPECT_EQ(d.Stop(), 0);
}

TEST(Tenants, UnmatchedClientsAreRefusedWhenTheConfigSaysSo) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d2(Config("[security]\nsocket_mode = \"0666\"\nunmatched = \"refuse\"\nattach_uids = [64003]\n"
                          "[[tenants]]\nname = \"a\"\nuids = [64001]\n"));
  ASSERT_TRUE(d2.Start()) << d2.log();
  auto attach_as = [&](uint32_t uid, bool want) {
    Child child([&] {
      CHILD_CHECK(BecomeUser(uid, uid));
      kvtier_status st = KVTIER_OK;
      kvtier_client* c = Connect(d2.socket(), "x", &st);
      CHILD_CHECK((c != nullptr) == want);
      if (!want) CHILD_CHECK(std::string(kvtier_last_error()).find("security.unmatched") != std::string::npos);
      if (c) kvtier_close(c);
      return 0;
    });
    return child.Wait();
  };
  EXPECT_EQ(attach_as(kUidA, true), 0);
  EXPECT_EQ(attach_as(kUidC, false), 0);  // listed in attach_uids, in no tenant
  EXPECT_EQ(d2.Stop(), 0);
}

// Tenant a holds blocks within its host share; tenant b (a small share) then writes far
// more than the tier holds. b's writes evict b's own blocks; a's stay in host.
int Flood(const std::string& sock, const kvtier_contract_desc& desc, uint64_t cid, int chains) {
  kvtier_client* c = Connect(sock, "flood");
  CHILD_CHECK(c != nullptr);
  uint64_t id = 0;
  CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
  for (int i = 0; i < chains; ++i) {
    const auto keys = Chain(cid, 4, 1000 + i);
    // Wait out Retry (demotions to NVMe in flight), then store as StoreChain does.
    bool stored = false;
    for (int tries = 0; tries < 1000 && !stored; ++tries) {
      uint64_t lease = 0;
      std::vector<kvtier_slot> slots(keys.size());
      const kvtier_status s = kvtier_alloc(c, cid, keys.size(), KVTIER_TIER_HOST, &lease, slots.data());
      if (s == KVTIER_RETRY) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      CHILD_CHECK(s == KVTIER_OK);
      std::vector<kvtier_commit_item> items(keys.size());
      for (size_t k = 0; k < keys.size(); ++k) {
        FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c, slots[k].slot)), kBlockBytes, cid, keys[k]);
        items[k] = {slots[k], keys[k], k == 0 ? kvtier_key{0, 0} : keys[k - 1]};
      }
      size_t done = 0;
      CHILD_CHECK(kvtier_commit(c, cid, lease, items.data(), items.size(), &done) == KVTIER_OK);
      CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
      stored = true;
    }
    CHILD_CHECK(stored);
  }
  kvtier_close(c);
  return 0;
}

void QuotaScenario(bool quotas, size_t* a_in_host, uint64_t* a_evictions, uint64_t* b_evictions) {
  // host: 64 slots. a: 24 blocks, share 0.5 (32 slots); b: share 0.25 (16 slots), writes 160.
  const std::string shares_a = quotas ? "host_share = 0.5\n" : "";
  const std::string shares_b = quotas ? "host_share = 0.25\n" : "";
  DaemonConfig cfg = Config(TwoTenants(shares_a, shares_b));
  cfg.nvme_capacity = "4MiB";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  std::vector<std::vector<kvtier_key>> a_chains;
  for (int i = 0; i < 6; ++i) a_chains.push_back(Chain(cid, 4, 50 + i));
  Child a([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    for (const auto& k : a_chains) CHILD_CHECK(StoreChain(c, cid, k) == 0);
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(a.Wait(), 0) << d.log();
  Child b([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    return Flood(d.socket(), desc, cid, 40);
  });
  ASSERT_EQ(b.Wait(), 0) << d.log();
  kvtier_client* op = Connect(d.socket(), "operator");
  ASSERT_NE(op, nullptr);
  const auto ts = TenantStats(op);
  kvtier_close(op);
  ASSERT_NE(Find(ts, "a"), nullptr);
  ASSERT_NE(Find(ts, "b"), nullptr);
  *a_in_host = Find(ts, "a")->blocks[1];
  *a_evictions = Find(ts, "a")->evictions[1];
  *b_evictions = Find(ts, "b")->evictions[1];
  if (quotas) {
    EXPECT_EQ(Find(ts, "a")->quota_slots[1], 32u);
    EXPECT_EQ(Find(ts, "b")->quota_slots[1], 16u);
  }
  EXPECT_EQ(d.Stop(), 0);
}

TEST(Tenants, ATenantOverItsShareEvictsItsOwnBlocksNotAnothersWithinItsShare) {
  SKIP_UNLESS_ROOT();
  size_t a_host = 0;
  uint64_t a_ev = 0, b_ev = 0;
  QuotaScenario(true, &a_host, &a_ev, &b_ev);
  EXPECT_EQ(a_host, 24u);
  EXPECT_EQ(a_ev, 0u);
  EXPECT_GE(b_ev, 100u);  // 160 written into 40 free slots
  // The same traffic without shares: b's flood pushes a out of host.
  QuotaScenario(false, &a_host, &a_ev, &b_ev);
  EXPECT_LT(a_host, 24u);
  EXPECT_GT(a_ev, 0u);
}

// Two tenants for a few seconds: a stores and reads its blocks; b, a tenant admin that
// knows every key of a's and a's namespaced contract id, tries every operation on them
// (lookup, acquire, asynchronous acquire, prefetch, alloc, inspect, evict, evict-contract,
// the block and contract listings, the counters, flush, verify, reload, and last a
// commit of a's keys with a's bytes) while flooding the host tier with its own. Zero
// cross-tenant hits, listings or evictions.
TEST(Tenants, SoakWithAHostileTenantFindsNothingOfTheOther) {
  SKIP_UNLESS_ROOT();
  DaemonConfig cfg = Config(TwoTenants("host_share = 0.5\n", "host_share = 0.25\n"));
  cfg.nvme_capacity = "4MiB";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_contract_desc desc = SmallContract();
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_contract_id(&desc, &cid), KVTIER_OK);
  std::vector<std::vector<kvtier_key>> a_chains;
  for (int i = 0; i < 8; ++i) a_chains.push_back(Chain(cid, 3, 300 + i));
  // a registers and stores its first chain; the operator learns a's namespaced id.
  Child first([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    CHILD_CHECK(StoreChain(c, cid, a_chains[0]) == 0);
    kvtier_close(c);
    return 0;
  });
  ASSERT_EQ(first.Wait(), 0) << d.log();
  kvtier_client* op = Connect(d.socket(), "operator");
  ASSERT_NE(op, nullptr);
  const auto internal = InternalIds(op);
  ASSERT_EQ(internal.size(), 1u);
  const uint64_t a_internal = internal[0];
  kvtier_close(op);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);

  Child victim([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    size_t stored = 1;
    while (std::chrono::steady_clock::now() < until) {
      if (stored < a_chains.size()) CHILD_CHECK(StoreChain(c, cid, a_chains[stored++]) == 0);
      for (size_t i = 0; i < stored; ++i) CHILD_CHECK(Hits(c, cid, a_chains[i]) == a_chains[i].size());
    }
    kvtier_close(c);
    return 0;
  });
  Child hostile([&] {
    CHILD_CHECK(BecomeUser(kUidB, kGidB));
    kvtier_client* c = Connect(d.socket(), "b");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    uint64_t cross_hits = 0, cross_listed = 0, cross_evicted = 0, own_stored = 0;
    int round = 0;
    while (std::chrono::steady_clock::now() < until) {
      for (const auto& keys : a_chains) {
        const size_t h = Hits(c, cid, keys);
        CHILD_CHECK(h != SIZE_MAX);
        cross_hits += h;
        CHILD_CHECK(Hits(c, a_internal, keys) == SIZE_MAX);  // a's id: "not registered"
        uint64_t lease = 0;
        size_t n = 0;
        std::vector<kvtier_slot> slots(keys.size());
        CHILD_CHECK(kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) ==
                    KVTIER_OK);
        cross_hits += n;
        if (lease != 0) (void)kvtier_release(c, lease);
        CHILD_CHECK(kvtier_acquire(c, a_internal, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(),
                                   &n) == KVTIER_NOT_FOUND);
        CHILD_CHECK(kvtier_prefetch(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST) == KVTIER_OK);
        CHILD_CHECK(kvtier_prefetch(c, a_internal, keys.data(), keys.size(), KVTIER_TIER_HOST) == KVTIER_NOT_FOUND);
        // The asynchronous acquire: a miss under b's id, "not registered" under a's.
        for (uint64_t named : {cid, a_internal}) {
          kvtier_acquire_op* op = nullptr;
          CHILD_CHECK(kvtier_acquire_async(c, named, keys.data(), keys.size(), KVTIER_TIER_HOST, 1, &op) == KVTIER_OK);
          const kvtier_status rs = kvtier_acquire_async_result(op, &lease, slots.data(), &n);
          CHILD_CHECK(rs == (named == cid ? KVTIER_OK : KVTIER_NOT_FOUND));
          cross_hits += n;
          if (lease != 0) (void)kvtier_release(c, lease);
          kvtier_acquire_async_free(op);
        }
        // No slot to write under a's id.
        CHILD_CHECK(kvtier_alloc(c, a_internal, 1, KVTIER_TIER_HOST, &lease, slots.data()) == KVTIER_NOT_FOUND);
        kvtier_block_info b;
        for (uint64_t named : {uint64_t{0}, cid, a_internal}) {
          if (kvtier_inspect(c, named, keys[0], &b) == KVTIER_OK) ++cross_listed;
          if (kvtier_evict(c, named, keys.back()) == KVTIER_OK) ++cross_evicted;
        }
        uint64_t ev = 0, sk = 0;
        CHILD_CHECK(kvtier_evict_contract(c, a_internal, &ev, &sk) == KVTIER_NOT_FOUND);
      }
      // Listings: only b's own blocks, which are never a's keys.
      std::vector<kvtier_block_info> page(256);
      uint32_t n = 0;
      uint64_t total = 0;
      CHILD_CHECK(kvtier_list_blocks(c, 0, KVTIER_TIER_NONE, 0, 256, page.data(), &n, &total) == KVTIER_OK);
      for (uint32_t i = 0; i < n; ++i) {
        for (const auto& keys : a_chains) {
          for (const auto& k : keys) {
            if (page[i].key.hi == k.hi && page[i].key.lo == k.lo) ++cross_listed;
          }
        }
      }
      CHILD_CHECK(kvtier_list_blocks(c, a_internal, KVTIER_TIER_NONE, 0, 256, page.data(), &n, &total) ==
                  KVTIER_NOT_FOUND);
      CHILD_CHECK(kvtier_list_blocks(c, cid, KVTIER_TIER_NONE, 0, 256, page.data(), &n, &total) == KVTIER_OK);
      for (uint32_t i = 0; i < n; ++i) {
        for (const auto& keys : a_chains) {
          for (const auto& k : keys) {
            if (page[i].key.hi == k.hi && page[i].key.lo == k.lo) ++cross_listed;
          }
        }
      }
      // Contracts: b's own, under b's id, counting b's blocks only.
      std::vector<uint8_t> buf(1 << 16);
      size_t bytes = 0;
      CHILD_CHECK(kvtier_list_contracts(c, 0, 16, buf.data(), buf.size(), &bytes, &n, &total) == KVTIER_OK);
      CHILD_CHECK(n == 1 && total == 1);
      kvtier_contract_info ci;
      std::memcpy(&ci, buf.data(), sizeof ci);
      CHILD_CHECK(ci.contract_id == cid);
      // Counters: its own tenant's only.
      kvtier_tenant_counters tc[8];
      size_t nt = 0;
      CHILD_CHECK(kvtier_tenant_stats(c, tc, 8, &nt) == KVTIER_OK);
      CHILD_CHECK(nt == 1 && std::string(tc[0].name) == "b");
      CHILD_CHECK(kvtier_flush(c) == KVTIER_REJECTED);
      kvtier_verify_report vr{};
      CHILD_CHECK(kvtier_verify_nvme(c, 0, 16, &vr) == KVTIER_REJECTED);
      char msg[128];
      CHILD_CHECK(kvtier_reload_config(c, msg, sizeof msg) == KVTIER_REJECTED);
      // Pressure: b's own chains, over its share.
      const auto mine = Chain(cid, 4, 5000 + round++);
      uint64_t lease = 0;
      std::vector<kvtier_slot> slots(mine.size());
      if (kvtier_alloc(c, cid, mine.size(), KVTIER_TIER_HOST, &lease, slots.data()) == KVTIER_OK) {
        std::vector<kvtier_commit_item> items(mine.size());
        for (size_t k = 0; k < mine.size(); ++k) {
          FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c, slots[k].slot)), kBlockBytes, cid, mine[k]);
          items[k] = {slots[k], mine[k], k == 0 ? kvtier_key{0, 0} : mine[k - 1]};
        }
        size_t done = 0;
        CHILD_CHECK(kvtier_commit(c, cid, lease, items.data(), items.size(), &done) == KVTIER_OK);
        CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
        own_stored += done;
      }
    }
    {
      // Last: b commits a's first chain under its own id, with a's bytes. The commit
      // compares with b's namespace only: every key is stored as new, none reported as
      // cached with the same bytes (which would tell b that a has them).
      const auto& keys = a_chains[0];
      uint64_t lease = 0;
      std::vector<kvtier_slot> slots(keys.size());
      CHILD_CHECK(kvtier_alloc_wait(c, cid, keys.size(), KVTIER_TIER_HOST, 5000, &lease, slots.data()) == KVTIER_OK);
      std::vector<kvtier_commit_item> items(keys.size());
      for (size_t k = 0; k < keys.size(); ++k) {
        FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c, slots[k].slot)), kBlockBytes, cid, keys[k]);
        items[k] = {slots[k], keys[k], k == 0 ? kvtier_key{0, 0} : keys[k - 1]};
      }
      kvtier_commit_result cr{};
      CHILD_CHECK(kvtier_commit_report(c, cid, lease, items.data(), items.size(), &cr) == KVTIER_OK);
      CHILD_CHECK(cr.stored == keys.size() && cr.same_bytes == 0 && cr.different_bytes == 0);
      CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
    }
    std::fprintf(stderr, "hostile: %d rounds, %llu own blocks stored; cross hits %llu, listed %llu, evicted %llu\n",
                 round, static_cast<unsigned long long>(own_stored), static_cast<unsigned long long>(cross_hits),
                 static_cast<unsigned long long>(cross_listed), static_cast<unsigned long long>(cross_evicted));
    CHILD_CHECK(round > 3);
    CHILD_CHECK(cross_hits == 0 && cross_listed == 0 && cross_evicted == 0);
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(victim.Wait(), 0) << d.log();
  EXPECT_EQ(hostile.Wait(), 0) << d.log();
  // Every block of a's is there with its bytes; the daemon counted no eviction of a's and
  // no hit of b's.
  Child check([&] {
    CHILD_CHECK(BecomeUser(kUidA, kGidA));
    kvtier_client* c = Connect(d.socket(), "a");
    CHILD_CHECK(c != nullptr);
    uint64_t id = 0;
    CHILD_CHECK(kvtier_register_contract(c, &desc, &id) == KVTIER_OK);
    for (const auto& keys : a_chains) {
      uint64_t lease = 0;
      size_t n = 0;
      std::vector<kvtier_slot> slots(keys.size());
      CHILD_CHECK(kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) ==
                  KVTIER_OK);
      CHILD_CHECK(n == keys.size());
      for (size_t i = 0; i < n; ++i) {
        CHILD_CHECK(CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, slots[i].slot)), kBlockBytes, cid, keys[i]));
      }
      CHILD_CHECK(kvtier_release(c, lease) == KVTIER_OK);
    }
    kvtier_close(c);
    return 0;
  });
  EXPECT_EQ(check.Wait(), 0) << d.log();
  kvtier_client* op2 = Connect(d.socket(), "operator");
  ASSERT_NE(op2, nullptr);
  const auto ts = TenantStats(op2);
  kvtier_close(op2);
  ASSERT_NE(Find(ts, "a"), nullptr);
  ASSERT_NE(Find(ts, "b"), nullptr);
  EXPECT_EQ(Find(ts, "a")->evictions[0] + Find(ts, "a")->evictions[1] + Find(ts, "a")->evictions[2], 0u);
  EXPECT_EQ(Find(ts, "b")->lookup_hits, 0u);
  EXPECT_GT(Find(ts, "b")->evictions[1], 0u);  // the pressure was real
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace kvtier::testing
