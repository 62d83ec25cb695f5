// kvtierctl operator commands against real kvtierd processes: stats, tiers, contracts,
// ls, inspect, verify (with a record corrupted on disk), evict (key and contract),
// flush, config check / reload, export -> import into a fresh daemon (byte-identical),
// truncated / flipped / refused export files (nothing stored), and the clear one-line
// errors for a missing daemon, a wrong socket and an unknown key.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/contract.h"
#include "formats/layout.h"
#include "formats/nvfp4.h"
#include "kvtier/kvtier.h"
#include "tests/daemon/harness.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::DaemonConfig;
using testing::DaemonProcess;
using testing::TempDir;

struct Result {
  int code = -1;
  std::string out, err;
};

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs bin/kvtierctl --socket SOCK args...; stdout and stderr through files.
Result Ctl(const std::string& sock, const std::vector<std::string>& args, const std::string& dir) {
  const fs::path out = fs::path(dir) / "ctl.out", err = fs::path(dir) / "ctl.err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (!std::freopen(out.c_str(), "w", stdout) || !std::freopen(err.c_str(), "w", stderr)) ::_exit(126);
    std::string bin = std::string(KVTIER_BIN_DIR) + "/kvtierctl";
    std::vector<std::string> all{bin, "--socket", sock};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = Slurp(out);
  r.err = Slurp(err);
  return r;
}

// 2 layers x 2 heads x 64 dims x 16 tokens NVFP4: 4608-byte blocks in 8 KiB slots.
kvtier_contract_desc Desc() {
  kvtier_contract_desc d{};
  d.model_id = "kvtier/ops-test";
  d.num_layers = 2;
  d.num_kv_heads = 2;
  d.head_dim = 64;
  d.block_tokens = 16;
  d.tp_size = 1;
  d.kv_format = 0;
  return d;
}

// An NVFP4 block quantized from Gaussian values (what real payloads look like).
std::vector<uint8_t> Nvfp4Block(uint32_t seed) {
  const Geometry g{2, 2, 64, 16};
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint8_t> out(BlockBytes(KvFormat::kNvfp4, g));
  const size_t values = size_t{g.num_kv_heads} * g.block_tokens * g.head_dim;
  const PageLayout p = MakePageLayout(KvFormat::kNvfp4, g);
  std::vector<float> x(values);
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (auto [data, scales] : {std::pair{p.k_data, p.k_scale}, std::pair{p.v_data, p.v_scale}}) {
      for (auto& v : x) v = dist(rng);
      uint8_t* page = out.data() + PageOffset(KvFormat::kNvfp4, g, l);
      nvfp4::QuantizeUnchecked(x.data(), values, 0.01f, nvfp4::ScaleRule::kMax6, page + data, page + scales);
    }
  }
  return out;
}

DaemonConfig Cfg() {
  DaemonConfig c;
  c.slot_bytes = "8KiB";
  c.host_capacity = "512KiB";  // 64 slots
  c.nvme_capacity = "4MiB";
  return c;
}

class KvtierctlOps : public ::testing::Test {
 protected:
  void SetUp() override {
    d_ = std::make_unique<DaemonProcess>(Cfg());
    ASSERT_TRUE(d_->Start()) << d_->log();
  }
  void TearDown() override {
    if (c_) kvtier_close(c_);
  }

  kvtier_client* Client(DaemonProcess* d) {
    kvtier_connect_options o{};
    o.name = "ops-test";
    kvtier_client* c = nullptr;
    EXPECT_EQ(kvtier_connect(d->socket().c_str(), &o, &c), KVTIER_OK) << kvtier_last_error();
    return c;
  }

  // Stores n chained NVFP4 blocks in the host tier; keys_ and blocks_ get them.
  void Store(int n) {
    c_ = Client(d_.get());
    ASSERT_NE(c_, nullptr);
    kvtier_contract_desc d = Desc();
    ASSERT_EQ(kvtier_register_contract(c_, &d, &cid_), KVTIER_OK) << kvtier_last_error();
    uint64_t arena_bytes = 0;
    auto* arena = static_cast<uint8_t*>(kvtier_host_arena(c_, &arena_bytes));
    ASSERT_NE(arena, nullptr);
    const uint64_t slot = kvtier_slot_bytes(c_);
    kvtier_key parent{0, 0};
    for (int i = 0; i < n; ++i) {
      uint64_t lease = 0;
      kvtier_slot s{};
      ASSERT_EQ(kvtier_alloc(c_, cid_, 1, KVTIER_TIER_HOST, &lease, &s), KVTIER_OK) << kvtier_last_error();
      blocks_.push_back(Nvfp4Block(static_cast<uint32_t>(i) + 11));
      std::memcpy(arena + uint64_t{s.slot} * slot, blocks_.back().data(), blocks_.back().size());
      const kvtier_key k{0x1000u + static_cast<uint64_t>(i), 0xC0FFEEull * (i + 3)};
      kvtier_commit_item it{s, k, parent};
      ASSERT_EQ(kvtier_commit(c_, cid_, lease, &it, 1, nullptr), KVTIER_OK) << kvtier_last_error();
      ASSERT_EQ(kvtier_release(c_, lease), KVTIER_OK);
      keys_.push_back(k);
      parent = k;
    }
  }

  Result Run(const std::vector<std::string>& args) { return Ctl(d_->socket(), args, dir_.path()); }
  json RunJson(const std::vector<std::string>& args) {
    Result r = Run(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return json::parse(r.out, nullptr, false);
  }
  static std::string Hex(const kvtier_key& k) { return Key128{k.hi, k.lo}.ToHex(); }
  std::string Cid() const { return ContractIdHex(cid_); }

  TempDir dir_;
  std::unique_ptr<DaemonProcess> d_;
  kvtier_client* c_ = nullptr;
  uint64_t cid_ = 0;
  std::vector<kvtier_key> keys_;
  std::vector<std::vector<uint8_t>> blocks_;
};

uint64_t TierBlocks(const json& stats, const std::string& tier) {
  for (const auto& t : stats["tiers"]) {
    if (t["tier"] == tier) return t["blocks"].get<uint64_t>();
  }
  return UINT64_MAX;
}

TEST_F(KvtierctlOps, StatsTiersAndContracts) {
  Store(10);
  json s = RunJson({"stats", "--json"});
  ASSERT_FALSE(s.is_discarded());
  EXPECT_EQ(TierBlocks(s, "host"), 10u);
  for (const auto& t : s["tiers"]) {
    if (t["tier"] != "host") continue;
    EXPECT_EQ(t["capacity_bytes"].get<uint64_t>(), 64u * 8192);
    ASSERT_EQ(t["per_contract"].size(), 1u);
    EXPECT_EQ(t["per_contract"][0]["capacity_tokens"].get<uint64_t>(), 64u * 16);
    const uint64_t scale = BlockScaleBytes(KvFormat::kNvfp4, Geometry{2, 2, 64, 16});
    EXPECT_EQ(t["scale_bytes"].get<uint64_t>(), 10 * scale);
    EXPECT_EQ(t["payload_bytes"].get<uint64_t>(), 10 * (blocks_[0].size() - scale));
    // The remote tier's counters travel for every tier (0 where there is no remote).
    EXPECT_EQ(t["errors"].get<uint64_t>(), 0u);
    EXPECT_EQ(t["write_errors"].get<uint64_t>(), 0u);
  }
  Result human = Run({"stats"});
  EXPECT_EQ(human.code, 0) << human.err;
  EXPECT_NE(human.out.find("ERRORS"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("host"), std::string::npos);
  EXPECT_NE(human.out.find("capacity in tokens per contract"), std::string::npos);

  Result tiers = Run({"tiers"});
  EXPECT_EQ(tiers.code, 0) << tiers.err;
  EXPECT_NE(tiers.out.find("nvme"), std::string::npos);

  json c = RunJson({"contracts", "--json"});
  ASSERT_EQ(c["contracts"].size(), 1u);
  EXPECT_EQ(c["contracts"][0]["id"], Cid());
  EXPECT_EQ(c["contracts"][0]["model"], "kvtier/ops-test");
  EXPECT_EQ(c["contracts"][0]["format"], "nvfp4");
  EXPECT_EQ(c["contracts"][0]["block_bytes"].get<uint64_t>(), blocks_[0].size());
  EXPECT_EQ(c["contracts"][0]["blocks"]["host"].get<uint64_t>(), 10u);
  Result ch = Run({"contracts"});
  EXPECT_NE(ch.out.find(Cid()), std::string::npos);
}

TEST_F(KvtierctlOps, LsInspectFlushVerify) {
  Store(12);
  json ls = RunJson({"ls", "--json"});
  EXPECT_EQ(ls["total"].get<uint64_t>(), 12u);
  EXPECT_EQ(ls["blocks"].size(), 12u);
  EXPECT_EQ(RunJson({"ls", "--json", "--tier", "nvme"})["total"].get<uint64_t>(), 0u);
  EXPECT_EQ(RunJson({"ls", "--json", "--contract", Cid(), "--tier", "host"})["total"].get<uint64_t>(), 12u);
  EXPECT_EQ(RunJson({"ls", "--json", "--limit", "5"})["blocks"].size(), 5u);
  Result bad_tier = Run({"ls", "--tier", "ssd"});
  EXPECT_EQ(bad_tier.code, 2);

  json in = RunJson({"inspect", Hex(keys_[3]), "--json"});
  EXPECT_EQ(in["contract"], Cid());
  EXPECT_EQ(in["parent"], Hex(keys_[2]));
  EXPECT_EQ(in["bytes"].get<uint64_t>(), blocks_[3].size());
  EXPECT_FALSE(in.contains("nvme"));

  Result fl = Run({"flush"});
  ASSERT_EQ(fl.code, 0) << fl.err;
  json s = RunJson({"stats", "--json"});
  EXPECT_EQ(TierBlocks(s, "nvme"), 12u);
  in = RunJson({"inspect", Hex(keys_[3]), "--json", "--contract", Cid()});
  ASSERT_TRUE(in.contains("nvme")) << in.dump();
  EXPECT_NE(in["nvme"]["payload_xxh3"], "0000000000000000");

  Result v = Run({"verify", "--batch", "5"});
  EXPECT_EQ(v.code, 0) << v.err;
  EXPECT_NE(v.out.find("verified 12 NVMe records: 12 ok, 0 corrupt"), std::string::npos) << v.out;
  EXPECT_NE(v.err.find("verify: 100%"), std::string::npos) << v.err;  // plain progress lines (no tty)

  // Corrupt the payload of the first records on disk: verify finds them, drops them,
  // counts them, and says so with a non-zero exit.
  const std::string data = d_->dir() + "/nvme/data/kvtier-0000.dat";
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << data;
    for (int rec = 0; rec < 2; ++rec) {
      const std::streamoff off = rec * (4096 + 8192) + 4096 + 100;
      f.seekg(off);
      char ch = 0;
      f.read(&ch, 1);
      ch = static_cast<char>(ch ^ 0x5A);
      f.seekp(off);
      f.write(&ch, 1);
    }
  }
  json vj;
  Result v2 = Run({"verify", "--json"});
  EXPECT_NE(v2.code, 0);
  vj = json::parse(v2.out, nullptr, false);
  ASSERT_FALSE(vj.is_discarded()) << v2.out;
  EXPECT_EQ(vj["corrupt"].get<uint64_t>(), 2u);
  EXPECT_EQ(vj["ok"].get<uint64_t>(), 10u);
  s = RunJson({"stats", "--json"});
  EXPECT_EQ(TierBlocks(s, "nvme"), 10u);
  for (const auto& t : s["tiers"]) {
    if (t["tier"] == "nvme") {
      EXPECT_GE(t["checksum_failures"].get<uint64_t>(), 2u);
    }
  }
  Result again = Run({"verify"});
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("verified 10 NVMe records: 10 ok"), std::string::npos) << again.out;
}

TEST_F(KvtierctlOps, EvictKeyAndContract) {
  Store(6);
  Result e = Run({"evict", Hex(keys_[5])});
  ASSERT_EQ(e.code, 0) << e.err;
  Result gone = Run({"inspect", Hex(keys_[5])});
  EXPECT_NE(gone.code, 0);
  EXPECT_NE(gone.err.find("not cached"), std::string::npos) << gone.err;
  EXPECT_EQ(std::count(gone.err.begin(), gone.err.end(), '\n'), 1);
  Result again = Run({"evict", Hex(keys_[5])});
  EXPECT_NE(again.code, 0);

  // A pinned block stays: acquire one, evict the contract, then release.
  uint64_t lease = 0;
  kvtier_slot s{};
  size_t got = 0;
  ASSERT_EQ(kvtier_acquire(c_, cid_, &keys_[0], 1, KVTIER_TIER_HOST, &lease, &s, &got), KVTIER_OK);
  ASSERT_EQ(got, 1u);
  json ev = RunJson({"evict", "--contract", Cid(), "--json"});
  EXPECT_EQ(ev["evicted"].get<uint64_t>(), 4u);
  EXPECT_EQ(ev["pinned_skipped"].get<uint64_t>(), 1u);
  ASSERT_EQ(kvtier_release(c_, lease), KVTIER_OK);
  EXPECT_EQ(RunJson({"ls", "--json"})["total"].get<uint64_t>(), 1u);
  ev = RunJson({"evict", "--contract", Cid(), "--json"});
  EXPECT_EQ(ev["evicted"].get<uint64_t>(), 1u);
  EXPECT_EQ(RunJson({"ls", "--json"})["total"].get<uint64_t>(), 0u);

  Result unknown_contract = Run({"evict", "--contract", "00000000deadbeef"});
  EXPECT_NE(unknown_contract.code, 0);
  EXPECT_NE(unknown_contract.err.find("not registered"), std::string::npos) << unknown_contract.err;
  Result bad_key = Run({"evict", "xyz"});
  EXPECT_EQ(bad_key.code, 2);
}

TEST_F(KvtierctlOps, ConfigCheckAndReload) {
  Result ok = Run({"config", "check", d_->config_path()});
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.out.find(": ok"), std::string::npos);
  const std::string bad = dir_.path() + "/bad.toml";
  testing::WriteText(bad, "[tiers.host]\ncapacity = \"lots\"\n");
  Result nok = Run({"config", "check", bad});
  EXPECT_NE(nok.code, 0);
  EXPECT_EQ(std::count(nok.err.begin(), nok.err.end(), '\n'), 1) << nok.err;
  Result missing = Run({"config", "check", dir_.path() + "/nope.toml"});
  EXPECT_NE(missing.code, 0);

  Result rl = Run({"config", "reload"});
  EXPECT_EQ(rl.code, 0) << rl.err;
  EXPECT_NE(rl.out.find("reloaded"), std::string::npos) << rl.out;
  EXPECT_EQ(d_->WaitMetric("kvtier_config_reloads_total{result=\"ok\"}", 1), 1);
  // A config that no longer validates: reload refused, daemon unchanged and serving.
  const std::string good = testing::ReadText(d_->config_path());
  testing::WriteText(d_->config_path(), good + "\n[tiers.host]\nhigh_watermark = 7\n");
  Result rb = Run({"config", "reload"});
  EXPECT_NE(rb.code, 0);
  EXPECT_NE(rb.err.find("nothing changed"), std::string::npos) << rb.err;
  testing::WriteText(d_->config_path(), good);
  EXPECT_EQ(Run({"tiers"}).code, 0);
}

TEST_F(KvtierctlOps, ExportImportRoundTripByteIdentical) {
  Store(20);
  ASSERT_EQ(Run({"flush"}).code, 0);  // half the export then comes from NVMe
  const std::string file = dir_.path() + "/c.kvt";
  Result ex = Run({"export", "--contract", Cid(), "--out", file, "--json"});
  ASSERT_EQ(ex.code, 0) << ex.err;
  json ej = json::parse(ex.out, nullptr, false);
  EXPECT_EQ(ej["records"].get<uint64_t>(), 20u);
  EXPECT_NE(ex.err.find("export: 100%"), std::string::npos) << ex.err;
  std::printf("zstd on %d NVFP4 Gaussian blocks: raw %llu stored %llu ratio %.4f (%llu compressed)\n", 20,
              static_cast<unsigned long long>(ej["raw_bytes"].get<uint64_t>()),
              static_cast<unsigned long long>(ej["stored_bytes"].get<uint64_t>()), ej["ratio"].get<double>(),
              static_cast<unsigned long long>(ej["compressed_records"].get<uint64_t>()));
  std::fflush(stdout);

  DaemonProcess fresh(Cfg());
  ASSERT_TRUE(fresh.Start());
  Result im = Ctl(fresh.socket(), {"import", file}, dir_.path());
  ASSERT_EQ(im.code, 0) << im.err;
  EXPECT_NE(im.out.find("imported 20 blocks"), std::string::npos) << im.out;

  kvtier_client* c2 = Client(&fresh);
  ASSERT_NE(c2, nullptr);
  std::vector<kvtier_slot> slots(keys_.size());
  uint64_t lease = 0;
  size_t got = 0;
  ASSERT_EQ(kvtier_acquire(c2, cid_, keys_.data(), keys_.size(), KVTIER_TIER_HOST, &lease, slots.data(), &got),
            KVTIER_OK)
      << kvtier_last_error();
  ASSERT_EQ(got, keys_.size());  // the whole chain, in order: parents preserved
  for (size_t i = 0; i < got; ++i) {
    ASSERT_EQ(std::memcmp(kvtier_host_slot(c2, slots[i].slot), blocks_[i].data(),
                          blocks_[i].size()),
              0)
        << "block " << i;
  }
  ASSERT_EQ(kvtier_release(c2, lease), KVTIER_OK);
  kvtier_block_info bi{};
  ASSERT_EQ(kvtier_inspect(c2, cid_, keys_[7], &bi), KVTIER_OK);
  EXPECT_EQ(bi.parent.hi, keys_[6].hi);
  EXPECT_EQ(bi.parent.lo, keys_[6].lo);
  kvtier_close(c2);
}

TEST_F(KvtierctlOps, CorruptOrRefusedExportStoresNothing) {
  Store(8);
  const std::string file = dir_.path() + "/c.kvt";
  ASSERT_EQ(Run({"export", "--contract", Cid(), "--out", file}).code, 0);
  const std::string bytes = Slurp(file);
  ASSERT_GT(bytes.size(), 1000u);

  DaemonProcess fresh(Cfg());
  ASSERT_TRUE(fresh.Start());
  auto nothing_stored = [&] {
    json s = json::parse(Ctl(fresh.socket(), {"stats", "--json"}, dir_.path()).out, nullptr, false);
    uint64_t blocks = 0;
    for (const auto& t : s["tiers"]) blocks += t["blocks"].get<uint64_t>();
    json c = json::parse(Ctl(fresh.socket(), {"contracts", "--json"}, dir_.path()).out, nullptr, false);
    return blocks == 0 && c["contracts"].empty();
  };
  const std::string truncated = dir_.path() + "/t.kvt";
  testing::WriteText(truncated, bytes.substr(0, bytes.size() - 40));
  Result t = Ctl(fresh.socket(), {"import", truncated}, dir_.path());
  EXPECT_NE(t.code, 0);
  EXPECT_NE(t.err.find("nothing stored"), std::string::npos) << t.err;
  EXPECT_TRUE(nothing_stored());

  std::string flipped_bytes = bytes;
  flipped_bytes[bytes.size() / 2] = static_cast<char>(flipped_bytes[bytes.size() / 2] ^ 0x01);
  const std::string flipped = dir_.path() + "/f.kvt";
  testing::WriteText(flipped, flipped_bytes);
  Result f = Ctl(fresh.socket(), {"import", flipped}, dir_.path());
  EXPECT_NE(f.code, 0);
  EXPECT_NE(f.err.find("nothing stored"), std::string::npos) << f.err;
  EXPECT_TRUE(nothing_stored());

  // A daemon whose slots are too small for the contract refuses it: nothing stored.
  DaemonConfig small = Cfg();
  small.slot_bytes = "4KiB";
  DaemonProcess tiny(small);
  ASSERT_TRUE(tiny.Start());
  Result r = Ctl(tiny.socket(), {"import", file}, dir_.path());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("refuses contract"), std::string::npos) << r.err;
  json s = json::parse(Ctl(tiny.socket(), {"stats", "--json"}, dir_.path()).out, nullptr, false);
  EXPECT_EQ(TierBlocks(s, "host"), 0u);
}

// The same operator requests over the unix-socket transport (validated and served on
// the daemon's control thread instead of a ring thread).
TEST_F(KvtierctlOps, AdminRequestsOverTheSocketTransport) {
  Store(5);
  ASSERT_EQ(kvtier_set_transport(c_, KVTIER_TRANSPORT_SOCKET), KVTIER_OK);
  std::vector<kvtier_block_info> page(8);
  uint32_t n = 0;
  uint64_t total = 0;
  ASSERT_EQ(kvtier_list_blocks(c_, cid_, KVTIER_TIER_HOST, 0, 8, page.data(), &n, &total), KVTIER_OK)
      << kvtier_last_error();
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(total, 5u);
  ASSERT_EQ(kvtier_list_blocks(c_, cid_, KVTIER_TIER_HOST, 3, 8, page.data(), &n, &total), KVTIER_OK);
  EXPECT_EQ(n, 2u);
  kvtier_block_info b{};
  ASSERT_EQ(kvtier_inspect(c_, 0, keys_[2], &b), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(b.contract_id, cid_);
  EXPECT_EQ(b.parent.lo, keys_[1].lo);
  EXPECT_EQ(kvtier_inspect(c_, 0, kvtier_key{9, 9}, &b), KVTIER_NOT_FOUND);
  EXPECT_EQ(kvtier_list_blocks(c_, cid_, KVTIER_TIER_HOST, 0, 0, page.data(), &n, &total), KVTIER_INVALID);
  ASSERT_EQ(kvtier_flush(c_), KVTIER_OK) << kvtier_last_error();
  kvtier_verify_report r{};
  ASSERT_EQ(kvtier_verify_nvme(c_, 0, 100, &r), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(r.ok, 5u);
  char msg[256];
  ASSERT_EQ(kvtier_reload_config(c_, msg, sizeof msg), KVTIER_OK) << kvtier_last_error();
  EXPECT_NE(std::string(msg).find("reloaded"), std::string::npos) << msg;
  uint64_t ev = 0, sk = 0;
  ASSERT_EQ(kvtier_evict_contract(c_, cid_, &ev, &sk), KVTIER_OK);
  EXPECT_EQ(ev, 5u);
  EXPECT_EQ(sk, 0u);
}

// Admin requests libkvtier would never send, straight on the wire: each is refused with
// Invalid (or NotFound) and changes nothing; the daemon keeps serving.
TEST_F(KvtierctlOps, MalformedAdminRequestsRefusedByTheDaemon) {
  Store(3);
  testing::RawClient raw;
  wire::AttachReply rep;
  ASSERT_TRUE(raw.Attach(d_->socket(), &rep));
  ASSERT_EQ(rep.status, 0);
  auto send = [&](const wire::AdminRequest& a, uint32_t out_len, uint32_t count = 0) {
    wire::RequestEntry e;
    e.tag = 77;
    e.op = static_cast<uint16_t>(wire::Op::kAdmin);
    e.count = count;
    e.in_len = sizeof a;
    e.out_len = out_len;
    wire::CompletionEntry c;
    std::string body;
    EXPECT_TRUE(raw.SocketRequest(e, &a, sizeof a, wire::kProtocolVersion, &c, &body));
    return std::pair{c.status, body.substr(0, c.msg_len)};
  };
  wire::AdminRequest ls;
  ls.action = static_cast<uint16_t>(wire::AdminAction::kListBlocks);
  ls.limit = 10;
  EXPECT_EQ(send(ls, 10 * sizeof(wire::AdminBlockInfo)).first, 0);
  wire::AdminRequest bad = ls;
  bad.reserved[5] = 1;
  auto r = send(bad, 1024);
  EXPECT_EQ(r.first, static_cast<int32_t>(StatusCode::kInvalid));
  EXPECT_NE(r.second.find("reserved"), std::string::npos) << r.second;
  bad = ls;
  bad.action = 99;
  EXPECT_EQ(send(bad, 1024).first, static_cast<int32_t>(StatusCode::kInvalid));
  bad = ls;
  bad.tier = 7;
  EXPECT_EQ(send(bad, 1024).first, static_cast<int32_t>(StatusCode::kInvalid));
  EXPECT_EQ(send(ls, 1024, /*count=*/3).first, static_cast<int32_t>(StatusCode::kInvalid));
  // An unregistered contract filter, an evict of a key nobody has.
  bad = ls;
  bad.contract_id = 0x1234;
  EXPECT_EQ(send(bad, 1024).first, static_cast<int32_t>(StatusCode::kNotFound));
  wire::AdminRequest ev;
  ev.action = static_cast<uint16_t>(wire::AdminAction::kEvictKey);
  ev.key = {5, 5};
  EXPECT_EQ(send(ev, 1024).first, static_cast<int32_t>(StatusCode::kNotFound));
  wire::AdminRequest ec;
  ec.action = static_cast<uint16_t>(wire::AdminAction::kEvictContract);
  EXPECT_EQ(send(ec, 1024).first, static_cast<int32_t>(StatusCode::kInvalid));  // contract 0
  EXPECT_EQ(RunJson({"ls", "--json"})["total"].get<uint64_t>(), 3u);  // nothing changed
}

TEST(KvtierctlOpsErrors, NoDaemonWrongSocketUnknownKey) {
  TempDir dir;
  Result r = Ctl(dir.path() + "/absent.sock", {"stats"}, dir.path());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("no kvtierd socket"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.out.empty());
  // A path that exists but is no daemon's socket.
  const std::string notsock = dir.path() + "/plain-file";
  testing::WriteText(notsock, "x");
  r = Ctl(notsock, {"ls"}, dir.path());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("cannot reach kvtierd"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;

  DaemonProcess d(Cfg());
  ASSERT_TRUE(d.Start());
  r = Ctl(d.socket(), {"inspect", "0123456789abcdef0123456789abcdef"}, dir.path());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not cached"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = Ctl(d.socket(), {"export", "--contract", "00000000deadbeef", "--out", dir.path() + "/x.kvt"}, dir.path());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("not registered"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir.path() + "/x.kvt"));
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

// The daemon-side field checks of an operator request (formats/wire.h).
TEST(AdminRequestValidation, EveryFieldChecked) {
  wire::AdminRequest a;
  a.action = static_cast<uint16_t>(wire::AdminAction::kListBlocks);
  a.limit = 10;
  EXPECT_TRUE(wire::ValidateAdminRequest(a).ok());
  auto bad = [&](auto mutate) {
    wire::AdminRequest b = a;
    mutate(b);
    return !wire::ValidateAdminRequest(b).ok();
  };
  EXPECT_TRUE(bad([](auto& b) { b.action = 0; }));
  EXPECT_TRUE(bad([](auto& b) { b.action = wire::kMaxAdminAction + 1; }));
  EXPECT_TRUE(bad([](auto& b) { b.limit = 0; }));
  EXPECT_TRUE(bad([](auto& b) { b.limit = wire::kMaxAdminLimit + 1; }));
  EXPECT_TRUE(bad([](auto& b) { b.tier = 3; }));
  EXPECT_TRUE(bad([](auto& b) { b.reserved0 = 1; }));
  EXPECT_TRUE(bad([](auto& b) { b.reserved[23] = 1; }));
  EXPECT_TRUE(bad([](auto& b) { b.key = {1, 2}; }));  // ls takes no key
  wire::AdminRequest f;
  f.action = static_cast<uint16_t>(wire::AdminAction::kFlush);
  EXPECT_TRUE(wire::ValidateAdminRequest(f).ok());
  f.tier = wire::kTierHost;  // flush --to host
  EXPECT_TRUE(wire::ValidateAdminRequest(f).ok());
  f.tier = wire::kTierNvme;
  EXPECT_TRUE(wire::ValidateAdminRequest(f).ok());
  f.tier = wire::kTierHbm;  // nothing is flushed "to HBM"
  EXPECT_FALSE(wire::ValidateAdminRequest(f).ok());
  f.tier = 7;
  EXPECT_FALSE(wire::ValidateAdminRequest(f).ok());
  f.tier = wire::kTierNone;
  f.offset = 1;
  EXPECT_FALSE(wire::ValidateAdminRequest(f).ok());
  wire::AdminRequest i;
  i.action = static_cast<uint16_t>(wire::AdminAction::kInspect);
  EXPECT_FALSE(wire::ValidateAdminRequest(i).ok());  // key 0
  i.key = {1, 0};
  EXPECT_TRUE(wire::ValidateAdminRequest(i).ok());
  i.tier = wire::kTierHost;
  EXPECT_FALSE(wire::ValidateAdminRequest(i).ok());
  wire::AdminRequest e;
  e.action = static_cast<uint16_t>(wire::AdminAction::kEvictContract);
  EXPECT_FALSE(wire::ValidateAdminRequest(e).ok());  // contract 0
  // The request entry around it: count 0, in_len exactly one AdminRequest.
  wire::RequestEntry r;
  r.op = static_cast<uint16_t>(wire::Op::kAdmin);
  r.in_len = sizeof(wire::AdminRequest);
  wire::RequestLimits lim;
  lim.data_bytes = 1 << 20;
  EXPECT_TRUE(wire::ValidateRingRequest(r, lim).ok());
  r.count = 1;
  EXPECT_FALSE(wire::ValidateRingRequest(r, lim).ok());
  r.count = 0;
  r.in_len = 8;
  EXPECT_FALSE(wire::ValidateRingRequest(r, lim).ok());
}

}  // namespace
}  // namespace kvtier
