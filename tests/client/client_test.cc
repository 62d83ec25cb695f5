// libkvtier's C ABI: argument validation without a daemon, the key chain against
// formats/, the C++ wrapper, and ring vs socket transports giving the same answers.
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "formats/contract.h"
#include "formats/keys.h"
#include "kvtier/kvtier.hpp"
#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

TEST(ClientAbi, KeyChainIsTheFormatsKeyChain) {
  std::vector<uint32_t> tokens(16 * 5 + 3);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 31 + 7);
  const uint64_t cid = 0x0123456789abcdefull;
  std::vector<kvtier_key> keys(5);
  size_t n = 0;
  ASSERT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), keys.size(), &n), KVTIER_OK);
  ASSERT_EQ(n, 5u);
  const auto want = KeyChain(cid, tokens, 16);
  ASSERT_EQ(want.size(), 5u);
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(keys[i].hi, want[i].hi);
    EXPECT_EQ(keys[i].lo, want[i].lo);
  }
  // Too little room is refused, with the count reported.
  EXPECT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), 4, &n), KVTIER_INVALID);
  EXPECT_EQ(n, 5u);
  EXPECT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 0, keys.data(), 5, &n), KVTIER_INVALID);
  EXPECT_NE(std::string(kvtier_last_error()), "");
}

TEST(ClientAbi, ContractIdMatchesFormats) {
  auto d = SmallContract();
  uint64_t id = 0, bytes = 0;
  ASSERT_EQ(kvtier_contract_id(&d, &id), KVTIER_OK);
  ASSERT_EQ(kvtier_contract_block_bytes(&d, &bytes), KVTIER_OK);
  ScaleContract c;
  c.model_id = "test/model-a";
  c.model_revision = "r1";
  c.tokenizer_revision = "t1";
  c.geometry = Geometry{2, 1, 16, 16};
  c.SetUnitScales();
  EXPECT_EQ(id, c.Id());
  EXPECT_EQ(bytes, c.block_bytes());
  d.head_dim = 17;  // not a multiple of 16
  EXPECT_EQ(kvtier_contract_id(&d, &id), KVTIER_INVALID);
  d.head_dim = 16;
  d.model_id = nullptr;
  EXPECT_EQ(kvtier_contract_id(&d, &id), KVTIER_INVALID);
}

TEST(ClientAbi, BadArgumentsAreInvalidNotCrashes) {
  kvtier_client* c = nullptr;
  EXPECT_EQ(kvtier_connect(nullptr, nullptr, &c), KVTIER_INVALID);
  EXPECT_EQ(kvtier_connect("/nonexistent/kvtier.sock", nullptr, &c), KVTIER_IO_ERROR);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(kvtier_last_error()).find("/nonexistent/kvtier.sock"), std::string::npos);
  kvtier_lookup_result r{};
  kvtier_key k{1, 2};
  EXPECT_EQ(kvtier_lookup(nullptr, 1, &k, 1, &r, nullptr), KVTIER_INVALID);
  EXPECT_EQ(kvtier_release(nullptr, 1), KVTIER_INVALID);
  EXPECT_EQ(kvtier_ping(nullptr), KVTIER_INVALID);
  kvtier_close(nullptr);
  EXPECT_STREQ(kvtier_status_name(KVTIER_DISCONNECTED), "DISCONNECTED");
  EXPECT_EQ(kvtier_protocol_version(), wire::kProtocolVersion);
}

// The layout table bindings check their mirrors against: every record, every field of the
// tier stats list, at the offsets and sizes the compiler gave them.
TEST(ClientAbi, LayoutTableDescribesEveryRecord) {
  size_t n = 0;
  const kvtier_abi_field* rows = kvtier_abi_layout(&n);
  ASSERT_NE(rows, nullptr);
  ASSERT_GT(n, 0u);
  auto find = [&](const std::string& rec, const std::string& field) -> const kvtier_abi_field* {
    for (size_t i = 0; i < n; ++i) {
      if (rec == rows[i].record && field == rows[i].field) return &rows[i];
    }
    return nullptr;
  };
  const struct {
    const char* rec;
    size_t size;
  } records[] = {{"kvtier_key", sizeof(kvtier_key)},
                 {"kvtier_slot", sizeof(kvtier_slot)},
                 {"kvtier_connect_options", sizeof(kvtier_connect_options)},
                 {"kvtier_contract_desc", sizeof(kvtier_contract_desc)},
                 {"kvtier_lookup_result", sizeof(kvtier_lookup_result)},
                 {"kvtier_commit_item", sizeof(kvtier_commit_item)},
                 {"kvtier_tier_stats", sizeof(kvtier_tier_stats)}};
  for (const auto& r : records) {
    const kvtier_abi_field* row = find(r.rec, "");
    ASSERT_NE(row, nullptr) << r.rec;
    EXPECT_EQ(row->size, r.size) << r.rec;
  }
  size_t stats_fields = 0;
#define KVT_CHECK(type, name)                                                    \
  {                                                                              \
    const kvtier_abi_field* f = find("kvtier_tier_stats", #name);                \
    ASSERT_NE(f, nullptr) << #name;                                              \
    EXPECT_EQ(f->offset, offsetof(kvtier_tier_stats, name)) << #name;            \
    EXPECT_EQ(f->size, sizeof(type)) << #name;                                   \
    ++stats_fields;                                                              \
  }
  KVTIER_TIER_STATS_FIELDS(KVT_CHECK)
#undef KVT_CHECK
  EXPECT_EQ(stats_fields, 20u);
  EXPECT_EQ(sizeof(kvtier_tier_stats), sizeof(wire::WireTierStats));
  EXPECT_EQ(find("kvtier_slot", "slot")->offset, offsetof(kvtier_slot, slot));
  EXPECT_EQ(find("kvtier_commit_item", "parent")->offset, offsetof(kvtier_commit_item, parent));
  EXPECT_EQ(find("kvtier_contract_desc", "v_scales")->offset, offsetof(kvtier_contract_desc, v_scales));
  EXPECT_EQ(find("kvtier_key", "no_such_field"), nullptr);
}

TEST(ClientDaemon, RingAndSocketTransportsAgree) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  client::Client c;
  ASSERT_TRUE(c.Connect(d.socket())) << kvtier_last_error();
  EXPECT_EQ(c.slot_bytes(), 4096u);
  uint64_t cid = 0;
  ASSERT_TRUE(c.RegisterContract(SmallContract(), &cid));
  // Bad calls through a live client get errors and leave it usable.
  kvtier_lookup_result r{};
  EXPECT_EQ(kvtier_lookup(c.get(), cid, nullptr, 3, &r, nullptr), KVTIER_INVALID);
  EXPECT_EQ(kvtier_acquire(c.get(), cid, nullptr, 0, KVTIER_TIER_HOST, nullptr, nullptr, nullptr), KVTIER_INVALID);
  // A client without a GPU cannot target HBM (and this daemon has none).
  kvtier_key k{5, 6};
  uint64_t lease = 0;
  size_t n = 0;
  kvtier_slot s{};
  EXPECT_EQ(kvtier_acquire(c.get(), cid, &k, 1, KVTIER_TIER_HBM, &lease, &s, &n), KVTIER_INVALID);
  // Store 4 blocks with the C++ wrapper.
  client::Lease l;
  ASSERT_TRUE(c.Alloc(cid, 4, KVTIER_TIER_HOST, &l));
  std::vector<kvtier_key> keys{{1, 1}, {2, 2}, {3, 3}, {4, 4}};
  std::vector<kvtier_commit_item> items;
  for (size_t i = 0; i < 4; ++i) {
    FillBlock(c.host_slot_write(l.slots[i].slot), 576, cid, keys[i]);
    items.push_back({l.slots[i], keys[i], i ? keys[i - 1] : kvtier_key{0, 0}});
  }
  size_t done = 0;
  ASSERT_TRUE(c.Commit(cid, l.id, items, &done));
  EXPECT_EQ(done, 4u);
  // Committing the same slot twice is refused.
  EXPECT_EQ(c.Commit(cid, l.id, std::span(items).subspan(0, 1)).status, KVTIER_INVALID);
  ASSERT_TRUE(c.Release(l.id));
  std::vector<kvtier_key> probe = keys;
  probe.push_back({9, 9});
  for (kvtier_transport t : {KVTIER_TRANSPORT_RING, KVTIER_TRANSPORT_SOCKET}) {
    ASSERT_TRUE(c.SetTransport(t));
    client::LookupResult lr;
    ASSERT_TRUE(c.Lookup(cid, probe, &lr));
    EXPECT_EQ(lr.hit_blocks, 4u) << t;
    EXPECT_EQ(lr.tiers[3], KVTIER_TIER_HOST);
    EXPECT_EQ(lr.tiers[4], KVTIER_TIER_NONE);
    client::Lease al;
    ASSERT_TRUE(c.Acquire(cid, probe, KVTIER_TIER_HOST, &al));
    ASSERT_EQ(al.slots.size(), 4u);
    for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(CheckBlock(c.host_slot(al.slots[i].slot), 576, cid, keys[i]));
    ASSERT_TRUE(c.Release(al.id));
    auto e = c.Release(al.id);
    EXPECT_EQ(e.status, KVTIER_NOT_FOUND) << t;
    EXPECT_NE(e.message.find("not held"), std::string::npos) << e.message;
    std::vector<kvtier_tier_stats> st;
    ASSERT_TRUE(c.Stats(&st));
    bool host_seen = false;
    for (const auto& ts : st) {
      if (ts.tier == KVTIER_TIER_HOST && ts.present) {
        host_seen = true;
        EXPECT_EQ(ts.blocks, 4u);
        EXPECT_EQ(ts.slots_total, 64u);
      }
    }
    EXPECT_TRUE(host_seen);
    EXPECT_TRUE(c.Prefetch(cid, probe, KVTIER_TIER_HOST));
  }
  c.Close();
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

}  // namespace
}  // namespace kvtier::testing
