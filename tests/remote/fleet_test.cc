// Fleet behaviour: TWO real kvtierd processes, each with its own socket, host arena and
// NVMe folder, sharing one real Redis Cluster as their remote tier.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "tests/daemon/harness.h"
#include "tests/remote/redis_env.h"
#include "tests/tools/run_tool.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier::remote {
namespace {

using kvtier::testing::CheckBlock;
using kvtier::testing::DaemonConfig;
using kvtier::testing::DaemonProcess;
using kvtier::testing::FillBlock;
using kvtier::testing::MetricValue;
using kvtier::testing::SmallContract;
using testing::SharedNodes;

constexpr size_t kBlockBytes = 576;  // SmallContract: 2 layers x 1 head x 16 dim x 16 tokens NVFP4

std::string NodesToml(const std::vector<std::string>& nodes) {
  std::string s = "[";
  for (size_t i = 0; i < nodes.size(); ++i) s += (i ? ", \"" : "\"") + nodes[i] + "\"";
  return s + "]";
}

std::unique_ptr<DaemonProcess> StartDaemon(const std::vector<std::string>& nodes, const std::string& write,
                                           uint32_t cmd_timeout_ms = 500) {
  DaemonConfig c;
  c.extra = "[tiers.remote]\nnodes = " + NodesToml(nodes) + "\nwrite = \"" + write +
            "\"\nconnect_timeout_ms = 100\ncommand_timeout_ms = " + std::to_string(cmd_timeout_ms) + "\n";
  auto d = std::make_unique<DaemonProcess>(c);
  EXPECT_TRUE(d->Start()) << d->log();
  return d;
}

struct Client {
  kvtier_client* c = nullptr;
  explicit Client(const std::string& sock) {
    kvtier_connect_options o{};
    o.name = "fleet-test";
    o.timeout_ms = 10000;
    EXPECT_EQ(kvtier_connect(sock.c_str(), &o, &c), KVTIER_OK) << kvtier_last_error();
  }
  ~Client() {
    if (c) kvtier_close(c);
  }
  uint64_t Register(const char* model) {
    kvtier_contract_desc d = SmallContract(model);
    uint64_t id = 0;
    EXPECT_EQ(kvtier_register_contract(c, &d, &id), KVTIER_OK);
    return id;
  }
  void Store(uint64_t contract, const std::vector<kvtier_key>& keys) {
    uint64_t lease = 0;
    std::vector<kvtier_slot> slots(keys.size());
    ASSERT_EQ(kvtier_alloc(c, contract, keys.size(), KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK);
    uint64_t arena_bytes = 0;
    auto* arena = static_cast<uint8_t*>(kvtier_host_arena(c, &arena_bytes));
    const uint64_t sb = kvtier_slot_bytes(c);
    std::vector<kvtier_commit_item> items(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      FillBlock(arena + slots[i].slot * sb, kBlockBytes, contract, keys[i]);
      items[i] = {slots[i], keys[i], i == 0 ? kvtier_key{0, 0} : keys[i - 1]};
    }
    size_t done = 0;
    ASSERT_EQ(kvtier_commit(c, contract, lease, items.data(), items.size(), &done), KVTIER_OK);
    ASSERT_EQ(done, keys.size());
    ASSERT_EQ(kvtier_release(c, lease), KVTIER_OK);
  }
  // Acquires into host; checks every served block against the bytes its key was stored
  // with under `bytes_contract`. Returns blocks served, or -1 when a wrong block was served.
  long AcquireChecked(uint64_t contract, const std::vector<kvtier_key>& keys, uint64_t bytes_contract) {
    uint64_t lease = 0;
    size_t n = 0;
    std::vector<kvtier_slot> slots(keys.size());
    const kvtier_status st =
        kvtier_acquire(c, contract, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n);
    EXPECT_EQ(st, KVTIER_OK) << kvtier_last_error();
    if (st != KVTIER_OK) return 0;
    uint64_t arena_bytes = 0;
    auto* arena = static_cast<uint8_t*>(kvtier_host_arena(c, &arena_bytes));
    const uint64_t sb = kvtier_slot_bytes(c);
    long ok = static_cast<long>(n);
    for (size_t i = 0; i < n; ++i) {
      if (!CheckBlock(arena + slots[i].slot * sb, kBlockBytes, bytes_contract, keys[i])) ok = -1;
    }
    if (n > 0) {
      EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
    }
    return ok;
  }
};

std::vector<kvtier_key> Chain(uint64_t contract, size_t n) {
  std::vector<uint32_t> tokens(n * 16);
  std::mt19937 rng(std::random_device{}());
  for (auto& t : tokens) t = rng();
  std::vector<kvtier_key> keys(n);
  size_t got = 0;
  EXPECT_EQ(kvtier_key_chain(contract, tokens.data(), tokens.size(), 16, keys.data(), n, &got), KVTIER_OK);
  return keys;
}

double Metric(DaemonProcess& d, const char* name, const char* tier = "remote") {
  return MetricValue(d.Metrics(), std::string(name) + "{tier=\"" + tier + "\"}");
}

class Fleet : public ::testing::TestWithParam<const char*> {};

// A block stored through daemon A is served through daemon B, bit-identical, for both
// write modes (write-through: at commit; on-demote: when A's flush moves it out of host).
TEST_P(Fleet, StoredThroughAIsServedByBBitIdentical) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  const std::string mode = GetParam();
  auto a = StartDaemon(SharedNodes(), mode), b = StartDaemon(SharedNodes(), "off");
  Client ca(a->socket()), cb(b->socket());
  const uint64_t cid = ca.Register("fleet/model");
  ASSERT_EQ(cb.Register("fleet/model"), cid);
  const auto keys = Chain(cid, 12);
  ca.Store(cid, keys);
  if (mode == "on-demote") {
    // Not written yet: the block is still in A's host tier.
    EXPECT_EQ(a->WaitMetric("kvtier_tier_demotions_total{tier=\"remote\"}", 0, 200), 0);
    ASSERT_EQ(kvtier_flush(ca.c), KVTIER_OK);
  }
  ASSERT_EQ(a->WaitMetric("kvtier_tier_demotions_total{tier=\"remote\"}", 12), 12) << a->log();

  kvtier_lookup_result lr{};
  std::vector<uint8_t> tiers(keys.size());
  ASSERT_EQ(kvtier_lookup(cb.c, cid, keys.data(), keys.size(), &lr, tiers.data()), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 12u);
  for (uint8_t t : tiers) EXPECT_EQ(t, KVTIER_TIER_REMOTE);
  EXPECT_GT(lr.est_seconds_to_hbm, 0.0);

  EXPECT_EQ(cb.AcquireChecked(cid, keys, cid), 12);
  EXPECT_EQ(Metric(*b, "kvtier_tier_hits_total"), 12);
  EXPECT_EQ(Metric(*b, "kvtier_tier_promotions_total"), 12);
  // Promoted: local now, and nothing is written back by B (write = off).
  ASSERT_EQ(kvtier_lookup(cb.c, cid, keys.data(), keys.size(), &lr, tiers.data()), KVTIER_OK);
  EXPECT_EQ(tiers[0], KVTIER_TIER_HOST);
  EXPECT_EQ(Metric(*b, "kvtier_tier_demotions_total"), 0);
}
INSTANTIATE_TEST_SUITE_P(Write, Fleet, ::testing::Values("write-through", "on-demote"),
                         [](const auto& i) { return std::string(i.param) == "on-demote" ? "OnDemote" : "WriteThrough"; });

TEST(FleetContracts, DifferentContractNeverMatches) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  auto a = StartDaemon(SharedNodes(), "write-through"), b = StartDaemon(SharedNodes(), "off");
  Client ca(a->socket()), cb(b->socket());
  const uint64_t x = ca.Register("fleet/model-x");
  const uint64_t y = cb.Register("fleet/model-y");
  ASSERT_NE(x, y);
  const auto keys = Chain(x, 4);
  ca.Store(x, keys);
  ASSERT_EQ(a->WaitMetric("kvtier_tier_demotions_total{tier=\"remote\"}", 4), 4);
  kvtier_lookup_result lr{};
  ASSERT_EQ(kvtier_lookup(cb.c, y, keys.data(), keys.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 0u);
  EXPECT_EQ(cb.AcquireChecked(y, keys, x), 0);
  // Under its own contract B finds them.
  ASSERT_EQ(cb.Register("fleet/model-x"), x);
  EXPECT_EQ(cb.AcquireChecked(x, keys, x), 4);
}

TEST(FleetCorruption, ValueCorruptedInRedisIsRefusedAndCounted) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  auto a = StartDaemon(SharedNodes(), "write-through"), b = StartDaemon(SharedNodes(), "off");
  Client ca(a->socket()), cb(b->socket());
  const uint64_t cid = ca.Register("fleet/corrupt");
  ASSERT_EQ(cb.Register("fleet/corrupt"), cid);
  const auto keys = Chain(cid, 5);
  ca.Store(cid, keys);
  ASSERT_EQ(a->WaitMetric("kvtier_tier_demotions_total{tier=\"remote\"}", 5), 5);
  // Garbage under block 2's key; a valid record of block 3 under block 4's key.
  ClusterOptions o;
  o.nodes = SharedNodes();
  auto cl = ClusterClient::Open(o);
  ASSERT_TRUE(cl.ok());
  const std::string k2 = RedisKey(cid, Key128{keys[2].hi, keys[2].lo});
  const std::string k3 = RedisKey(cid, Key128{keys[3].hi, keys[3].lo});
  const std::string k4 = RedisKey(cid, Key128{keys[4].hi, keys[4].lo});
  std::vector<Command> get(1);
  get[0].argv = {"GET", k3};
  cl.value()->Exec(get);
  ASSERT_TRUE(get[0].status.ok());
  const std::string rec3(get[0].reply->str, get[0].reply->len);
  std::vector<Command> set(2);
  set[0].argv = {"SET", k2, "this is not a kvtier record"};
  set[1].argv = {"SET", k4, rec3};
  cl.value()->Exec(set);
  ASSERT_TRUE(set[0].status.ok() && set[1].status.ok());

  // The prefix ends at the corrupt block. The five GETs went out in one pipelined batch,
  // so both bad values (blocks 2 and 4) were fetched, refused and counted.
  EXPECT_EQ(cb.AcquireChecked(cid, keys, cid), 2);
  EXPECT_EQ(Metric(*b, "kvtier_tier_checksum_failures_total"), 2);
  const std::vector<kvtier_key> tail(keys.begin() + 3, keys.end());
  EXPECT_EQ(cb.AcquireChecked(cid, tail, cid), 1);  // block 3 ok, block 4 holds 3's record
  EXPECT_EQ(Metric(*b, "kvtier_tier_checksum_failures_total"), 3);
  EXPECT_TRUE(b->Alive());
}

// No cluster at all: the daemon starts, serves its local tiers as before, and the remote
// tier is fast misses and counted errors, never an error for the client.
TEST(FleetDown, ClusterDownIsMissesAndCountersNeverErrors) {
  auto a = StartDaemon({"127.0.0.1:1", "127.0.0.1:2"}, "write-through", 200);
  ASSERT_TRUE(a->Alive()) << a->log();
  Client ca(a->socket());
  const uint64_t cid = ca.Register("fleet/down");
  const auto keys = Chain(cid, 6);
  const std::vector<kvtier_key> stored(keys.begin(), keys.begin() + 3);
  ca.Store(cid, stored);
  kvtier_lookup_result lr{};
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(kvtier_lookup(ca.c, cid, keys.data(), keys.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, 3u);
  EXPECT_EQ(ca.AcquireChecked(cid, keys, cid), 3);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_GE(a->WaitMetric("kvtier_tier_write_errors_total{tier=\"remote\"}", 3), 3);
  EXPECT_GE(Metric(*a, "kvtier_tier_errors_total"), 1);
  EXPECT_TRUE(a->Alive());

  // The same counters cross the wire: the C ABI's stats and kvtierctl stats (text and JSON).
  kvtier_tier_stats ts[8];
  size_t n = 0;
  ASSERT_EQ(kvtier_stats(ca.c, ts, 8, &n), KVTIER_OK) << kvtier_last_error();
  int remote = -1;
  for (size_t i = 0; i < n; ++i) {
    if (ts[i].tier == KVTIER_TIER_REMOTE) remote = static_cast<int>(i);
  }
  ASSERT_GE(remote, 0) << "no remote tier in kvtier_stats";
  EXPECT_GE(ts[remote].write_errors, 3u);
  EXPECT_GE(ts[remote].errors, 1u);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("fleet_down_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto r = kvtier::testing_tools::RunTool("kvtierctl", {"--socket", a->socket(), "stats", "--json"}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  bool seen = false;
  for (const auto& t : j["tiers"]) {
    if (t["tier"] != "remote") continue;
    seen = true;
    EXPECT_GE(t["write_errors"].get<uint64_t>(), 3u) << t.dump();
    EXPECT_GE(t["errors"].get<uint64_t>(), 1u) << t.dump();
  }
  EXPECT_TRUE(seen) << r.out;
  const auto text = kvtier::testing_tools::RunTool("kvtierctl", {"--socket", a->socket(), "stats"}, dir);
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("ERRORS"), std::string::npos) << text.out;
  std::filesystem::remove_all(dir);
}

// A master is killed; its replica takes over. Reads go on (misses while the slot has no
// master, never errors), no wrong block is ever served, and after the failover every
// block is served again from the promoted replica.
TEST(FleetFailover, MasterKilledReplicaTakesOverNoWrongBlock) {
  KVTIER_REQUIRE_REDIS();
  testing::PrivateCluster pc(7420);
  ASSERT_TRUE(pc.ok()) << pc.log();
  auto a = StartDaemon(pc.nodes(), "write-through", 300), b = StartDaemon(pc.nodes(), "off", 300);
  Client ca(a->socket()), cb(b->socket());
  const uint64_t cid = ca.Register("fleet/failover");
  ASSERT_EQ(cb.Register("fleet/failover"), cid);
  const size_t n = 24;
  const auto keys = Chain(cid, n);
  ca.Store(cid, keys);
  ASSERT_EQ(a->WaitMetric("kvtier_tier_demotions_total{tier=\"remote\"}", n), n);

  // The master of the first block's slot.
  const uint16_t slot = KeySlot(RedisKey(cid, Key128{keys[0].hi, keys[0].lo}));
  const int port = testing::MasterPortOfSlot(pc.nodes()[0], slot);
  ASSERT_GT(port, 0);
  {  // let the victim's replica catch up before the kill (replication is asynchronous)
    testing::RedisConn m("127.0.0.1", port);
    const std::string want = m.Cmd({"DBSIZE"});
    int replica = -1;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (replica < 0 && std::chrono::steady_clock::now() < deadline) {  // its link may be new
      auto* role = static_cast<redisReply*>(redisCommand(m.c, "ROLE"));
      if (role && role->type == REDIS_REPLY_ARRAY && role->elements >= 3 && role->element[2]->elements > 0) {
        replica = std::atoi(role->element[2]->element[0]->element[1]->str);
      }
      if (role) freeReplyObject(role);
      if (replica < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GT(replica, 0) << "the master of slot " << slot << " has no replica";
    testing::RedisConn r("127.0.0.1", replica);
    while (r.Cmd({"DBSIZE"}) != want && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(r.Cmd({"DBSIZE"}), want);
  }
  ASSERT_EQ(kill(pc.pid(port), SIGKILL), 0);

  const auto t0 = std::chrono::steady_clock::now();
  bool all_back = false;
  int rounds = 0;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    uint64_t ev = 0;
    ASSERT_EQ(kvtier_evict_contract(cb.c, cid, &ev, nullptr), KVTIER_OK);  // force remote reads
    const auto r0 = std::chrono::steady_clock::now();
    const long got = cb.AcquireChecked(cid, keys, cid);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - r0).count();
    ++rounds;
    ASSERT_GE(got, 0) << "a wrong block was served during failover";
    EXPECT_LT(secs, 3.0) << "an acquire stalled past the remote timeouts";
    if (static_cast<size_t>(got) == n) {
      all_back = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(all_back) << "the replica never took over (" << rounds << " rounds)";
  std::printf("failover: all %zu blocks served again after %.2f s, %d rounds\n", n,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), rounds);
  EXPECT_NE(testing::MasterPortOfSlot(pc.nodes()[(port - 7420 + 1) % 6], slot), port);
  EXPECT_TRUE(b->Alive());
  EXPECT_EQ(Metric(*b, "kvtier_tier_checksum_failures_total"), 0);
}

}  // namespace
}  // namespace kvtier::remote
