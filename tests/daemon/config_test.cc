// kvtier_config: schema, defaults, overrides, validation messages that name the key.
#include <gtest/gtest.h>

#include <tuple>

#include "config/config.h"

namespace kvtier::config {
namespace {

TEST(Config, DefaultsAreValid) {
  auto c = LoadString("", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tiers.slot_bytes, 1474560u);
  EXPECT_EQ(c->tiers.host.capacity_bytes, uint64_t{1} << 30);
  EXPECT_EQ(c->tiers.hbm.capacity_bytes, 0u);
  EXPECT_EQ(c->daemon.ring_entries, 256u);
  EXPECT_EQ(c->tiers.host.policy, "lru");  // the default that never loses to lru (docs/replay.md)
  EXPECT_EQ(c->tiers.hbm.policy, "lru");
  EXPECT_TRUE(c->tiers.policy.reuse_adapt);
  EXPECT_FALSE(c->tiers.policy.reuse_density);
}

TEST(Config, ShippedExampleLoads) {
  auto c = LoadFile(std::string(KVTIER_SOURCE_DIR) + "/config/kvtier.toml", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tiers.host.policy, "lru");
  EXPECT_EQ(c->tiers.nvme.tier.policy, "lru");
  EXPECT_EQ(c->tiers.nvme.dir, "./kvtier-data/nvme");
  EXPECT_EQ(c->tiers.nvme.tier.capacity_bytes, uint64_t{2} << 30);
  EXPECT_DOUBLE_EQ(c->tiers.nvme.daily_write_budget_per_client, 0.5);
}

// The shipped file makes slot sizes per contract: slot_bytes names the largest block
// (64 MiB), no class is fixed at start, and the listed-class checks (slabs, NVMe slabs,
// capacities of one slot_bytes) do not apply: a host tier smaller than the limit starts.
TEST(Config, ShippedExampleMakesSlotsPerContract) {
  auto c = LoadFile(std::string(KVTIER_SOURCE_DIR) + "/config/kvtier.toml", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->tiers.slot_classes_per_contract);
  EXPECT_FALSE(c->tiers.slot_classes_auto);
  EXPECT_EQ(c->tiers.slot_bytes, uint64_t{64} << 20);
  EXPECT_TRUE(c->tiers.SlotClasses().empty());
  auto small = LoadFile(std::string(KVTIER_SOURCE_DIR) + "/config/kvtier.toml",
                        {{"tiers.host.capacity", "16MiB"}, {"tiers.nvme.capacity", "32MiB"}});
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  // --set selects it too, and another value gives the listed classes back.
  auto set = LoadString("", {{"tiers.slot_classes", "per-contract"}, {"tiers.slot_bytes", "8MiB"}});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_TRUE(set->tiers.slot_classes_per_contract);
  auto back = LoadString("[tiers]\nslot_classes = \"per-contract\"\n", {{"tiers.slot_classes", "auto"}});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->tiers.slot_classes_per_contract);
  EXPECT_TRUE(back->tiers.slot_classes_auto);
  // Refusals name the key and change nothing: a misspelt mode, a limit that is no 4 KiB
  // multiple or past 4 GiB, a tier of less than 4 KiB.
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"tiers.slot_classes", "per contract"},
           {"tiers.slot_classes", "\"percontract\""},
           {"tiers.slot_bytes", "5000"},
           {"tiers.slot_bytes", "8GiB"},
           {"tiers.host.capacity", "2KiB"}}) {
    auto bad = LoadFile(std::string(KVTIER_SOURCE_DIR) + "/config/kvtier.toml", {{key, value}});
    ASSERT_FALSE(bad.ok()) << key << "=" << value;
    EXPECT_NE(bad.status().message().find(key), std::string::npos) << bad.status().ToString();
  }
}

TEST(Config, ValuesAndOverrides) {
  auto c = LoadString(
      "[daemon]\nlog_level = \"debug\"\n[tiers.host]\ncapacity = \"512MiB\"\nlow_watermark = 0.5\n",
      {{"tiers.host.capacity", "2GiB"}, {"tiers.nvme.dir", "/tmp/x y"}, {"daemon.metrics_port", "0"},
       {"tiers.nvme.verify_on_restart", "false"}, {"daemon.socket", "\"/tmp/s.sock\""}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->daemon.log_level, "debug");
  EXPECT_EQ(c->tiers.host.capacity_bytes, uint64_t{2} << 30);  // --set wins over the file
  EXPECT_DOUBLE_EQ(c->tiers.host.low_watermark, 0.5);
  EXPECT_EQ(c->tiers.nvme.dir, "/tmp/x y");  // bare string
  EXPECT_EQ(c->daemon.metrics_port, 0u);
  EXPECT_FALSE(c->tiers.nvme.verify_on_restart);
  EXPECT_EQ(c->daemon.socket, "/tmp/s.sock");
}

struct BadCase {
  const char* toml;
  std::vector<Override> overrides;
  const char* key;  // the message must start with this key
  const char* also;  // and contain this
};

TEST(Config, ErrorsNameTheKey) {
  const BadCase cases[] = {
      {"[daemon]\nsockett = \"x\"\n", {}, "daemon.sockett", "unknown key"},
      {"[deamon]\n", {}, "deamon", "unknown section"},
      {"[tiers.host]\ncapacity = \"4GiX\"\n", {}, "tiers.host.capacity", "bad size"},
      {"[tiers.host]\ncapacity = \"-1GiB\"\n", {}, "tiers.host.capacity", "bad size"},
      {"[tiers.host]\nlow_watermark = 0.9\nhigh_watermark = 0.8\n", {}, "tiers.host.low_watermark",
       "below"},
      {"[tiers.nvme]\nhigh_watermark = 1.5\n", {}, "tiers.nvme.high_watermark", "(0, 1]"},
      {"[tiers.hbm]\npolicy = \"fifo\"\n", {}, "tiers.hbm.policy", "prefix-lru"},
      {"[tiers.host]\npolicy = \"oracle\"\n", {}, "tiers.host.policy", "sieve, arc, reuse"},
      {"", {{"tiers.nvme.policy", "LRU"}}, "tiers.nvme.policy", "not one of"},
      {"[tiers.policy]\nreuse_ghost_factor = 20\n", {}, "tiers.policy.reuse_ghost_factor", "[0, 16]"},
      {"[tiers.policy]\ns3fifo_small_fraction = 0\n", {}, "tiers.policy.s3fifo_small_fraction", "(0, 1)"},
      {"[tiers.policy]\nreuse_density = 3\n", {}, "tiers.policy.reuse_density", "true or false"},
      {"[tiers.policy]\nreuse_adapt = 1\n", {}, "tiers.policy.reuse_adapt", "true or false"},
      {"[tiers.policy]\ntinylfu_window_fraction = 1\n", {}, "tiers.policy.tinylfu_window_fraction", "(0, 1)"},
      {"[tiers.policy]\nreuse_tail = 0.1\n", {}, "tiers.policy.reuse_tail", "unknown key"},
      {"[daemon]\nring_entries = 100\n", {}, "daemon.ring_entries", "power of two"},
      {"[daemon]\nmetrics_port = 70000\n", {}, "daemon.metrics_port", "65535"},
      {"[daemon]\nmetrics_address = \"0.0.0.0\"\n", {}, "daemon.metrics_address", "loopback"},
      {"[daemon]\nlog_level = \"loud\"\n", {}, "daemon.log_level", "trace"},
      {"[tiers]\nslot_bytes = \"1000\"\n", {}, "tiers.slot_bytes", "4096"},
      {"[tiers.host]\ncapacity = 0\n", {}, "tiers.host.capacity", "nowhere"},
      {"[tiers.nvme]\nadmission = \"third-hit\"\n", {}, "tiers.nvme.admission", "second-hit"},
      {"[tiers.nvme]\non_evict = \"demote\"\n", {}, "tiers.nvme.on_evict", "only drop"},
      {"[tiers.nvme]\ndaily_write_budget_per_client = 0\n", {}, "tiers.nvme.daily_write_budget_per_client",
       "(0, 1]"},
      {"", {{"tiers.nvme.daily_write_budget_per_client", "1.5"}}, "tiers.nvme.daily_write_budget_per_client",
       "(0, 1]"},
      {"[daemon]\nmax_clients = \"many\"\n", {}, "daemon.max_clients", "integer"},
      {"", {{"tiers.host.capacty", "1GiB"}}, "tiers.host.capacty", "unknown key"},
      {"", {{"tiers.host.capacity", "lots"}}, "tiers.host.capacity", "bad size"},
      {"[tiers.hbm]\ncopy = \"dma\"\n", {}, "tiers.hbm.copy", "auto, kernel, batch or loop"},
      {"", {{"tiers.hbm.copy_streams", "9"}}, "tiers.hbm.copy_streams", "[1, 8]"},
      {"", {{"tiers.hbm.copy_streams", "0"}}, "tiers.hbm.copy_streams", "[1, 8]"},
      {"[daemon]\ntrace_copies = 1\n", {}, "daemon.trace_copies", "true or false"},
  };
  for (const auto& bc : cases) {
    auto c = LoadString(bc.toml, bc.overrides, "test.toml");
    ASSERT_FALSE(c.ok()) << bc.toml;
    const std::string& m = c.status().message();
    EXPECT_EQ(m.rfind(bc.key, 0), 0u) << m;
    EXPECT_NE(m.find(bc.also), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
  }
}

TEST(Config, SecurityAndTenants) {
  auto d = LoadString("", {});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->security.socket_mode, 0660u);
  EXPECT_EQ(d->security.unmatched, "default");
  EXPECT_TRUE(d->security.admin_uids.empty());
  EXPECT_TRUE(d->tenants.empty());
  auto c = LoadString(
      "[security]\nsocket_mode = 0o600\nsocket_group = \"kvtier\"\nadmin_uids = [1000, 0]\nunmatched = \"refuse\"\n"
      "[[tenants]]\nname = \"team-a\"\nuids = [1001]\nhost_share = 0.5\nadmin = true\n"
      "[[tenants]]\nname = \"team-b\"\ngids = [2000, 2001]\nhost_share = 0.25\nnvme_share = 1\n",
      {{"security.attach_gids", "[77]"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->security.socket_mode, 0600u);
  EXPECT_EQ(c->security.socket_group, "kvtier");
  EXPECT_EQ(c->security.admin_uids, (std::vector<uint32_t>{1000, 0}));
  EXPECT_EQ(c->security.attach_gids, (std::vector<uint32_t>{77}));
  ASSERT_EQ(c->tenants.size(), 2u);
  EXPECT_EQ(c->tenants[0].name, "team-a");
  EXPECT_EQ(c->tenants[0].uids, (std::vector<uint32_t>{1001}));
  EXPECT_TRUE(c->tenants[0].admin);
  EXPECT_DOUBLE_EQ(c->tenants[1].host_share, 0.25);
  EXPECT_DOUBLE_EQ(c->tenants[1].nvme_share, 1.0);
  EXPECT_EQ(c->tenants[1].gids, (std::vector<uint32_t>{2000, 2001}));
  auto m = LoadString("[security]\nsocket_mode = \"0640\"\n", {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->security.socket_mode, 0640u);
  auto inl = LoadString("", {{"tenants", "[{name = \"x\", uids = [5]}]"}});
  ASSERT_TRUE(inl.ok()) << inl.status().ToString();
  ASSERT_EQ(inl->tenants.size(), 1u);
}

TEST(Config, SecurityAndTenantErrorsNameTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"[security]\nsocket_mode = 660\n", "security.socket_mode: 660 is not a mode"},
      {"[security]\nsocket_mode = \"0968\"\n", "security.socket_mode: \"0968\" is not an octal mode"},
      {"[security]\nunmatched = \"maybe\"\n", "security.unmatched: \"maybe\" is not default or refuse"},
      {"[security]\nadmin_uids = [-1]\n", "security.admin_uids: id -1 not in"},
      {"[security]\nadmin_uids = 5\n", "security.admin_uids: expected an array of integers"},
      {"[security]\nsocket_owner = \"a b\"\n", "security.socket_owner: \"a b\" is not a user/group name"},
      {"[tenants]\nname = \"a\"\n", "tenants: expected [[tenants]] tables"},
      {"[[tenants]]\nuids = [1]\n", "tenants[0].name: missing"},
      {"[[tenants]]\nname = \"a\"\n", "tenants[0]: tenant \"a\" has neither uids nor gids"},
      {"[[tenants]]\nname = \"a b\"\nuids = [1]\n", "tenants[0].name: \"a b\" is not 1-64 characters"},
      {"[[tenants]]\nname = \"shared\"\nuids = [1]\n", "tenants[0].name: \"shared\" is reserved"},
      {"[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"a\"\nuids = [2]\n",
       "tenants[1].name: tenant \"a\" twice"},
      {"[[tenants]]\nname = \"a\"\nuids = [1]\n[[tenants]]\nname = \"b\"\nuids = [1]\n",
       "tenants[1].uids: uid 1 is in tenants \"a\" and \"b\""},
      {"[[tenants]]\nname = \"a\"\ngids = [9]\n[[tenants]]\nname = \"b\"\ngids = [9]\n",
       "tenants[1].gids: gid 9 is in tenants \"a\" and \"b\""},
      {"[[tenants]]\nname = \"a\"\nuids = [1]\nhost_share = 1.5\n", "tenants[0].host_share: 1.5 not in [0, 1]"},
      {"[[tenants]]\nname = \"a\"\nuids = [1]\nhost_share = 0.6\n[[tenants]]\nname = \"b\"\nuids = [2]\n"
       "host_share = 0.6\n",
       "tenants[1].host_share: the tenants' host_shares add up to 1.2, over 1"},
      {"[[tenants]]\nname = \"a\"\nuids = [1]\nquota = 3\n", "tenants[0].quota: unknown key"},
      {"[[tenants]]\nname = \"a\"\nuids = [1]\nadmin = 1\n", "tenants[0].admin: expected true or false"},
  };
  for (const auto& [text, want] : cases) {
    auto c = LoadString(text, {});
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_NE(c.status().message().find(want), std::string::npos) << text << " -> " << c.status().message();
  }
}

TEST(Config, SyntaxErrorNamesFileAndLine) {
  auto c = LoadString("[daemon]\nsocket = \n", {}, "my.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message().rfind("my.toml:2:", 0), 0u) << c.status().message();
}

TEST(Config, ParseSize) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("4KiB"), 4096u);
  EXPECT_EQ(*ParseSize("1.5GiB"), 1610612736u);
  EXPECT_EQ(*ParseSize("10GB"), 10000000000u);
  EXPECT_EQ(*ParseSize("1440KiB"), 1474560u);
  for (const char* bad : {"", "GiB", "4 GiBs", "1.5B", "-4", "4gib", "0x10"}) {
    EXPECT_FALSE(ParseSize(bad).ok()) << bad;
  }
}

// The HBM copy method and the copy trace are config keys (they were environment variables).
TEST(Config, HbmCopyKeys) {
  auto d = LoadString("", {});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tiers.hbm_copy, "auto");
  EXPECT_EQ(d->tiers.hbm_copy_streams, 1u);
  EXPECT_FALSE(d->daemon.trace_copies);
  auto c = LoadString("[daemon]\ntrace_copies = true\n[tiers.hbm]\ncopy = \"batch\"\n",
                      {{"tiers.hbm.copy_streams", "4"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tiers.hbm_copy, "batch");
  EXPECT_EQ(c->tiers.hbm_copy_streams, 4u);
  EXPECT_TRUE(c->daemon.trace_copies);
}

// The staging keys: tiers.host.staging_slots_per_client is at most the host tier's slots of
// the smallest class (7,281 of 144 KiB in 1 GiB); tiers.host.staging_bytes_total, the
// memory of every client's staging together, is a size, 0 = the host tier's.
TEST(Config, StagingKeys) {
  auto d = LoadString("", {});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tiers.host_staging_slots_per_client, 0u);
  EXPECT_EQ(d->tiers.host_staging_bytes_total, 0u);
  auto c = LoadString("[tiers.host]\nstaging_bytes_total = \"64MiB\"\nstaging_slots_per_client = 7281\n", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tiers.host_staging_bytes_total, 64ull << 20);
  EXPECT_EQ(c->tiers.host_staging_slots_per_client, 7281u);
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"tiers.host.staging_slots_per_client", "7282"},
           {"tiers.host.staging_bytes_total", "-1"},
           {"tiers.host.staging_bytes_total", "lots"}}) {
    auto bad = LoadString("", {{key, value}});
    ASSERT_FALSE(bad.ok()) << key << "=" << value;
    EXPECT_NE(bad.status().message().find(key), std::string::npos) << bad.status().ToString();
  }
}

// tiers.slot_classes (an array of sizes, or one comma-separated string for --set) and
// tiers.slab_bytes: defaults, values, and refusals that name the key.
TEST(Config, SlotClassKeys) {
  auto d = LoadString("", {});
  ASSERT_TRUE(d.ok());
  // The default ("auto"): slot_bytes and the common block sizes below it, in slabs of their
  // least common multiple.
  EXPECT_TRUE(d->tiers.slot_classes_auto);
  EXPECT_EQ(d->tiers.SlotClasses(), (std::vector<uint64_t>{144 << 10, 576 << 10, 720 << 10, 1440 << 10}));
  EXPECT_EQ(d->tiers.SlabBytes(), 2880ull << 10);
  // "auto" with a slot size below every common size, or a host tier smaller than a slab:
  // one class; an explicit [] too.
  for (const auto& set : std::vector<std::vector<Override>>{{{"tiers.slot_bytes", "64KiB"}},
                                                            {{"tiers.host.capacity", "2MiB"}},
                                                            {{"tiers.slot_classes", "[]"}}}) {
    auto one = LoadString("", set);
    ASSERT_TRUE(one.ok()) << one.status().ToString();
    EXPECT_TRUE(one->tiers.SlotClasses().empty()) << set[0].key;
  }
  // Beside a larger slot_bytes whose least common multiple with them passes 64 MiB: 64 MiB.
  auto big = LoadString("", {{"tiers.slot_bytes", "2MiB"}});
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->tiers.SlotClasses(), (std::vector<uint64_t>{144 << 10, 576 << 10, 720 << 10, 2048 << 10}));
  EXPECT_EQ(big->tiers.SlabBytes(), 64ull << 20);
  auto c = LoadString("[tiers]\nslot_classes = [\"576KiB\", 1474560]\nslab_bytes = \"32MiB\"\n", {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tiers.slot_classes, (std::vector<uint64_t>{576 << 10, 1474560}));
  EXPECT_EQ(c->tiers.slab_bytes, 32ull << 20);
  auto o = LoadString("", {{"tiers.slot_classes", "576KiB,1440KiB"}});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->tiers.slot_classes, (std::vector<uint64_t>{576 << 10, 1440 << 10}));
  EXPECT_EQ(o->tiers.SlabBytes(), 2880ull << 10);  // slab_bytes "auto"
  for (const auto& [key, value, named] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"tiers.slot_classes", "576KiB,1000", "tiers.slot_classes"},
           {"tiers.slot_classes", "576KiB,576KiB,1440KiB", "tiers.slot_classes"},
           {"tiers.slot_classes", "576KiB,1024KiB", "tiers.slot_classes"},  // largest is not slot_bytes
           {"tiers.slot_classes", "lots", "tiers.slot_classes"},
           {"tiers.slab_bytes", "0", "tiers.slab_bytes"}}) {
    auto bad = LoadString("", {{key, value}});
    ASSERT_FALSE(bad.ok()) << key << "=" << value;
    EXPECT_NE(bad.status().message().find(named), std::string::npos) << bad.status().ToString();
  }
  auto slab = LoadString("", {{"tiers.slot_classes", "576KiB,1440KiB"}, {"tiers.slab_bytes", "1MiB"}});
  ASSERT_FALSE(slab.ok());
  EXPECT_NE(slab.status().message().find("tiers.slab_bytes"), std::string::npos) << slab.status().ToString();
  // tiers.nvme.slab_bytes: 64 MiB by default (not the host's slab: a record is 4 KiB
  // larger than its class); a value that holds no record of slot_bytes is refused by name.
  EXPECT_EQ(d->tiers.nvme.slab_bytes, 64ull << 20);
  auto n = LoadString("[tiers.nvme]\nslab_bytes = \"32MiB\"\n", {});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->tiers.nvme.slab_bytes, 32ull << 20);
  for (const char* v : {"1440KiB", "1000000", "2GiB"}) {
    auto bad = LoadString("", {{"tiers.nvme.slab_bytes", v}});
    ASSERT_FALSE(bad.ok()) << v;
    EXPECT_NE(bad.status().message().find("tiers.nvme.slab_bytes"), std::string::npos) << bad.status().ToString();
  }
  // With listed classes, tiers.nvme.capacity must hold a record of a slot (slot_bytes +
  // 4 KiB); 0 turns the tier off. (Per contract it caps the blocks instead.)
  auto small = LoadString("", {{"tiers.slot_bytes", "1MiB"}, {"tiers.nvme.capacity", "1MiB"}});
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("tiers.nvme.capacity"), std::string::npos) << small.status().ToString();
  EXPECT_NE(small.status().message().find("1052672 bytes"), std::string::npos) << small.status().ToString();
  auto fits = LoadString("", {{"tiers.slot_bytes", "1MiB"}, {"tiers.nvme.capacity", "1028KiB"}});
  EXPECT_TRUE(fits.ok()) << fits.status().ToString();
  auto off = LoadString("", {{"tiers.slot_bytes", "1MiB"}, {"tiers.nvme.capacity", "0"}});
  EXPECT_TRUE(off.ok()) << off.status().ToString();
}

// [tiers.remote] authentication, TLS and key prefix: defaults (today's keys, no AUTH, no
// TLS, verification on), values, and the combinations refused with the key named.
TEST(Config, RemoteSecurityKeys) {
  auto d = LoadString("", {});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tiers.remote.key_prefix, "kvt:");
  EXPECT_EQ(d->tiers.remote.user, "");
  EXPECT_EQ(d->tiers.remote.password_file, "");
  EXPECT_FALSE(d->tiers.remote.tls);
  EXPECT_TRUE(d->tiers.remote.tls_verify);
  auto c = LoadString(
      "[tiers.remote]\nuser = \"kvtier\"\npassword_file = \"/etc/kvtier/redis.password\"\ntls = true\n"
      "tls_ca_file = \"/etc/kvtier/ca.crt\"\ntls_cert_file = \"c.crt\"\ntls_key_file = \"c.key\"\n"
      "tls_server_name = \"redis.internal\"\nkey_prefix = \"fleet-a:\"\n",
      {{"tiers.remote.tls_verify", "false"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tiers.remote.user, "kvtier");
  EXPECT_EQ(c->tiers.remote.password_file, "/etc/kvtier/redis.password");
  EXPECT_TRUE(c->tiers.remote.tls);
  EXPECT_EQ(c->tiers.remote.tls_server_name, "redis.internal");
  EXPECT_EQ(c->tiers.remote.key_prefix, "fleet-a:");
  EXPECT_FALSE(c->tiers.remote.tls_verify);
  const BadCase cases[] = {
      {"[tiers.remote]\nuser = \"kvtier\"\n", {}, "tiers.remote.user", "password_file"},
      {"[tiers.remote]\npassword = \"hunter2\"\n", {}, "tiers.remote.password", "unknown key"},
      {"[tiers.remote]\ntls_ca_file = \"ca.crt\"\n", {}, "tiers.remote.tls_ca_file", "tls = false"},
      {"[tiers.remote]\ntls = true\ntls_cert_file = \"c.crt\"\n", {}, "tiers.remote.tls_cert_file", "tls_key_file"},
      {"[tiers.remote]\ntls = true\ntls_key_file = \"c.key\"\n", {}, "tiers.remote.tls_key_file", "tls_cert_file"},
      {"[tiers.remote]\nkey_prefix = \"kvt:{a}\"\n", {}, "tiers.remote.key_prefix", "braces"},
      {"[tiers.remote]\nkey_prefix = \"a b\"\n", {}, "tiers.remote.key_prefix", "spaces"},
      {"[tiers.remote]\ntls = \"yes\"\n", {}, "tiers.remote.tls", "true or false"},
  };
  for (const auto& bc : cases) {
    auto r = LoadString(bc.toml, bc.overrides, "test.toml");
    ASSERT_FALSE(r.ok()) << bc.toml;
    const std::string& m = r.status().message();
    EXPECT_EQ(m.rfind(bc.key, 0), 0u) << m;
    EXPECT_NE(m.find(bc.also), std::string::npos) << m;
  }
}

// The config file, --set and the CLI flags share one size grammar (formats/size.h).
TEST(Config, SizesTakeTheCliGrammar) {
  auto c = LoadString("[tiers.host]\ncapacity = \"2G\"\n[tiers.nvme]\ncapacity = \"3G\"\n",
                      {{"tiers.host.capacity", "4G"}, {"daemon.ring_data_bytes", "8M"}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->tiers.host.capacity_bytes, uint64_t{4} << 30);
  EXPECT_EQ(c->tiers.nvme.tier.capacity_bytes, uint64_t{3} << 30);
  EXPECT_EQ(c->daemon.ring_data_bytes, uint64_t{8} << 20);
  auto o = ParseOverride("tiers.host.capacity=4G");
  ASSERT_TRUE(o.ok());
  auto d = LoadString("", {*o});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->tiers.host.capacity_bytes, uint64_t{4} << 30);
}

TEST(Config, ParseOverride) {
  auto o = ParseOverride("tiers.host.capacity=4GiB");
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->key, "tiers.host.capacity");
  EXPECT_EQ(o->value, "4GiB");
  EXPECT_FALSE(ParseOverride("novalue").ok());
  EXPECT_FALSE(ParseOverride("=x").ok());
}

TEST(Config, CheckPathsRefusesAFileAsFolder) {
  auto c = LoadString("", {{"tiers.nvme.dir", "/etc/passwd/nvme"}});
  ASSERT_TRUE(c.ok());
  Status s = c->CheckPaths();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message().rfind("tiers.nvme.dir", 0), 0u) << s.message();
}

}  // namespace
}  // namespace kvtier::config
