// Budgets that protect one party from another, against a real kvtierd with two slot
// classes and blocks of the large one: a client's share of a tier, a tenant's share of
// host (with and without tenant parts) and of NVMe, and the staging memory of every
// client together. Each is counted in bytes of the tier; a count in slots of the smallest
// class would let a party of large blocks take the whole tier.
//
// The tier: host 16 MiB in 7 slabs of 2304 KiB, classes 144 KiB and 576 KiB (4 slots of
// 576 KiB or 16 of 144 KiB a slab): 28 slots of the large class, 112 of the small one.
#include <dirent.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/daemon/harness.h"

namespace kvtier::hostile {
namespace {

using testing::Child;
using testing::DaemonConfig;
using testing::DaemonProcess;

constexpr uint64_t KiB = 1024;
constexpr uint64_t kLargeBytes = 576 * KiB;  // LargeContract(): 32 layers x 18 KiB
constexpr uint32_t kUidA = 64011, kUidB = 64012;
constexpr uint32_t kGidA = 64111, kGidB = 64112;

#define SKIP_UNLESS_ROOT()                                                                  \
  do {                                                                                      \
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients under other uids"; \
  } while (0)

// 32 layers x 8 KV heads x 128 x 16 tokens, NVFP4: 576 KiB blocks, the large class.
kvtier_contract_desc LargeContract() {
  kvtier_contract_desc d = testing::SmallContract("test/large");
  d.num_layers = 32;
  d.num_kv_heads = 8;
  d.head_dim = 128;
  return d;
}

// The tier above; `extra` is appended after [tiers.nvme] (its keys, then other tables).
DaemonConfig TwoClasses(const std::string& nvme_capacity, const std::string& extra = "") {
  DaemonConfig cfg;
  cfg.slot_bytes = "576KiB";
  cfg.host_capacity = "16MiB";
  cfg.nvme_capacity = nvme_capacity;
  cfg.tiers_extra = "slot_classes = [\"144KiB\", \"576KiB\"]\nslab_bytes = \"2304KiB\"\n";
  cfg.extra = extra;
  return cfg;
}

kvtier_client* Connect(const std::string& sock, const char* name) {
  kvtier_connect_options o{};
  o.name = name;
  o.timeout_ms = 10000;
  kvtier_client* c = nullptr;
  return kvtier_connect(sock.c_str(), &o, &c) == KVTIER_OK ? c : nullptr;
}

bool BecomeUser(uint32_t uid, uint32_t gid) {
  return ::setgroups(0, nullptr) == 0 && ::setgid(gid) == 0 && ::setuid(uid) == 0;
}

kvtier_key Key(uint64_t run, uint64_t i) { return kvtier_key{run, i + 1}; }

// Stores block `key` of contract `cid` (block_bytes), waiting out RETRY for up to
// wait_ms. The alloc's status (OK when committed).
kvtier_status StoreOne(kvtier_client* c, uint64_t cid, uint64_t block_bytes, const kvtier_key& key,
                       uint32_t wait_ms) {
  uint64_t lease = 0;
  kvtier_slot slot{};
  const kvtier_status s = kvtier_alloc_wait(c, cid, 1, KVTIER_TIER_HOST, wait_ms, &lease, &slot);
  if (s != KVTIER_OK) return s;
  testing::FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c, slot.slot)), block_bytes, cid, key);
  kvtier_commit_item item{slot, key, kvtier_key{0, 0}};
  size_t done = 0;
  const kvtier_status cs = kvtier_commit(c, cid, lease, &item, 1, &done);
  const kvtier_status rs = kvtier_release(c, lease);
  return cs != KVTIER_OK ? cs : done != 1 ? KVTIER_RETRY : rs;
}

std::vector<kvtier_tenant_counters> TenantStats(kvtier_client* c) {
  std::vector<kvtier_tenant_counters> v(16);
  size_t n = 0;
  if (kvtier_tenant_stats(c, v.data(), v.size(), &n) != KVTIER_OK) n = 0;
  v.resize(n);
  return v;
}

const kvtier_tenant_counters* Find(const std::vector<kvtier_tenant_counters>& v, const char* name) {
  for (const auto& t : v) {
    if (std::string(t.name) == name) return &t;
  }
  return nullptr;
}

// Two tenants, a (uid A) and b (uid B), with the given keys each; the daemon's uid is the
// operator. Appended after [tiers.nvme], so `nvme_keys` are that table's.
std::string TwoTenants(const std::string& nvme_keys, const std::string& a_keys, const std::string& b_keys) {
  return nvme_keys + "[security]\nsocket_mode = \"0666\"\n" + "[[tenants]]\nname = \"a\"\nuids = [" +
         std::to_string(kUidA) + "]\n" + a_keys + "[[tenants]]\nname = \"b\"\nuids = [" + std::to_string(kUidB) +
         "]\n" + b_keys;
}

// Tenant `uid` stores blocks [0, n) of run `run` of the large contract one at a time;
// returns how many were stored (exit code: 0..n, or 200 + a failed step).
int StoreAs(const std::string& sock, uint32_t uid, uint32_t gid, uint64_t run, uint64_t n, uint32_t wait_ms) {
  if (!BecomeUser(uid, gid)) return 201;
  kvtier_client* c = Connect(sock, "tenant");
  if (c == nullptr) return 202;
  kvtier_contract_desc d = LargeContract();
  uint64_t cid = 0;
  if (kvtier_register_contract(c, &d, &cid) != KVTIER_OK) return 203;
  int stored = 0;
  for (uint64_t i = 0; i < n; ++i) stored += StoreOne(c, cid, kLargeBytes, Key(run, i), wait_ms) == KVTIER_OK ? 1 : 0;
  kvtier_close(c);
  return stored;
}

int RunAs(const std::string& sock, uint32_t uid, uint32_t gid, uint64_t run, uint64_t n, uint32_t wait_ms) {
  Child ch([&] { return StoreAs(sock, uid, gid, run, n, wait_ms); });
  return ch.Wait();
}

// ---- daemon.max_tier_share_per_client ---------------------------------------------------

// Share 0.75 of 28 large slots is 21 of them (of the tier's bytes: 12,096 of 16,128 KiB),
// not 0.75 of the 112 small ones, which let one client hold all 28 and left a second
// client RETRY. The share counts the bytes the client holds in any class: at 21 large
// slots it holds its whole share, and no small slot more either.
TEST(Budgets, AClientOfLargeBlocksHoldsItsShareOfTheTiersBytes) {
  DaemonProcess d(TwoClasses("0"));
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* a = Connect(d.socket(), "a");
  kvtier_client* b = Connect(d.socket(), "b");
  ASSERT_NE(a, nullptr) << kvtier_last_error();
  ASSERT_NE(b, nullptr) << kvtier_last_error();
  kvtier_contract_desc large = LargeContract(), small = testing::SmallContract();
  uint64_t a_large = 0, a_small = 0, b_large = 0;
  ASSERT_EQ(kvtier_register_contract(a, &large, &a_large), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_register_contract(a, &small, &a_small), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_register_contract(b, &large, &b_large), KVTIER_OK) << kvtier_last_error();
  std::vector<kvtier_slot> slots(28);
  uint64_t lease = 0, more = 0;
  const kvtier_status all = kvtier_alloc(a, a_large, 28, KVTIER_TIER_HOST, &lease, slots.data());
  EXPECT_EQ(all, KVTIER_REJECTED) << "one client allocated 28 of 28 slots of 576 KiB";
  if (all == KVTIER_OK) {
    kvtier_slot s{};
    EXPECT_EQ(kvtier_alloc(b, b_large, 1, KVTIER_TIER_HOST, &more, &s), KVTIER_OK)
        << "the second client: " << kvtier_last_error();
    ASSERT_EQ(kvtier_release(a, lease), KVTIER_OK);
  } else {
    EXPECT_NE(std::string(kvtier_last_error()).find("daemon.max_tier_share_per_client lets one client hold 21 of "
                                                    "these"),
              std::string::npos)
        << kvtier_last_error();
  }
  EXPECT_EQ(kvtier_alloc(a, a_large, 22, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_REJECTED);
  ASSERT_EQ(kvtier_alloc(a, a_large, 21, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK) << kvtier_last_error();
  kvtier_slot s{};
  EXPECT_EQ(kvtier_alloc(a, a_small, 1, KVTIER_TIER_HOST, &more, &s), KVTIER_REJECTED)
      << "a client at its share took a small slot more";
  // The other client allocates the rest of the class.
  uint64_t b_lease = 0;
  EXPECT_EQ(kvtier_alloc(b, b_large, 7, KVTIER_TIER_HOST, &b_lease, slots.data()), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(kvtier_release(b, b_lease), KVTIER_OK);
  EXPECT_EQ(kvtier_release(a, lease), KVTIER_OK);
  // Released, the share is whole again.
  EXPECT_EQ(kvtier_alloc(a, a_large, 21, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(kvtier_release(a, lease), KVTIER_OK);
  kvtier_close(a);
  kvtier_close(b);
  EXPECT_TRUE(d.Alive());
}

// ---- tenant shares on host ---------------------------------------------------------------

// Tenant a (host_share 0.5) stores 28 large blocks; tenant b (host_share 0.4) then stores
// 10. Counted in slots of the small class a's 28 blocks were within its share (56), so no
// eviction for b could take them: b stored none of its 10 (8 with tenant parts, from its
// own part). Counted in bytes a is over its share (14 large slots' worth), b stores all
// 10, and a keeps at least its share.
class TenantHostShare : public ::testing::TestWithParam<bool> {};

TEST_P(TenantHostShare, ATenantOfLargeBlocksIsOverItsShareByBytes) {
  SKIP_UNLESS_ROOT();
  const bool parts = GetParam();
  DaemonProcess d(TwoClasses("0", TwoTenants("", "host_share = 0.5\n", "host_share = 0.4\n")));
  ASSERT_TRUE(d.Start({"--set", std::string("tiers.host.tenant_parts=") + (parts ? "true" : "false")})) << d.log();
  EXPECT_EQ(RunAs(d.socket(), kUidA, kGidA, 1, 28, 10000), 28) << d.log();
  // b's allocs evict at once (no NVMe: a's blocks are dropped); the wait is a margin.
  EXPECT_EQ(RunAs(d.socket(), kUidB, kGidB, 2, 10, 1000), 10) << "tenant b stored too few of its 10 blocks";
  kvtier_client* op = Connect(d.socket(), "operator");
  ASSERT_NE(op, nullptr) << kvtier_last_error();
  const auto ts = TenantStats(op);
  kvtier_close(op);
  ASSERT_NE(Find(ts, "a"), nullptr);
  ASSERT_NE(Find(ts, "b"), nullptr);
  EXPECT_EQ(Find(ts, "b")->blocks[1], 10u);
  EXPECT_GE(Find(ts, "a")->blocks[1], 14u) << "a was pushed below its share";
  EXPECT_EQ(d.Stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(Budgets, TenantHostShare, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("WithTenantParts") : std::string("OneArena");
                         });

// ---- tenant shares on NVMe -----------------------------------------------------------------

// NVMe of 16 MiB in slabs of 4 MiB: 28 records of 580 KiB, or 108 of 148 KiB. Tenant a
// (nvme_share 0.5) flushes 28 large blocks to NVMe and holds every record; tenant b
// (nvme_share 0.4) then flushes 10. Counted in records of the small class a was within its
// share (54) and b got none of its 10 onto NVMe; in bytes a is over its share, b gets its
// 10, and a keeps at least its share (14 records).
TEST(Budgets, ATenantOfLargeBlocksIsOverItsNvmeShareByBytes) {
  SKIP_UNLESS_ROOT();
  DaemonProcess d(TwoClasses("16MiB", TwoTenants("slab_bytes = \"4MiB\"\n", "nvme_share = 0.5\n",
                                                 "nvme_share = 0.4\n")));
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* op = Connect(d.socket(), "operator");
  ASSERT_NE(op, nullptr) << kvtier_last_error();
  EXPECT_EQ(RunAs(d.socket(), kUidA, kGidA, 1, 28, 10000), 28) << d.log();
  ASSERT_EQ(kvtier_flush(op), KVTIER_OK) << kvtier_last_error();
  auto ts = TenantStats(op);
  ASSERT_NE(Find(ts, "a"), nullptr);
  // Every record was a's; over its share, the NVMe tier's watermarks took some back.
  EXPECT_GE(Find(ts, "a")->blocks[2], 14u) << "a's blocks did not reach NVMe";
  EXPECT_EQ(RunAs(d.socket(), kUidB, kGidB, 2, 10, 10000), 10) << d.log();
  ASSERT_EQ(kvtier_flush(op), KVTIER_OK) << kvtier_last_error();
  ts = TenantStats(op);
  kvtier_close(op);
  ASSERT_NE(Find(ts, "a"), nullptr);
  ASSERT_NE(Find(ts, "b"), nullptr);
  std::string table;
  for (const auto& t : ts) {
    table += std::string(t.name) + ": blocks " + std::to_string(t.blocks[1]) + "/" + std::to_string(t.blocks[2]) +
             " evictions " + std::to_string(t.evictions[1]) + "/" + std::to_string(t.evictions[2]) + " committed " +
             std::to_string(t.committed) + "\n";
  }
  EXPECT_EQ(Find(ts, "b")->blocks[2], 10u) << "tenant b's blocks did not reach NVMe\n" << table;
  EXPECT_GE(Find(ts, "a")->blocks[2], 14u) << "a was pushed below its NVMe share";
  EXPECT_EQ(d.Stop(), 0);
}

// ---- staging memory ---------------------------------------------------------------------------

// Bytes of the daemon's staging memfds in memory (their pages, as the kernel counts them).
uint64_t StagingResident(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  uint64_t bytes = 0;
  DIR* dp = ::opendir(dir.c_str());
  if (dp == nullptr) return 0;
  while (dirent* e = ::readdir(dp)) {
    const std::string path = dir + "/" + e->d_name;
    char target[256] = {};
    const ssize_t k = ::readlink(path.c_str(), target, sizeof target - 1);
    if (k <= 0 || std::string(target).find("memfd:kvtier-staging-") == std::string::npos) continue;
    struct stat st{};
    if (::stat(path.c_str(), &st) == 0) bytes += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  ::closedir(dp);
  return bytes;
}

// With [[tenants]] every host acquire of a client with no part copies its blocks into
// the client's staging area, whose pages stayed until it detached: 8 clients acquiring
// the same 40 blocks held 8 x 40 pages, 5x the 256 KiB host tier. The staging memory of
// every client together is bounded by tiers.host.staging_bytes_total (default: the host
// tier's bytes): freed slots' pages are taken back, and past the bound an acquire whose
// copies do not fit gets RETRY, naming the key, until others release.
TEST(Budgets, StagingCopiesOfEveryClientStayWithinTheTotal) {
  // Tenants only make the copies; the clients here run as the daemon's uid (no part).
  DaemonConfig cfg;
  cfg.extra = "[[tenants]]\nname = \"a\"\nuids = [" + std::to_string(kUidA) + "]\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  constexpr uint64_t kHostBytes = 256 * KiB;
  kvtier_contract_desc desc = testing::SmallContract();
  std::vector<kvtier_key> keys;
  for (uint64_t i = 0; i < 40; ++i) keys.push_back(Key(7, i));
  {
    kvtier_client* w = Connect(d.socket(), "writer");
    ASSERT_NE(w, nullptr) << kvtier_last_error();
    uint64_t cid = 0;
    ASSERT_EQ(kvtier_register_contract(w, &desc, &cid), KVTIER_OK);
    for (const auto& k : keys) ASSERT_EQ(StoreOne(w, cid, 576, k, 2000), KVTIER_OK) << kvtier_last_error();
    kvtier_close(w);
  }
  std::vector<kvtier_client*> readers;
  std::vector<kvtier_slot> slots(keys.size());
  uint64_t cid = 0;
  for (int r = 0; r < 8; ++r) {
    kvtier_client* c = Connect(d.socket(), "reader");
    ASSERT_NE(c, nullptr) << kvtier_last_error();
    ASSERT_EQ(kvtier_register_contract(c, &desc, &cid), KVTIER_OK);
    readers.push_back(c);
    uint64_t lease = 0;
    size_t n = 0;
    ASSERT_EQ(kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n), KVTIER_OK)
        << "reader " << r << ": " << kvtier_last_error();
    ASSERT_EQ(n, keys.size());
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(testing::CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, slots[i].slot)), 576, cid,
                                      keys[i]))
          << "reader " << r << " block " << i;
    }
    ASSERT_EQ(kvtier_release(c, lease), KVTIER_OK);
  }
  const uint64_t resident = StagingResident(d.pid());
  EXPECT_LE(resident, kHostBytes) << "8 clients' staging copies hold " << resident << " bytes";
  // Two clients holding their copies at once: 80 pages do not fit 64. The second waits
  // (RETRY, naming the key) until the first releases.
  uint64_t l0 = 0, l1 = 0;
  size_t n = 0;
  ASSERT_EQ(kvtier_acquire(readers[0], cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &l0, slots.data(), &n),
            KVTIER_OK);
  EXPECT_EQ(kvtier_acquire(readers[1], cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &l1, slots.data(), &n),
            KVTIER_RETRY);
  EXPECT_NE(std::string(kvtier_last_error()).find("tiers.host.staging_bytes_total"), std::string::npos)
      << kvtier_last_error();
  EXPECT_LE(StagingResident(d.pid()), kHostBytes);
  ASSERT_EQ(kvtier_release(readers[0], l0), KVTIER_OK);
  ASSERT_EQ(kvtier_acquire(readers[1], cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &l1, slots.data(), &n),
            KVTIER_OK)
      << kvtier_last_error();
  EXPECT_EQ(n, keys.size());
  EXPECT_EQ(kvtier_release(readers[1], l1), KVTIER_OK);
  EXPECT_LE(StagingResident(d.pid()), kHostBytes);
  for (kvtier_client* c : readers) kvtier_close(c);
  EXPECT_TRUE(d.Alive());
}

}  // namespace
}  // namespace kvtier::hostile
