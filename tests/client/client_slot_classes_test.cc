// Slot size classes (tiers.slot_classes, tiers/slab_allocator.h) against a real kvtierd:
// two contracts of different block sizes in one daemon, each in the smallest class that
// holds it, its fill reported and logged; slot s at s * granule for every class; the
// classes share the host tier's slabs by demand (a starved class takes a slab from the
// other, whose blocks go to NVMe first); the bytes survive a restart through NVMe.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "formats/wire.h"
#include "kvtier/kvtier.h"
#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

kvtier_client* ConnectClient(const std::string& socket) {
  kvtier_connect_options o{};
  o.name = "slot-classes";
  kvtier_client* c = nullptr;
  if (kvtier_connect(socket.c_str(), &o, &c) != KVTIER_OK) return nullptr;
  return c;
}

std::string LastError() { return kvtier_last_error(); }

// 14 layers x 288 bytes = 4032 bytes a block: the 4 KiB class (fill 98.4%).
kvtier_contract_desc SmallDesc() {
  kvtier_contract_desc d = SmallContract("test/small");
  d.num_layers = 14;
  return d;
}
// 40 layers x 288 bytes = 11520 bytes a block: the 12 KiB class (fill 93.75%).
kvtier_contract_desc LargeDesc() {
  kvtier_contract_desc d = SmallContract("test/large");
  d.num_layers = 40;
  return d;
}

DaemonConfig ClassedConfig() {
  DaemonConfig c;
  c.slot_bytes = "12KiB";
  c.host_capacity = "240KiB";  // 5 slabs of 48 KiB: 12 slots of 4 KiB or 4 of 12 KiB each
  c.nvme_capacity = "4MiB";
  return c;
}
// One client may hold every slot here (daemon.max_tier_share_per_client: 1, so its staging
// area has the 60 slots of the smallest class): the limits under test are the classes'.
// The high watermark at 1: eviction on demand only, so counts are exact.
const std::vector<std::string> kClasses{"--set", "tiers.slot_classes=4KiB,12KiB",       "--set",
                                        "tiers.slab_bytes=48KiB",        "--set", "daemon.max_tier_share_per_client=1",
                                        "--set", "tiers.host.high_watermark=1", "--set", "tiers.host.low_watermark=0.99"};

std::vector<uint32_t> Tokens(size_t blocks, uint32_t seed) {
  std::vector<uint32_t> t(16 * blocks);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint32_t>(i * 31 + seed);
  return t;
}

// Stores `blocks` blocks of a contract, block i filled by FillBlock with its key.
void Store(kvtier_client* c, uint64_t cid, uint64_t bytes, const std::vector<uint32_t>& tokens) {
  const size_t n = tokens.size() / 16;
  std::vector<kvtier_key> keys(n);
  size_t nk = 0;
  ASSERT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), n, &nk), KVTIER_OK);
  std::vector<std::vector<uint8_t>> data(n, std::vector<uint8_t>(bytes));
  std::vector<const void*> ptrs(n);
  for (size_t i = 0; i < n; ++i) {
    FillBlock(data[i].data(), bytes, cid, keys[i]);
    ptrs[i] = data[i].data();
  }
  size_t stored = 0;
  kvtier_status s = KVTIER_RETRY;
  // RETRY while the class's dirty blocks are being demoted to NVMe (at most 10 s).
  for (int i = 0; i < 1000 && s == KVTIER_RETRY; ++i) {
    s = kvtier_store_tokens(c, cid, tokens.data(), tokens.size(), ptrs.data(), &stored);
    if (s == KVTIER_RETRY) ::usleep(10000);
  }
  ASSERT_EQ(s, KVTIER_OK) << LastError();
  ASSERT_EQ(stored, n);
}

// Acquires every block of `tokens` into host and checks each one's bytes and slot size;
// returns the hits.
size_t AcquireAndCheck(kvtier_client* c, uint64_t cid, uint64_t bytes, uint64_t class_bytes,
                       const std::vector<uint32_t>& tokens) {
  const size_t n = tokens.size() / 16;
  std::vector<kvtier_key> keys(n);
  size_t nk = 0;
  EXPECT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), n, &nk), KVTIER_OK);
  std::vector<kvtier_slot> slots(n);
  uint64_t lease = 0;
  size_t got = 0;
  EXPECT_EQ(kvtier_acquire(c, cid, keys.data(), n, KVTIER_TIER_HOST, &lease, slots.data(), &got), KVTIER_OK)
      << LastError();
  uint64_t window = 0;
  auto* base = static_cast<const uint8_t*>(kvtier_host_arena(c, &window));
  const uint64_t granule = kvtier_host_granule(c);
  std::vector<uint8_t> want(bytes);
  for (size_t i = 0; i < got; ++i) {
    const auto* p = static_cast<const uint8_t*>(kvtier_host_slot(c, slots[i].slot));
    EXPECT_NE(p, nullptr) << "slot " << slots[i].slot;
    if (p == nullptr) continue;
    EXPECT_EQ(p, base + uint64_t{slots[i].slot} * granule);  // one rule for every class
    EXPECT_LE(uint64_t(p - base) + class_bytes, window);
    FillBlock(want.data(), bytes, cid, keys[i]);
    EXPECT_EQ(std::memcmp(p, want.data(), bytes), 0) << "block " << i << " in slot " << slots[i].slot;
  }
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  return got;
}

// Where each of a contract's blocks is: how many in host, how many anywhere.
std::pair<size_t, size_t> Where(kvtier_client* c, uint64_t cid, const std::vector<uint32_t>& tokens) {
  const size_t n = tokens.size() / 16;
  std::vector<kvtier_key> keys(n);
  size_t nk = 0;
  EXPECT_EQ(kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), n, &nk), KVTIER_OK);
  kvtier_lookup_result r{};
  std::vector<uint8_t> tiers(n);
  EXPECT_EQ(kvtier_lookup(c, cid, keys.data(), n, &r, tiers.data()), KVTIER_OK) << LastError();
  size_t host = 0;
  for (size_t i = 0; i < r.hit_blocks; ++i) host += tiers[i] == KVTIER_TIER_HOST ? 1 : 0;
  return {host, r.hit_blocks};
}

TEST(SlotClasses, TwoContractsShareOneDaemonEachInItsClass) {
  DaemonProcess d(ClassedConfig());
  ASSERT_TRUE(d.Start(kClasses)) << d.log();
  kvtier_client* a = ConnectClient(d.socket());
  kvtier_client* b = ConnectClient(d.socket());
  ASSERT_NE(a, nullptr) << LastError();
  ASSERT_NE(b, nullptr) << LastError();
  EXPECT_EQ(kvtier_host_granule(a), 4096u);
  uint64_t classes[4] = {};
  ASSERT_EQ(kvtier_host_slot_classes(a, classes, 4), 2u);
  EXPECT_EQ(classes[0], 4096u);
  EXPECT_EQ(classes[1], 12288u);
  const auto ds = SmallDesc(), dl = LargeDesc();
  uint64_t small = 0, large = 0, small_bytes = 0, large_bytes = 0;
  ASSERT_EQ(kvtier_contract_block_bytes(&ds, &small_bytes), KVTIER_OK);
  ASSERT_EQ(kvtier_contract_block_bytes(&dl, &large_bytes), KVTIER_OK);
  ASSERT_EQ(small_bytes, 4032u);
  ASSERT_EQ(large_bytes, 11520u);
  ASSERT_EQ(kvtier_register_contract(a, &ds, &small), KVTIER_OK) << LastError();
  ASSERT_EQ(kvtier_register_contract(b, &dl, &large), KVTIER_OK) << LastError();
  uint64_t slot = 0;
  double fill = 0;
  ASSERT_EQ(kvtier_contract_slot(a, small, &slot, &fill), KVTIER_OK) << LastError();
  EXPECT_EQ(slot, 4096u);
  EXPECT_DOUBLE_EQ(fill, 4032.0 / 4096.0);
  ASSERT_EQ(kvtier_contract_slot(b, large, &slot, &fill), KVTIER_OK) << LastError();
  EXPECT_EQ(slot, 12288u);
  EXPECT_DOUBLE_EQ(fill, 11520.0 / 12288.0);
  EXPECT_EQ(kvtier_contract_slot(a, large, &slot, &fill), KVTIER_NOT_FOUND);  // a did not register it
  // The registration line (client-caused lines go out once per interval: the first one).
  EXPECT_NE(d.log().find("blocks of 4032 B in host slots of 4096 B, fill 98.4%"), std::string::npos) << d.log();

  // Interleaved stores of both contracts: each block in a slot of its class, none
  // overlapping another (the bytes of every block read back as stored).
  const auto ts = Tokens(6, 1), tl = Tokens(4, 2);
  Store(a, small, small_bytes, ts);
  Store(b, large, large_bytes, tl);
  EXPECT_EQ(AcquireAndCheck(a, small, small_bytes, 4096, ts), 6u);
  EXPECT_EQ(AcquireAndCheck(b, large, large_bytes, 12288, tl), 4u);

  // No fixed shares: the small contract fills four of the five slabs (48 blocks, where
  // equal shares would hold 30); the large contract's slab stays while its blocks are not
  // the coldest.
  std::vector<std::vector<uint32_t>> more;
  for (uint32_t p = 0; p < 4; ++p) {
    more.push_back(Tokens(10, 100 + p));
    Store(a, small, small_bytes, more.back());
  }
  size_t small_in_host = Where(a, small, ts).first;
  for (const auto& t : more) small_in_host += Where(a, small, t).first;
  EXPECT_EQ(small_in_host, 46u);  // 4 slabs of 12
  EXPECT_EQ(Where(b, large, tl), (std::pair<size_t, size_t>{4, 4}));
  for (const auto& t : more) EXPECT_EQ(AcquireAndCheck(a, small, small_bytes, 4096, t), 10u);
  EXPECT_EQ(AcquireAndCheck(b, large, large_bytes, 12288, tl), 4u);

  // Through NVMe across a restart: both contracts' blocks come back into their classes.
  ASSERT_EQ(kvtier_flush(a), KVTIER_OK) << LastError();
  kvtier_close(a);
  kvtier_close(b);
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start(kClasses)) << d.log();
  kvtier_client* c = ConnectClient(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  ASSERT_EQ(kvtier_register_contract(c, &ds, &small), KVTIER_OK) << LastError();
  ASSERT_EQ(kvtier_register_contract(c, &dl, &large), KVTIER_OK) << LastError();
  EXPECT_EQ(AcquireAndCheck(c, large, large_bytes, 12288, tl), 4u);
  EXPECT_EQ(AcquireAndCheck(c, small, small_bytes, 4096, ts), 6u);
  for (const auto& t : more) EXPECT_EQ(AcquireAndCheck(c, small, small_bytes, 4096, t), 10u);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The default configuration (tiers.slot_classes = "auto") with the default slot size: a
// Llama-3-8B-shaped contract (32 layers x 8 KV heads x 128, 16-token NVFP4 blocks: 576
// KiB) beside an 80-layer one (1440 KiB) in one daemon, each in a class it fills, and
// their blocks stored and read back byte for byte. With one slot size the first filled
// 40% of its slot.
TEST(SlotClasses, DefaultConfigFitsLlamaBesideAnEightyLayerModel) {
  DaemonConfig cfg;
  cfg.slot_bytes = "1440KiB";
  cfg.host_capacity = "64MiB";  // slabs of 2880 KiB (slab_bytes "auto")
  cfg.nvme_capacity = "0";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  kvtier_client* c = ConnectClient(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  uint64_t classes[4] = {};
  ASSERT_EQ(kvtier_host_slot_classes(c, classes, 4), 4u);
  EXPECT_EQ(classes[1], 576u << 10);
  EXPECT_EQ(classes[3], 1440u << 10);
  kvtier_contract_desc llama = SmallContract("test/llama-3-8b-shaped");
  llama.num_layers = 32;
  llama.num_kv_heads = 8;
  llama.head_dim = 128;
  kvtier_contract_desc big = llama;
  big.model_id = "test/80-layer";
  big.num_layers = 80;
  uint64_t cl = 0, cb = 0, bl = 0, bb = 0;
  ASSERT_EQ(kvtier_contract_block_bytes(&llama, &bl), KVTIER_OK);
  ASSERT_EQ(kvtier_contract_block_bytes(&big, &bb), KVTIER_OK);
  ASSERT_EQ(bl, 576u << 10);
  ASSERT_EQ(bb, 1440u << 10);
  ASSERT_EQ(kvtier_register_contract(c, &llama, &cl), KVTIER_OK) << LastError();
  ASSERT_EQ(kvtier_register_contract(c, &big, &cb), KVTIER_OK) << LastError();
  for (const auto& [cid, bytes] : {std::pair{cl, bl}, std::pair{cb, bb}}) {
    uint64_t slot = 0;
    double fill = 0;
    ASSERT_EQ(kvtier_contract_slot(c, cid, &slot, &fill), KVTIER_OK) << LastError();
    EXPECT_EQ(slot, bytes);
    EXPECT_GE(fill, 0.9) << "a block of " << bytes << " B in a slot of " << slot << " B";
  }
  const auto tl = Tokens(8, 5), tb = Tokens(4, 6);
  Store(c, cl, bl, tl);
  Store(c, cb, bb, tb);
  EXPECT_EQ(AcquireAndCheck(c, cl, bl, bl, tl), 8u);
  EXPECT_EQ(AcquireAndCheck(c, cb, bb, bb, tb), 4u);
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// A class that holds no slab takes one from the other: with every slab of the host tier
// full of small blocks, the large contract still stores; the blocks of the slab it took
// went to NVMe first (every small block is still found, with its bytes).
TEST(SlotClasses, AStarvedClassTakesASlabFromTheOther) {
  DaemonProcess d(ClassedConfig());
  ASSERT_TRUE(d.Start(kClasses)) << d.log();
  kvtier_client* a = ConnectClient(d.socket());
  kvtier_client* b = ConnectClient(d.socket());
  ASSERT_NE(a, nullptr) << LastError();
  ASSERT_NE(b, nullptr) << LastError();
  const auto ds = SmallDesc(), dl = LargeDesc();
  uint64_t small = 0, large = 0;
  ASSERT_EQ(kvtier_register_contract(a, &ds, &small), KVTIER_OK) << LastError();
  ASSERT_EQ(kvtier_register_contract(b, &dl, &large), KVTIER_OK) << LastError();
  std::vector<std::vector<uint32_t>> sm;
  for (uint32_t p = 0; p < 6; ++p) {
    sm.push_back(Tokens(10, 300 + p));
    Store(a, small, 4032, sm.back());
  }
  size_t in_host = 0;
  for (const auto& t : sm) in_host += Where(a, small, t).first;
  EXPECT_GE(in_host, 55u);  // about every slab (the high watermark demotes a few)
  const auto tl = Tokens(4, 7);
  Store(b, large, 11520, tl);
  EXPECT_EQ(AcquireAndCheck(b, large, 11520, 12288, tl), 4u);
  for (const auto& t : sm) {
    EXPECT_EQ(Where(a, small, t).second, 10u);  // host or NVMe, none lost
    EXPECT_EQ(AcquireAndCheck(a, small, 4032, 4096, t), 10u);
  }
  // The move is counted: the host tier's slab_moves in the stats record and /metrics.
  kvtier_tier_stats ts[4];
  size_t nts = 0;
  ASSERT_EQ(kvtier_stats(a, ts, 4, &nts), KVTIER_OK) << LastError();
  uint32_t moves = 0;
  for (size_t i = 0; i < nts; ++i) moves += ts[i].tier == KVTIER_TIER_HOST ? ts[i].slab_moves : 0;
  EXPECT_GE(moves, 1u);
  EXPECT_EQ(MetricValue(HttpGet(d.metrics_port(), "/metrics"), "kvtier_tier_slab_moves_total{tier=\"host\"}"),
            static_cast<double>(moves));
  kvtier_close(a);
  kvtier_close(b);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

// The caller's own pins fill its contract's class: REJECTED with the class's numbers (the
// most the class holds with every slab), not a RETRY that would never pass.
TEST(SlotClasses, AllocOverTheCallersOwnPinsOfItsClassIsRejected) {
  DaemonProcess d(ClassedConfig());
  ASSERT_TRUE(d.Start(kClasses)) << d.log();
  kvtier_client* c = ConnectClient(d.socket());
  ASSERT_NE(c, nullptr) << LastError();
  const auto ds = SmallDesc();
  uint64_t small = 0;
  ASSERT_EQ(kvtier_register_contract(c, &ds, &small), KVTIER_OK) << LastError();
  std::vector<kvtier_slot> slots(60);
  uint64_t lease = 0, more = 0;
  ASSERT_EQ(kvtier_alloc(c, small, 60, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK) << LastError();
  EXPECT_EQ(kvtier_alloc(c, small, 1, KVTIER_TIER_HOST, &more, slots.data()), KVTIER_REJECTED) << LastError();
  const std::string err = LastError();
  EXPECT_NE(err.find("60 slots of the request's slot class (4096 B)"), std::string::npos) << err;
  EXPECT_NE(err.find("this client holds 60"), std::string::npos) << err;
  EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  EXPECT_EQ(kvtier_alloc(c, small, 1, KVTIER_TIER_HOST, &more, slots.data()), KVTIER_OK) << LastError();
  kvtier_close(c);
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

TEST(SlotClasses, BadClassesAreRefusedAtStartByName) {
  DaemonProcess d(ClassedConfig());
  EXPECT_FALSE(d.Start({"--set", "tiers.slot_classes=4KiB,8KiB"}));
  EXPECT_NE(d.log().find("the largest class must be tiers.slot_bytes"), std::string::npos) << d.log();
  DaemonProcess e(ClassedConfig());
  EXPECT_FALSE(e.Start({"--set", "tiers.slot_classes=4KiB,12KiB", "--set", "tiers.slab_bytes=8KiB"}));
  EXPECT_NE(e.log().find("tiers.slab_bytes"), std::string::npos) << e.log();
}

}  // namespace
}  // namespace kvtier::testing
