// ClusterClient and RemoteTier against the real Redis Cluster of the ctest fixture
// (scripts/redis-cluster.sh, 3 masters + 3 replicas on 7400..7405).
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>

#include <csignal>
#include <random>

#include "formats/record.h"
#include "tests/remote/redis_env.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier::remote {
namespace {

using testing::MasterPortOfSlot;
using testing::RedisConn;
using testing::SharedNodes;

std::string Rand(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

std::unique_ptr<ClusterClient> Open(std::vector<std::string> nodes, uint32_t cmd_ms = 500) {
  ClusterOptions o;
  o.nodes = std::move(nodes);
  o.command_timeout_ms = cmd_ms;
  auto c = ClusterClient::Open(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c.value());
}

TEST(KeySlot, MatchesTheSpecAndTheServer) {
  EXPECT_EQ(KeySlot("123456789"), 0x31C3 & 16383);  // CRC16-XMODEM check value
  EXPECT_EQ(KeySlot("foo"), 12182);
  EXPECT_EQ(KeySlot("{user1000}.following"), KeySlot("{user1000}.followers"));
  EXPECT_EQ(KeySlot("foo{}{bar}"), KeySlot(std::string_view("foo{}{bar}")));  // empty tag: whole key
  EXPECT_NE(KeySlot("foo{}{bar}"), KeySlot("bar"));
  EXPECT_EQ(KeySlot("foo{{bar}}zap"), KeySlot("{bar"));
  EXPECT_EQ(KeySlot("kvt:{0011223344556677:00112233445566778899aabbccddeeff}"),
            KeySlot("0011223344556677:00112233445566778899aabbccddeeff"));
  KVTIER_REQUIRE_SHARED_CLUSTER();
  RedisConn c(SharedNodes()[0]);
  ASSERT_TRUE(c.ok());
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string k = "k" + std::to_string(rng()) + (i % 3 ? "{" + std::to_string(i) + "}" : "");
    EXPECT_EQ(std::to_string(KeySlot(k)), c.Cmd({"CLUSTER", "KEYSLOT", k})) << k;
  }
}

TEST(ClusterClient, BadOptionsAreRefused) {
  ClusterOptions o;
  EXPECT_TRUE(ClusterClient::Open(o).status().IsInvalid());
  o.nodes = {"127.0.0.1"};
  EXPECT_TRUE(ClusterClient::Open(o).status().IsInvalid());
  o.nodes = {"127.0.0.1:70000"};
  EXPECT_TRUE(ClusterClient::Open(o).status().IsInvalid());
  o.nodes = {"127.0.0.1:7000"};
  o.pool_size = 0;
  EXPECT_TRUE(ClusterClient::Open(o).status().IsInvalid());
}

TEST(ClusterClient, SlotMapComesFromClusterSlots) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  // The first seed is dead: the next one answers.
  auto nodes = SharedNodes();
  nodes.insert(nodes.begin(), "127.0.0.1:1");
  auto c = Open(nodes);
  for (int slot : {0, 5000, 5461, 10922, 10923, 16383}) {
    const int port = MasterPortOfSlot(SharedNodes()[0], slot);
    EXPECT_EQ(c->NodeForSlot(static_cast<uint16_t>(slot)), "127.0.0.1:" + std::to_string(port)) << slot;
  }
}

TEST(ClusterClient, PipelinedBatchAcrossEveryMaster) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  auto c = Open(SharedNodes());
  std::mt19937_64 rng(11);
  const int n = 300;
  std::vector<std::string> keys(n), vals(n);
  std::vector<Command> sets(n), gets(n);
  for (int i = 0; i < n; ++i) {
    keys[i] = "pipe:" + std::to_string(rng());
    vals[i] = Rand(rng, 1 + rng() % 5000);
    sets[i].argv = {"SET", keys[i], vals[i]};
    gets[i].argv = {"GET", keys[i]};
  }
  c->Exec(sets);
  for (auto& s : sets) ASSERT_TRUE(s.status.ok()) << s.status.ToString();
  c->Exec(gets);
  for (int i = 0; i < n; ++i) {
    ASSERT_TRUE(gets[i].status.ok());
    ASSERT_EQ(gets[i].reply->type, REDIS_REPLY_STRING);
    EXPECT_EQ(std::string(gets[i].reply->str, gets[i].reply->len), vals[i]);
  }
  // One connection per master (plus the topology query), not one per command.
  EXPECT_LE(c->stats().connects, 4u);
  EXPECT_EQ(c->stats().moved, 0u);
}

// A GET with a sink: a value of exactly prefix + sink bytes lands in the sink (reply keeps
// the prefix); a value of another length is an ordinary reply and the sink is not used.
TEST(ClusterClient, SinkTakesTheTailOfAValueOfTheExpectedLength) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  auto c = Open(SharedNodes());
  std::mt19937_64 rng(std::random_device{}());
  const std::string k1 = "sink:" + std::to_string(rng()), k2 = "sink:" + std::to_string(rng());
  const std::string v1 = Rand(rng, 16 + 100000), v2 = Rand(rng, 16 + 99999);
  std::vector<Command> set(2);
  set[0].argv = {"SET", k1, v1};
  set[1].argv = {"SET", k2, v2};
  c->Exec(set);
  ASSERT_TRUE(set[0].status.ok() && set[1].status.ok());
  std::vector<uint8_t> s1(100000, 0), s2(100000, 0);
  std::vector<Command> get(2);
  get[0].argv = {"GET", k1};
  get[0].sink = s1;
  get[0].sink_prefix = 16;
  get[1].argv = {"GET", k2};
  get[1].sink = s2;
  get[1].sink_prefix = 16;
  c->Exec(get);
  ASSERT_TRUE(get[0].status.ok() && get[1].status.ok());
  EXPECT_TRUE(get[0].sunk);
  EXPECT_EQ(std::string(get[0].reply->str, get[0].reply->len), v1.substr(0, 16));
  EXPECT_EQ(std::string(s1.begin(), s1.end()), v1.substr(16));
  EXPECT_FALSE(get[1].sunk);
  EXPECT_EQ(std::string(get[1].reply->str, get[1].reply->len), v2);
  EXPECT_EQ(s2, std::vector<uint8_t>(100000, 0));
}

// A slot is moved from one master to another under a client that cached the old map:
// while migrating, a moved key is answered ASK (followed with ASKING); after, MOVED.
TEST(ClusterClient, FollowsAskDuringAndMovedAfterAResharding) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  auto c = Open(SharedNodes());
  std::mt19937_64 rng(std::random_device{}());
  const std::string tag = "{resh" + std::to_string(rng()) + "}";
  const std::string k1 = tag + "a", k2 = tag + "b";
  const uint16_t slot = KeySlot(k1);
  std::vector<Command> set(2);
  set[0].argv = {"SET", k1, "one"};
  set[1].argv = {"SET", k2, "two"};
  c->Exec(set);
  ASSERT_TRUE(set[0].status.ok() && set[1].status.ok());

  const std::string src = c->NodeForSlot(slot);
  std::string dst;  // another master
  for (int sl : {0, 5461, 10923, 16383}) {
    const std::string n = "127.0.0.1:" + std::to_string(MasterPortOfSlot(SharedNodes()[0], sl));
    if (n != src) dst = n;
  }
  ASSERT_FALSE(dst.empty());
  RedisConn s(src), d(dst);
  const std::string src_id = s.Cmd({"CLUSTER", "MYID"}), dst_id = d.Cmd({"CLUSTER", "MYID"});
  const std::string sl = std::to_string(slot);
  ASSERT_EQ(d.Cmd({"CLUSTER", "SETSLOT", sl, "IMPORTING", src_id}), "OK");
  ASSERT_EQ(s.Cmd({"CLUSTER", "SETSLOT", sl, "MIGRATING", dst_id}), "OK");
  const std::string dhost = dst.substr(0, dst.rfind(':')), dport = dst.substr(dst.rfind(':') + 1);
  ASSERT_EQ(s.Cmd({"MIGRATE", dhost, dport, "", "0", "5000", "KEYS", k1}), "OK");

  std::vector<Command> get(2);
  get[0].argv = {"GET", k1};  // on dst now: src answers ASK
  get[1].argv = {"GET", k2};  // still on src
  c->Exec(get);
  ASSERT_TRUE(get[0].status.ok()) << get[0].status.ToString();
  ASSERT_TRUE(get[1].status.ok()) << get[1].status.ToString();
  EXPECT_EQ(std::string(get[0].reply->str, get[0].reply->len), "one");
  EXPECT_EQ(std::string(get[1].reply->str, get[1].reply->len), "two");
  EXPECT_GE(c->stats().ask, 1u);
  EXPECT_EQ(c->NodeForSlot(slot), src);  // ASK does not change the map

  ASSERT_EQ(s.Cmd({"MIGRATE", dhost, dport, "", "0", "5000", "KEYS", k2}), "OK");
  for (const auto& n : SharedNodes()) {
    RedisConn r(n);
    (void)r.Cmd({"CLUSTER", "SETSLOT", sl, "NODE", dst_id});
  }
  c->Exec(get);
  ASSERT_TRUE(get[0].status.ok() && get[1].status.ok()) << get[1].status.ToString();
  EXPECT_EQ(std::string(get[1].reply->str, get[1].reply->len), "two");
  EXPECT_GE(c->stats().moved, 1u);
  EXPECT_EQ(c->NodeForSlot(slot), dst);
}

// A master that stops answering (SIGSTOP: the TCP connect still succeeds) costs one
// command timeout and IoError for its keys only; keys of other masters in the same batch
// are served.
TEST(ClusterClient, StoppedNodeTimesOutWithoutStallingOthers) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  const std::string dir = testing::SharedDir();
  auto c = Open(SharedNodes(), 200);
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 2; ++i) {
    std::string k = "stop:" + std::to_string(i);
    if (keys.empty() || c->NodeForSlot(KeySlot(k)) != c->NodeForSlot(KeySlot(keys[0]))) keys.push_back(k);
  }
  std::vector<Command> set(2);
  for (int i = 0; i < 2; ++i) set[i].argv = {"SET", keys[i], "v"};
  c->Exec(set);
  ASSERT_TRUE(set[0].status.ok() && set[1].status.ok());
  const std::string victim = c->NodeForSlot(KeySlot(keys[0]));
  std::ifstream pf(std::string(dir) + "/" + victim.substr(victim.rfind(':') + 1) + "/redis.pid");
  pid_t pid = 0;
  pf >> pid;
  ASSERT_GT(pid, 0);

  ClusterOptions o;
  o.nodes = SharedNodes();
  o.command_timeout_ms = 200;
  auto fresh = ClusterClient::Open(o);  // map first, then stop the node
  ASSERT_TRUE(fresh.ok());
  ASSERT_EQ(kill(pid, SIGSTOP), 0);
  std::vector<Command> get(2);
  for (int i = 0; i < 2; ++i) get[i].argv = {"GET", keys[i]};
  const auto t0 = std::chrono::steady_clock::now();
  fresh.value()->Exec(get);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kill(pid, SIGCONT);
  EXPECT_EQ(get[0].status.code(), StatusCode::kIoError) << get[0].status.ToString();
  ASSERT_TRUE(get[1].status.ok()) << get[1].status.ToString();
  EXPECT_EQ(std::string(get[1].reply->str, get[1].reply->len), "v");
  EXPECT_LT(secs, 1.0) << "a stopped node stalled the batch";
  EXPECT_GE(fresh.value()->stats().io_errors, 1u);
}

// ---- RemoteTier ---------------------------------------------------------------------------

std::unique_ptr<RemoteTier> OpenTier(bool compress = true) {
  RemoteOptions o;
  o.nodes = SharedNodes();
  o.compress = compress;
  auto t = RemoteTier::Open(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return std::move(t.value());
}

TEST(RemoteTier, KeyFormatCarriesContractAndKeyInOneHashTag) {
  const Key128 k{0x0011223344556677ull, 0x8899aabbccddeeffull};
  EXPECT_EQ(RedisKey(0x1046e2d6e69eae7aull, k), "kvt:{1046e2d6e69eae7a:00112233445566778899aabbccddeeff}");
}

TEST(RemoteTier, RoundTripIsBitIdenticalAndCompressesOnlyWhenItPays) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  auto t = OpenTier();
  std::mt19937_64 rng(std::random_device{}());
  const size_t len = 1474560;
  std::vector<std::vector<uint8_t>> data(4, std::vector<uint8_t>(len));
  for (auto& b : data[0]) b = static_cast<uint8_t>(rng());  // random: stored
  for (size_t i = 0; i < len; ++i) data[1][i] = static_cast<uint8_t>((i / 64) & 3);  // compressible
  for (auto& b : data[2]) b = static_cast<uint8_t>(rng());
  for (auto& b : data[3]) b = static_cast<uint8_t>(rng() & 0x11);
  const uint64_t contract = rng();
  std::vector<PutItem> puts(4);
  for (int i = 0; i < 4; ++i) {
    puts[i].contract_id = contract;
    puts[i].key = Key128{rng(), rng()};
    puts[i].parent = i ? puts[i - 1].key : Key128{};
    puts[i].payload = data[i];
  }
  EXPECT_EQ(EncodeValue(puts[0], true).size(), kEnvelopeSize + kRecordHeaderSize + len);
  EXPECT_LT(EncodeValue(puts[1], true).size(), len / 4);
  ASSERT_EQ(t->PutBatch(puts), 4u);
  std::vector<Key128> keys;
  for (auto& p : puts) keys.push_back(p.key);
  EXPECT_EQ(t->ExistsPrefix(contract, keys), 4u);
  keys.insert(keys.begin() + 2, Key128{1, 2});
  EXPECT_EQ(t->ExistsPrefix(contract, keys), 2u);

  std::vector<std::vector<uint8_t>> out(4, std::vector<uint8_t>(len, 0xEE));
  std::vector<GetItem> gets(4);
  for (int i = 0; i < 4; ++i) gets[i] = GetItem{contract, puts[i].key, out[i], Status(), Key128{}};
  t->GetBatch(gets);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(gets[i].status.ok()) << gets[i].status.ToString();
    EXPECT_EQ(out[i], data[i]) << i;
    EXPECT_EQ(gets[i].parent, puts[i].parent);
  }
  EXPECT_EQ(t->stats().hits, 4u);
  EXPECT_EQ(t->stats().corrupt, 0u);
}

TEST(RemoteTier, CorruptValuesAreRefusedAndCounted) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  auto t = OpenTier(false);
  std::mt19937_64 rng(std::random_device{}());
  const size_t len = 64 * 1024;
  std::vector<uint8_t> data(len);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  const uint64_t contract = rng(), other = rng();
  PutItem p{contract, Key128{rng(), rng()}, Key128{}, data};
  ASSERT_EQ(t->PutBatch(std::span<const PutItem>(&p, 1)), 1u);
  const std::string rk = RedisKey(contract, p.key);
  RedisConn admin(SharedNodes()[0]);
  ASSERT_TRUE(admin.ok());
  const std::string good = EncodeValue(p, false);

  auto get = [&](uint64_t c, const Key128& k) {
    std::vector<uint8_t> out(len, 0);
    GetItem g{c, k, out, Status(), Key128{}};
    t->GetBatch(std::span<GetItem>(&g, 1));
    if (g.status.ok()) {
      EXPECT_EQ(out, data);
    }
    return g.status;
  };
  auto set_raw = [&](const std::string& key, const std::string& v) {
    ClusterOptions o;
    o.nodes = SharedNodes();
    auto c = ClusterClient::Open(o);
    std::vector<Command> cmd(1);
    cmd[0].argv = {"SET", key, v};
    c.value()->Exec(cmd);
    ASSERT_TRUE(cmd[0].status.ok());
  };
  ASSERT_TRUE(get(contract, p.key).ok());
  // A different contract never matches: another key, and the same bytes copied under that
  // contract's key are refused by the header's contract id.
  EXPECT_TRUE(get(other, p.key).IsNotFound());
  set_raw(RedisKey(other, p.key), good);
  EXPECT_TRUE(get(other, p.key).IsCorrupt());
  // Another key's record under this key.
  const Key128 k2{rng(), rng()};
  set_raw(RedisKey(contract, k2), good);
  EXPECT_TRUE(get(contract, k2).IsCorrupt());
  // Garbage, a truncated value, a flipped payload byte, a flipped header byte.
  set_raw(rk, "garbage");
  EXPECT_TRUE(get(contract, p.key).IsCorrupt());
  set_raw(rk, good.substr(0, good.size() - 1));
  EXPECT_TRUE(get(contract, p.key).IsCorrupt());
  std::string flip = good;
  flip[kEnvelopeSize + kRecordHeaderSize + 1000] ^= 1;
  set_raw(rk, flip);
  EXPECT_TRUE(get(contract, p.key).IsCorrupt());
  flip = good;
  flip[kEnvelopeSize + 20] ^= 0x40;
  set_raw(rk, flip);
  EXPECT_TRUE(get(contract, p.key).IsCorrupt());
  EXPECT_EQ(t->stats().corrupt, 6u);
  set_raw(rk, good);
  EXPECT_TRUE(get(contract, p.key).ok());
}

TEST(RemoteTier, ClusterDownIsAMissNotAnError) {
  RemoteOptions o;
  o.nodes = {"127.0.0.1:1", "127.0.0.1:2"};
  o.connect_timeout_ms = 50;
  auto t = RemoteTier::Open(o);
  ASSERT_TRUE(t.ok());
  std::vector<uint8_t> out(4096);
  GetItem g{1, Key128{1, 1}, out, Status(), Key128{}};
  const auto t0 = std::chrono::steady_clock::now();
  t.value()->GetBatch(std::span<GetItem>(&g, 1));
  EXPECT_EQ(g.status.code(), StatusCode::kIoError);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
  EXPECT_EQ(t.value()->stats().errors, 1u);
  const Key128 k{1, 1};
  EXPECT_EQ(t.value()->ExistsPrefix(1, std::span<const Key128>(&k, 1)), 0u);
}

}  // namespace
}  // namespace kvtier::remote
