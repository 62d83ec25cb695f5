// The remote tier authenticated: Redis ACL users and TLS against the --secure cluster of
// the ctest fixture (scripts/redis-cluster.sh start DIR 7410 --secure: TLS only, client
// certificates required, the default user off, user kvtier confined to GET/SET/EXISTS on
// kvt:*), the password file's rules, key prefixes and namespaces.
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "tests/daemon/harness.h"
#include "tests/remote/redis_env.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/connection.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/tier_manager.h"

namespace kvtier::remote {
namespace {

using testing::Cmd;
using testing::SecureAdmin;
using testing::SecureDir;
using testing::SecureNodeList;
using testing::SecureTls;

// A temp folder removed at the end.
struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/kvtier-secure-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

void WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path, std::ios::trunc) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

// The options of the kvtier user of the secure cluster.
RemoteOptions SecureOptions() {
  RemoteOptions o;
  o.nodes = SecureNodeList();
  o.command_timeout_ms = 5000;
  o.connect_timeout_ms = 1000;
  o.user = "kvtier";
  o.password_file = SecureDir() + "/kvtier.password";
  o.tls = SecureTls();
  return o;
}

ClusterOptions SecureClusterOptions() {
  ClusterOptions o;
  o.nodes = SecureNodeList();
  o.command_timeout_ms = 5000;
  o.connect_timeout_ms = 1000;
  o.user = "kvtier";
  o.password = testing::ReadFirstLine(SecureDir() + "/kvtier.password");
  o.tls = SecureTls();
  return o;
}

std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n) {
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

TEST(PasswordFile, OneLineClosedToOthers) {
  TempDir d;
  const std::string p = d.path + "/pw";
  WriteFile(p, "s3cret\n", 0600);
  auto pw = ReadPasswordFile(p);
  ASSERT_TRUE(pw.ok()) << pw.status().ToString();
  EXPECT_EQ(*pw, "s3cret");
  WriteFile(p, "s3cret\r\n", 0640);  // group access is the owner's choice
  ASSERT_TRUE(ReadPasswordFile(p).ok());
  EXPECT_EQ(*ReadPasswordFile(p), "s3cret");
  WriteFile(p, "s3cret", 0400);
  EXPECT_EQ(*ReadPasswordFile(p), "s3cret");
}

TEST(PasswordFile, RefusedWhenOpenToOthersEmptyOrSeveralLines) {
  TempDir d;
  const std::string p = d.path + "/pw";
  WriteFile(p, "s3cret\n", 0644);
  auto pw = ReadPasswordFile(p);
  ASSERT_TRUE(pw.status().IsInvalid());
  EXPECT_NE(pw.status().message().find("open to others (mode 0644)"), std::string::npos) << pw.status().message();
  EXPECT_EQ(pw.status().message().find("s3cret"), std::string::npos);  // never echoes the secret
  WriteFile(p, "s3cret\n", 0602);
  EXPECT_TRUE(ReadPasswordFile(p).status().IsInvalid());
  WriteFile(p, "\n", 0600);
  EXPECT_NE(ReadPasswordFile(p).status().message().find("empty"), std::string::npos);
  WriteFile(p, "one\ntwo\n", 0600);
  EXPECT_NE(ReadPasswordFile(p).status().message().find("more than one line"), std::string::npos);
  WriteFile(p, std::string(kMaxPasswordBytes + 1, 'x'), 0600);
  EXPECT_TRUE(ReadPasswordFile(p).status().IsInvalid());
  EXPECT_NE(ReadPasswordFile(d.path + "/missing").status().message().find("No such file"), std::string::npos);
  EXPECT_NE(ReadPasswordFile(d.path).status().message().find("not a regular file"), std::string::npos);
}

// RemoteTier::Open refuses a password file open to others before connecting anywhere.
TEST(PasswordFile, RemoteTierDoesNotStartOnAnOpenFile) {
  TempDir d;
  RemoteOptions o;
  o.nodes = {"127.0.0.1:1"};
  o.connect_timeout_ms = 50;
  o.user = "kvtier";
  o.password_file = d.path + "/pw";
  WriteFile(o.password_file, "s3cret\n", 0644);
  auto t = RemoteTier::Open(o);
  ASSERT_TRUE(t.status().IsInvalid());
  EXPECT_NE(t.status().message().find(o.password_file), std::string::npos) << t.status().message();
  o.password_file = "";
  EXPECT_TRUE(RemoteTier::Open(o).status().IsInvalid());  // a user without a password
}

TEST(KeyPrefix, DefaultKeepsTheKeysAndNamespacesNeverCollide) {
  const Key128 k{0x0011223344556677ull, 0x8899aabbccddeeffull};
  const uint64_t cid = 0x1046e2d6e69eae7aull;
  EXPECT_EQ(RedisKey(kDefaultKeyPrefix, "", cid, k), RedisKey(cid, k));
  EXPECT_EQ(RedisKey("kvt:", "", cid, k), "kvt:{1046e2d6e69eae7a:00112233445566778899aabbccddeeff}");
  EXPECT_EQ(RedisKey("fleet-a:", "tenant1", cid, k), "fleet-a:tenant1:{1046e2d6e69eae7a:00112233445566778899aabbccddeeff}");
  // The hash tag is the block's whatever the prefix and namespace: same slot, other key.
  EXPECT_EQ(KeySlot(RedisKey("x:", "t", cid, k)), KeySlot(RedisKey(cid, k)));
  EXPECT_NE(RedisKey("kvt:", "a", cid, k), RedisKey("kvt:", "", cid, k));
  EXPECT_NE(RedisKey("kvt:", "a:b", cid, k), RedisKey("kvt:a:", "b", cid, k) + "x");
  EXPECT_TRUE(CheckKeyPart("", "ns").ok());
  EXPECT_TRUE(CheckKeyPart("tenant-1.prod:x", "ns").ok());
  for (const char* bad : {"a{b", "a}", "a b", "a\nb", "\x7f"}) EXPECT_TRUE(CheckKeyPart(bad, "ns").IsInvalid()) << bad;
  EXPECT_TRUE(CheckKeyPart(std::string(kMaxKeyPartBytes + 1, 'a'), "ns").IsInvalid());
  RemoteOptions o;
  o.nodes = {"127.0.0.1:1"};
  o.key_prefix = "kvt:{x}";
  EXPECT_TRUE(RemoteTier::Open(o).status().IsInvalid());
}

TEST(TlsContext, BadFilesAreRefusedNamingThem) {
  TempDir d;
  TlsOptions t;
  t.enabled = true;
  t.ca_file = d.path + "/none.crt";
  auto c = TlsContext::Create(t);
  ASSERT_TRUE(c.status().IsInvalid());
  EXPECT_NE(c.status().message().find(t.ca_file), std::string::npos) << c.status().message();
  WriteFile(d.path + "/junk.crt", "not a certificate\n", 0644);
  t.ca_file = d.path + "/junk.crt";
  EXPECT_TRUE(TlsContext::Create(t).status().IsInvalid());
  t.ca_file = "";
  t.cert_file = d.path + "/junk.crt";
  EXPECT_TRUE(TlsContext::Create(t).status().IsInvalid());  // a certificate without its key
}

// The whole path over TLS as the ACL user: blocks written, found, read back bit-identical
// through every master, under the default prefix and under a namespace.
TEST(SecureCluster, AclAndTlsRoundTrip) {
  KVTIER_REQUIRE_SECURE_CLUSTER();
  auto t = RemoteTier::Open(SecureOptions());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::mt19937_64 rng(std::random_device{}());
  const size_t len = 1474560;
  const uint64_t contract = rng();
  std::vector<std::vector<uint8_t>> data;
  std::vector<PutItem> puts(6);
  for (int i = 0; i < 6; ++i) data.push_back(RandomBytes(rng, len));
  for (int i = 0; i < 6; ++i) {
    puts[i] = PutItem{contract, Key128{rng(), rng()}, i ? puts[i - 1].key : Key128{}, data[i]};
    if (i >= 3) puts[i].ns = "tenant1";
  }
  ASSERT_EQ((*t)->PutBatch(puts), 6u);
  std::vector<Key128> keys;
  for (int i = 0; i < 3; ++i) keys.push_back(puts[i].key);
  EXPECT_EQ((*t)->ExistsPrefix(contract, keys), 3u);
  EXPECT_EQ((*t)->ExistsPrefix(contract, keys, "tenant1"), 0u);  // another namespace: not there

  std::vector<std::vector<uint8_t>> out(6, std::vector<uint8_t>(len, 0xEE));
  std::vector<GetItem> gets(6);
  for (int i = 0; i < 6; ++i) {
    gets[i] = GetItem{contract, puts[i].key, out[i], Status(), Key128{}};
    gets[i].ns = puts[i].ns;
  }
  (*t)->GetBatch(gets);
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(gets[i].status.ok()) << i << ": " << gets[i].status.ToString();
    EXPECT_EQ(out[i], data[i]) << i;
    EXPECT_EQ(gets[i].parent, puts[i].parent);
  }
  // Under the namespace the key is kvt:tenant1:{...}; asked without it, a miss.
  auto admin = SecureAdmin(SecureNodeList()[0]);
  ASSERT_TRUE(admin);
  const std::string nk = RedisKey("kvt:", "tenant1", contract, puts[3].key);
  const std::string master = (*t)->client().NodeForSlot(KeySlot(nk));
  auto owner = SecureAdmin(master);
  ASSERT_TRUE(owner);
  EXPECT_EQ(Cmd(*owner, {"EXISTS", nk}), "1");
  GetItem other{contract, puts[3].key, out[3], Status(), Key128{}};
  (*t)->GetBatch(std::span<GetItem>(&other, 1));
  EXPECT_TRUE(other.status.IsNotFound()) << other.status.ToString();
  EXPECT_EQ((*t)->stats().corrupt, 0u);
}

// Every connection authenticates, including those a MOVED or ASK redirect opens: the
// client starts from one seed, learns the others from CLUSTER SLOTS, and follows a slot
// moved under it to a master it had no connection to (the kvtier user has no right
// without AUTH: the default user is off).
TEST(SecureCluster, EveryConnectionAuthenticatesIncludingRedirects) {
  KVTIER_REQUIRE_SECURE_CLUSTER();
  ClusterOptions o = SecureClusterOptions();
  o.nodes = {SecureNodeList()[0]};
  auto c = ClusterClient::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::mt19937_64 rng(std::random_device{}());
  const std::string tag = "{resh" + std::to_string(rng()) + "}";
  const std::string k1 = "kvt:" + tag + "a", k2 = "kvt:" + tag + "b";
  const uint16_t slot = KeySlot(k1);
  std::vector<Command> set(2);
  set[0].argv = {"SET", k1, "one"};
  set[1].argv = {"SET", k2, "two"};
  (*c)->Exec(set);
  ASSERT_TRUE(set[0].status.ok() && set[1].status.ok()) << set[0].status.ToString();

  const std::string src = (*c)->NodeForSlot(slot);
  std::string dst;  // another master
  for (int sl : {0, 5461, 10923, 16383}) {
    const std::string n = (*c)->NodeForSlot(static_cast<uint16_t>(sl));
    if (n != src) dst = n;
  }
  ASSERT_FALSE(dst.empty());
  auto s = SecureAdmin(src), d = SecureAdmin(dst);
  ASSERT_TRUE(s && d);
  const std::string src_id = Cmd(*s, {"CLUSTER", "MYID"}), dst_id = Cmd(*d, {"CLUSTER", "MYID"});
  const std::string sl = std::to_string(slot);
  const std::string admin_pw = testing::ReadFirstLine(SecureDir() + "/admin.password");
  ASSERT_EQ(Cmd(*d, {"CLUSTER", "SETSLOT", sl, "IMPORTING", src_id}), "OK");
  ASSERT_EQ(Cmd(*s, {"CLUSTER", "SETSLOT", sl, "MIGRATING", dst_id}), "OK");
  const std::string dhost = dst.substr(0, dst.rfind(':')), dport = dst.substr(dst.rfind(':') + 1);
  ASSERT_EQ(Cmd(*s, {"MIGRATE", dhost, dport, "", "0", "5000", "AUTH2", "admin", admin_pw, "KEYS", k1}), "OK");
  const uint64_t connects_before = (*c)->stats().connects;

  std::vector<Command> get(2);
  get[0].argv = {"GET", k1};  // on dst now: src answers ASK
  get[1].argv = {"GET", k2};
  (*c)->Exec(get);
  ASSERT_TRUE(get[0].status.ok()) << get[0].status.ToString();
  ASSERT_TRUE(get[1].status.ok()) << get[1].status.ToString();
  ASSERT_EQ(get[0].reply->type, REDIS_REPLY_STRING);
  EXPECT_EQ(std::string(get[0].reply->str, get[0].reply->len), "one");
  EXPECT_EQ(std::string(get[1].reply->str, get[1].reply->len), "two");
  EXPECT_GE((*c)->stats().ask, 1u);
  EXPECT_GT((*c)->stats().connects, connects_before);  // a new connection, authenticated

  ASSERT_EQ(Cmd(*s, {"MIGRATE", dhost, dport, "", "0", "5000", "AUTH2", "admin", admin_pw, "KEYS", k2}), "OK");
  for (const auto& n : SecureNodeList()) {
    if (auto a = SecureAdmin(n)) (void)Cmd(*a, {"CLUSTER", "SETSLOT", sl, "NODE", dst_id});
  }
  (*c)->Exec(get);
  ASSERT_TRUE(get[0].status.ok() && get[1].status.ok()) << get[1].status.ToString();
  EXPECT_EQ(std::string(get[1].reply->str, get[1].reply->len), "two");
  EXPECT_GE((*c)->stats().moved, 1u);
  EXPECT_EQ((*c)->NodeForSlot(slot), dst);
}

// A wrong password is an error at start, saying so; nothing of the secret is in it, and
// no TierManager (no daemon) comes up with it, so nothing is served from the cluster.
TEST(SecureCluster, WrongPasswordIsAnErrorAtStart) {
  KVTIER_REQUIRE_SECURE_CLUSTER();
  TempDir d;
  RemoteOptions o = SecureOptions();
  o.password_file = d.path + "/pw";
  WriteFile(o.password_file, "not-the-password\n", 0600);
  auto t = RemoteTier::Open(o);
  ASSERT_EQ(t.status().code(), StatusCode::kRejected) << t.status().ToString();
  EXPECT_NE(t.status().message().find("AUTH as user \"kvtier\" refused"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("WRONGPASS"), std::string::npos) << t.status().message();
  EXPECT_EQ(t.status().message().find("not-the-password"), std::string::npos);

  tiers::TierManagerOptions to;
  to.slot_bytes = 4096;
  to.host.capacity_bytes = 64 * 4096;
  to.remote = o;
  auto tm = tiers::TierManager::Open(to);
  ASSERT_FALSE(tm.ok());
  EXPECT_NE(tm.status().message().find("WRONGPASS"), std::string::npos) << tm.status().message();

  // No password at all: the default user is off, CLUSTER SLOTS answers NOAUTH.
  o.user = "";
  o.password_file = "";
  t = RemoteTier::Open(o);
  ASSERT_EQ(t.status().code(), StatusCode::kRejected) << t.status().ToString();
  EXPECT_NE(t.status().message().find("NOAUTH"), std::string::npos) << t.status().message();
}

// A CA that did not sign the nodes' certificates, a name the certificates do not carry, or
// no client certificate where the nodes ask for one: errors at start naming the cause.
TEST(SecureCluster, UntrustedCertificateIsAnErrorAtStart) {
  KVTIER_REQUIRE_SECURE_CLUSTER();
  TempDir d;
  const std::string other_ca = d.path + "/other-ca.crt";
  const std::string gen = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
                          "-subj /CN=other -keyout " + d.path + "/other-ca.key -out " + other_ca + " 2>/dev/null";
  ASSERT_EQ(std::system(gen.c_str()), 0);
  RemoteOptions o = SecureOptions();
  o.tls.ca_file = other_ca;
  auto t = RemoteTier::Open(o);
  ASSERT_EQ(t.status().code(), StatusCode::kRejected) << t.status().ToString();
  EXPECT_NE(t.status().message().find("is not trusted: "), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("(see tls_ca_file)"), std::string::npos) << t.status().message();

  o = SecureOptions();
  o.tls.server_name = "kvtier.example";
  t = RemoteTier::Open(o);
  ASSERT_EQ(t.status().code(), StatusCode::kRejected) << t.status().ToString();
  EXPECT_NE(t.status().message().find("see tls_server_name"), std::string::npos) << t.status().message();
  o.tls.server_name = "localhost";  // a name the certificate carries
  EXPECT_TRUE(RemoteTier::Open(o).ok());

  o = SecureOptions();
  o.tls.cert_file = "";
  o.tls.key_file = "";
  t = RemoteTier::Open(o);
  ASSERT_EQ(t.status().code(), StatusCode::kRejected) << t.status().ToString();

  // Verification off: trusted blindly, and it works (the choice is the operator's).
  o = SecureOptions();
  o.tls.ca_file = "";
  o.tls.verify = false;
  EXPECT_TRUE(RemoteTier::Open(o).ok());
}

// The ACL confines the kvtier user to kvt:*: under another key prefix every write is
// refused (NOPERM), counted, and nothing is stored.
TEST(SecureCluster, AclConfinesTheUserToItsKeyPrefix) {
  KVTIER_REQUIRE_SECURE_CLUSTER();
  RemoteOptions o = SecureOptions();
  o.key_prefix = "other:";
  auto t = RemoteTier::Open(o);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::mt19937_64 rng(std::random_device{}());
  auto data = RandomBytes(rng, 4096);
  PutItem p{rng(), Key128{rng(), rng()}, Key128{}, data};
  EXPECT_EQ((*t)->PutBatch(std::span<const PutItem>(&p, 1)), 0u);
  EXPECT_EQ((*t)->stats().write_errors, 1u);
  const std::string k = RedisKey("other:", "", p.contract_id, p.key);
  auto owner = SecureAdmin((*t)->client().NodeForSlot(KeySlot(k)));
  ASSERT_TRUE(owner);
  EXPECT_EQ(Cmd(*owner, {"EXISTS", k}), "0");
}

// ---- kvtierd over ACL + TLS ------------------------------------------------------------

using kvtier::testing::CheckBlock;
using kvtier::testing::DaemonConfig;
using kvtier::testing::DaemonProcess;
using kvtier::testing::FillBlock;
using kvtier::testing::SmallContract;

constexpr size_t kBlockBytes = 576;  // SmallContract: 2 layers x 1 head x 16 dim x 16 tokens NVFP4

std::string SecureToml(const std::string& write, const std::string& password_file) {
  const TlsOptions t = SecureTls();
  std::string nodes;
  for (const auto& n : SecureNodeList()) nodes += (nodes.empty() ? "\"" : ", \"") + n + "\"";
  return "[tiers.remote]\nnodes = [" + nodes + "]\nwrite = \"" + write +
         "\"\nconnect_timeout_ms = 1000\ncommand_timeout_ms = 5000\nuser = \"kvtier\"\npassword_file = \"" +
         password_file + "\"\ntls = true\ntls_ca_file = \"" + t.ca_file + "\"\ntls_cert_file = \"" + t.cert_file +
         "\"\ntls_key_file = \"" + t.key_file + "\"\n";
}

struct Client {
  kvtier_client* c = nullptr;
  explicit Client(const std::string& sock) {
    kvtier_connect_options o{};
    o.name = "secure-test";
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
};

// Two daemons on the secure cluster: a block committed through A (write-through) is
// served through B, bit-identical, every byte having crossed TLS as the ACL user.
TEST(SecureFleet, StoredThroughAIsServedByBOverAclAndTls) {
  KVTIER_REQUIRE_SECURE_CLUSTER();
  const std::string pw = SecureDir() + "/kvtier.password";
  DaemonConfig ca, cb;
  ca.extra = SecureToml("write-through", pw);
  cb.extra = SecureToml("off", pw);
  DaemonProcess a(ca), b(cb);
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  Client xa(a.socket()), xb(b.socket());
  const uint64_t cid = xa.Register("secure/model");
  ASSERT_EQ(xb.Register("secure/model"), cid);
  std::vector<uint32_t> tokens(6 * 16);
  std::mt19937 rng(std::random_device{}());
  for (auto& t : tokens) t = rng();
  std::vector<kvtier_key> keys(6);
  size_t got = 0;
  ASSERT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), keys.size(), &got), KVTIER_OK);

  uint64_t lease = 0;
  std::vector<kvtier_slot> slots(keys.size());
  ASSERT_EQ(kvtier_alloc(xa.c, cid, keys.size(), KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK);
  uint64_t arena_bytes = 0;
  auto* arena = static_cast<uint8_t*>(kvtier_host_arena(xa.c, &arena_bytes));
  const uint64_t sb = kvtier_slot_bytes(xa.c);
  std::vector<kvtier_commit_item> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    FillBlock(arena + slots[i].slot * sb, kBlockBytes, cid, keys[i]);
    items[i] = {slots[i], keys[i], i == 0 ? kvtier_key{0, 0} : keys[i - 1]};
  }
  size_t done = 0;
  ASSERT_EQ(kvtier_commit(xa.c, cid, lease, items.data(), items.size(), &done), KVTIER_OK);
  ASSERT_EQ(kvtier_release(xa.c, lease), KVTIER_OK);
  ASSERT_EQ(a.WaitMetric("kvtier_tier_demotions_total{tier=\"remote\"}", 6), 6) << a.log();

  size_t n = 0;
  lease = 0;
  ASSERT_EQ(kvtier_acquire(xb.c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n), KVTIER_OK)
      << kvtier_last_error();
  ASSERT_EQ(n, keys.size()) << b.log();
  auto* barena = static_cast<uint8_t*>(kvtier_host_arena(xb.c, &arena_bytes));
  for (size_t i = 0; i < n; ++i) EXPECT_TRUE(CheckBlock(barena + slots[i].slot * sb, kBlockBytes, cid, keys[i])) << i;
  EXPECT_EQ(kvtier_release(xb.c, lease), KVTIER_OK);
  EXPECT_EQ(kvtier::testing::MetricValue(b.Metrics(), "kvtier_tier_hits_total{tier=\"remote\"}"), 6);
}

// kvtierd does not start with a wrong password, a password file open to others, or a CA
// that did not sign the nodes: one line says which, and nothing is served.
TEST(SecureFleet, KvtierdDoesNotStartWithAWrongSecret) {
  KVTIER_REQUIRE_SECURE_CLUSTER();
  TempDir d;
  const std::string wrong = d.path + "/wrong.password";
  WriteFile(wrong, "not-the-password\n", 0600);
  {
    DaemonConfig c;
    c.extra = SecureToml("off", wrong);
    DaemonProcess p(c);
    EXPECT_FALSE(p.Start());
    EXPECT_NE(p.log().find("AUTH as user \"kvtier\" refused"), std::string::npos) << p.log();
    EXPECT_EQ(p.log().find("not-the-password"), std::string::npos);
    EXPECT_FALSE(p.CanConnect());
  }
  {
    const std::string open = d.path + "/open.password";
    std::filesystem::copy_file(SecureDir() + "/kvtier.password", open);
    ASSERT_EQ(::chmod(open.c_str(), 0644), 0);
    DaemonConfig c;
    c.extra = SecureToml("off", open);
    DaemonProcess p(c);
    EXPECT_FALSE(p.Start());
    EXPECT_NE(p.log().find("is open to others (mode 0644)"), std::string::npos) << p.log();
  }
  {
    const std::string other_ca = d.path + "/other-ca.crt";
    const std::string gen = "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
                            "-subj /CN=other -keyout " + d.path + "/other-ca.key -out " + other_ca + " 2>/dev/null";
    ASSERT_EQ(std::system(gen.c_str()), 0);
    DaemonConfig c;
    c.extra = SecureToml("off", SecureDir() + "/kvtier.password");
    const std::string ca_line = "tls_ca_file = \"" + SecureTls().ca_file + "\"";
    c.extra.replace(c.extra.find(ca_line), ca_line.size(), "tls_ca_file = \"" + other_ca + "\"");
    DaemonProcess p(c);
    EXPECT_FALSE(p.Start());
    EXPECT_NE(p.log().find("is not trusted"), std::string::npos) << p.log();
  }
}

}  // namespace
}  // namespace kvtier::remote
