// A plain commit (kvtier_commit, kvtier_commit_chain, C++ Client::Commit) of keys another client cached with other bytes answers KVTIER_CONFLICT
// and does not count those keys, under every tiers.on_conflict that keeps the caller's
// bytes out (keep-first, drop-disputed, replace of a pinned block); replace of an unpinned
// block stores them and answers OK. And drop-disputed's re-commit while a disputer pins
// the key: reported disputed (not same_bytes), refused, and stored once the block goes.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kvtier/kvtier.h"
#include "kvtier/kvtier.hpp"
#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

constexpr size_t kBlockBytes = 576;  // SmallContract(): 2 layers x 288 bytes

struct Peer {
  kvtier_client* c = nullptr;
  uint64_t cid = 0;
  ~Peer() {
    if (c) kvtier_close(c);
  }
  bool Open(const std::string& socket, const char* name) {
    kvtier_connect_options o{};
    o.name = name;
    const kvtier_contract_desc desc = SmallContract("test/conflict");
    return kvtier_connect(socket.c_str(), &o, &c) == KVTIER_OK && kvtier_register_contract(c, &desc, &cid) == KVTIER_OK;
  }
};

kvtier_key Key(uint64_t group, uint64_t i) { return kvtier_key{0xC0F1000000000000ull | (group << 16) | i, ~i}; }

// Allocs keys.size() host slots and writes each key's own bytes (garbage: 0x66).
uint64_t Stage(Peer& p, const std::vector<kvtier_key>& keys, bool garbage, std::vector<kvtier_slot>* slots) {
  uint64_t lease = 0;
  slots->assign(keys.size(), kvtier_slot{});
  EXPECT_EQ(kvtier_alloc(p.c, p.cid, keys.size(), KVTIER_TIER_HOST, &lease, slots->data()), KVTIER_OK)
      << kvtier_last_error();
  for (size_t i = 0; i < keys.size(); ++i) {
    auto* b = static_cast<uint8_t*>(kvtier_host_slot_write(p.c, (*slots)[i].slot));
    if (garbage) std::memset(b, 0x66, kBlockBytes);
    else FillBlock(b, kBlockBytes, p.cid, keys[i]);
  }
  return lease;
}

std::vector<kvtier_commit_item> Items(const std::vector<kvtier_slot>& slots, const std::vector<kvtier_key>& keys) {
  std::vector<kvtier_commit_item> items(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) items[i] = {slots[i], keys[i], i ? keys[i - 1] : kvtier_key{0, 0}};
  return items;
}

// Commits keys with garbage through commit_report (the poisoner's view: OK) and releases.
void Poison(Peer& p, const std::vector<kvtier_key>& keys) {
  std::vector<kvtier_slot> slots;
  const uint64_t lease = Stage(p, keys, true, &slots);
  kvtier_commit_result r{};
  auto items = Items(slots, keys);
  ASSERT_EQ(kvtier_commit_report(p.c, p.cid, lease, items.data(), items.size(), &r), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_release(p.c, lease), KVTIER_OK);
}

// How many of keys an acquire serves with their own bytes (a miss ends the count).
size_t OwnServed(Peer& p, const std::vector<kvtier_key>& keys) {
  uint64_t lease = 0;
  std::vector<kvtier_slot> slots(keys.size());
  size_t n = 0;
  if (kvtier_acquire(p.c, p.cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) != KVTIER_OK) {
    ADD_FAILURE() << kvtier_last_error();
    return 0;
  }
  size_t own = 0;
  for (size_t i = 0; i < n; ++i) {
    own += CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(p.c, slots[i].slot)), kBlockBytes, p.cid, keys[i]);
  }
  (void)kvtier_release(p.c, lease);
  return own;
}

class CommitConflict : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(d_.Start({"--set", "tiers.on_conflict=" + GetParam()})) << d_.log();
    ASSERT_TRUE(poisoner_.Open(d_.socket(), "poisoner")) << kvtier_last_error();
    ASSERT_TRUE(honest_.Open(d_.socket(), "honest")) << kvtier_last_error();
    ASSERT_EQ(poisoner_.cid, honest_.cid);
  }
  bool Stores() const { return GetParam() == "replace"; }  // unpinned: the new bytes win
  DaemonProcess d_;
  Peer poisoner_, honest_;
};

// kvtier_commit: 4 keys poisoned first. keep-first and drop-disputed: CONFLICT, none
// counted, and the keys serve other bytes or nothing; replace: OK, 4, served.
TEST_P(CommitConflict, PlainCommitSaysConflictAndCountsOnlyItsBytes) {
  std::vector<kvtier_key> keys;
  for (uint64_t i = 0; i < 4; ++i) keys.push_back(Key(1, i));
  Poison(poisoner_, keys);
  std::vector<kvtier_slot> slots;
  const uint64_t lease = Stage(honest_, keys, false, &slots);
  auto items = Items(slots, keys);
  size_t n = 99;
  const kvtier_status s = kvtier_commit(honest_.c, honest_.cid, lease, items.data(), items.size(), &n);
  const std::string err = kvtier_last_error();
  ASSERT_EQ(kvtier_release(honest_.c, lease), KVTIER_OK);
  if (Stores()) {
    EXPECT_EQ(s, KVTIER_OK) << err;
    EXPECT_EQ(n, 4u);
    EXPECT_EQ(OwnServed(honest_, keys), 4u);
    return;
  }
  EXPECT_EQ(s, KVTIER_CONFLICT) << "a commit whose bytes were not stored answered " << kvtier_status_name(s);
  EXPECT_STREQ(kvtier_status_name(s), "CONFLICT");
  EXPECT_EQ(n, 0u) << "keys cached with other bytes were counted as committed";
  EXPECT_NE(err.find("4 of 4 keys do not hold these bytes"), std::string::npos) << err;
  EXPECT_NE(err.find("different bytes"), std::string::npos) << err;
  EXPECT_EQ(OwnServed(honest_, keys), 0u) << "the honest bytes are served after all";
  // An equal re-commit of the poisoner's own bytes is no conflict (keep-first keeps them;
  // drop-disputed dropped them, so they are stored afresh).
  std::vector<kvtier_slot> ps;
  const uint64_t pl = Stage(poisoner_, keys, true, &ps);
  auto pitems = Items(ps, keys);
  EXPECT_EQ(kvtier_commit(poisoner_.c, poisoner_.cid, pl, pitems.data(), pitems.size(), &n), KVTIER_OK)
      << kvtier_last_error();
  EXPECT_EQ(n, 4u);
  ASSERT_EQ(kvtier_release(poisoner_.c, pl), KVTIER_OK);
}

// kvtier_commit_chain over a chain whose last 2 of 4 keys were poisoned: 2 counted (4 under replace), CONFLICT otherwise; the C++ wrapper's Error is
// not ok and its count the same.
TEST_P(CommitConflict, ChainStoreAndCppCallsSayConflict) {
  std::vector<uint32_t> tokens(16 * 4 + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(5000 + i * 3);
  std::vector<kvtier_key> keys(4);
  size_t nk = 0;
  ASSERT_EQ(kvtier_key_chain(honest_.cid, tokens.data(), tokens.size(), 16, keys.data(), keys.size(), &nk), KVTIER_OK);
  ASSERT_EQ(nk, 4u);
  const std::vector<kvtier_key> tail{keys[2], keys[3]};
  {  // the poisoner's tail, with the right parents
    std::vector<kvtier_slot> slots;
    const uint64_t lease = Stage(poisoner_, tail, true, &slots);
    kvtier_commit_item it[2] = {{slots[0], keys[2], keys[1]}, {slots[1], keys[3], keys[2]}};
    kvtier_commit_result r{};
    ASSERT_EQ(kvtier_commit_report(poisoner_.c, poisoner_.cid, lease, it, 2, &r), KVTIER_OK);
    ASSERT_EQ(kvtier_release(poisoner_.c, lease), KVTIER_OK);
  }
  std::vector<kvtier_slot> slots;
  uint64_t lease = Stage(honest_, keys, false, &slots);
  size_t n = 99;
  kvtier_status s = kvtier_commit_chain(honest_.c, honest_.cid, lease, slots.data(), keys.data(), 4, {0, 0}, &n);
  std::string err = kvtier_last_error();
  ASSERT_EQ(kvtier_release(honest_.c, lease), KVTIER_OK);
  EXPECT_EQ(s, Stores() ? KVTIER_OK : KVTIER_CONFLICT) << err;
  EXPECT_EQ(n, Stores() ? 4u : 2u);
  if (!Stores()) {
    EXPECT_NE(err.find("2 of 4 keys do not hold these bytes"), std::string::npos) << err;
  }

  // The C++ wrapper over a fresh poisoned key.
  const std::vector<kvtier_key> one{Key(2, 0)};
  Poison(poisoner_, one);
  ::kvtier::client::Client cpp;
  ASSERT_TRUE(cpp.Connect(d_.socket()).ok());
  const kvtier_contract_desc desc = SmallContract("test/conflict");
  uint64_t cid = 0;
  ASSERT_EQ(kvtier_register_contract(cpp.get(), &desc, &cid), KVTIER_OK);
  kvtier_slot slot{};
  ASSERT_EQ(kvtier_alloc(cpp.get(), cid, 1, KVTIER_TIER_HOST, &lease, &slot), KVTIER_OK);
  FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(cpp.get(), slot.slot)), kBlockBytes, cid, one[0]);
  const kvtier_commit_item item{slot, one[0], {0, 0}};
  n = 99;
  const ::kvtier::client::Error e = cpp.Commit(cid, lease, ::kvtier::client::Span<const kvtier_commit_item>(&item, 1), &n);
  EXPECT_EQ(e.ok(), Stores()) << e.message;
  EXPECT_EQ(e.status, Stores() ? KVTIER_OK : KVTIER_CONFLICT) << e.message;
  EXPECT_EQ(n, Stores() ? 1u : 0u);
  ASSERT_TRUE(cpp.Release(lease).ok());
}

INSTANTIATE_TEST_SUITE_P(OnConflict, CommitConflict, ::testing::Values("keep-first", "replace", "drop-disputed"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = ch == '-' ? '_' : ch;
                           return n;
                         });

// replace answers CONFLICT where the cached block is pinned (its bytes stay).
TEST(CommitConflictReplace, APinnedBlockKeepsItsBytesAndTheCommitSaysSo) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start({"--set", "tiers.on_conflict=replace"})) << d.log();
  Peer a, b;
  ASSERT_TRUE(a.Open(d.socket(), "first")) << kvtier_last_error();
  ASSERT_TRUE(b.Open(d.socket(), "second")) << kvtier_last_error();
  const std::vector<kvtier_key> keys{Key(3, 0)};
  Poison(a, keys);
  uint64_t pin = 0;
  kvtier_slot ps{};
  size_t n = 0;
  ASSERT_EQ(kvtier_acquire(a.c, a.cid, keys.data(), 1, KVTIER_TIER_HOST, &pin, &ps, &n), KVTIER_OK);
  std::vector<kvtier_slot> slots;
  const uint64_t lease = Stage(b, keys, false, &slots);
  auto items = Items(slots, keys);
  n = 99;
  EXPECT_EQ(kvtier_commit(b.c, b.cid, lease, items.data(), 1, &n), KVTIER_CONFLICT) << kvtier_last_error();
  EXPECT_EQ(n, 0u);
  ASSERT_EQ(kvtier_release(b.c, lease), KVTIER_OK);
  ASSERT_EQ(kvtier_release(a.c, pin), KVTIER_OK);
}

// drop-disputed, an honest re-commit while the disputer pins the key: reported disputed,
// never same_bytes (nothing of it can be acquired), the plain commit answers CONFLICT
// saying why; once the pin ends the block goes and a commit stores and serves the bytes.
TEST(CommitConflictDropDisputed, ARecommitWhileTheDisputerPinsIsReportedAndStoredAfter) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start({"--set", "tiers.on_conflict=drop-disputed"})) << d.log();
  Peer honest, disputer;
  ASSERT_TRUE(honest.Open(d.socket(), "honest")) << kvtier_last_error();
  ASSERT_TRUE(disputer.Open(d.socket(), "disputer")) << kvtier_last_error();
  std::vector<kvtier_key> keys;
  for (uint64_t i = 0; i < 4; ++i) keys.push_back(Key(4, i));
  auto commit = [&](bool report, kvtier_commit_result* r, size_t* n) {
    std::vector<kvtier_slot> slots;
    const uint64_t lease = Stage(honest, keys, false, &slots);
    auto items = Items(slots, keys);
    const kvtier_status s = report ? kvtier_commit_report(honest.c, honest.cid, lease, items.data(), 4, r)
                                   : kvtier_commit(honest.c, honest.cid, lease, items.data(), 4, n);
    EXPECT_EQ(kvtier_release(honest.c, lease), KVTIER_OK);
    return s;
  };
  kvtier_commit_result r{};
  size_t n = 0;
  ASSERT_EQ(commit(true, &r, &n), KVTIER_OK);
  ASSERT_EQ(r.stored, 4u);
  // The disputer pins the honest blocks, then commits other bytes under them.
  uint64_t pin = 0;
  std::vector<kvtier_slot> ps(4);
  ASSERT_EQ(kvtier_acquire(disputer.c, disputer.cid, keys.data(), 4, KVTIER_TIER_HOST, &pin, ps.data(), &n), KVTIER_OK);
  ASSERT_EQ(n, 4u);
  Poison(disputer, keys);
  EXPECT_EQ(OwnServed(honest, keys), 0u);
  // The honest re-commit: not "same bytes".
  r = {};
  ASSERT_EQ(commit(true, &r, &n), KVTIER_OK);
  EXPECT_EQ(r.same_bytes, 0u) << "same_bytes reported for keys nothing can acquire";
  EXPECT_EQ(r.disputed, 4u);
  EXPECT_EQ(r.committed, 4u);
  EXPECT_EQ(OwnServed(honest, keys), 0u);
  {
    std::vector<kvtier_slot> slots;
    const uint64_t lease = Stage(honest, keys, false, &slots);
    auto items = Items(slots, keys);
    n = 99;
    EXPECT_EQ(kvtier_commit(honest.c, honest.cid, lease, items.data(), 4, &n), KVTIER_CONFLICT);
    const std::string err = kvtier_last_error();
    EXPECT_EQ(n, 0u);
    EXPECT_NE(err.find("disputed"), std::string::npos) << err;
    EXPECT_NE(err.find("commit again"), std::string::npos) << err;
    ASSERT_EQ(kvtier_release(honest.c, lease), KVTIER_OK);
  }
  // The pin ends: the disputed blocks go, and the honest bytes are stored and served.
  ASSERT_EQ(kvtier_release(disputer.c, pin), KVTIER_OK);
  EXPECT_EQ(OwnServed(honest, keys), 0u);
  r = {};
  ASSERT_EQ(commit(true, &r, &n), KVTIER_OK);
  EXPECT_EQ(r.stored, 4u) << "the disputed blocks outlived their last pin";
  EXPECT_EQ(OwnServed(honest, keys), 4u);
  EXPECT_EQ(OwnServed(disputer, keys), 4u);
}

}  // namespace
}  // namespace kvtier::testing
