// Slot sizes made per contract (tiers.slot_classes = "per-contract") on the shipped
// config/kvtier.toml, against a real kvtierd and real clients: the 18 listed model shapes
// (Llama-3-8B, Llama-3-70B, Qwen3-8B attention geometries x NVFP4, FP8, BF16 x 16- and
// 64-token blocks, 576 KiB to 20 MiB) register from two clients, each client learns its
// contracts' slots at registration, its staging slots follow them (slots of several
// sizes held at once, none overlapping), every block is read back byte-exact by the
// other client, each tier's slot bytes stay within 10% of the blocks' own bytes (the
// daemon's stats), the blocks survive a restart through NVMe, a 64 MiB block is stored,
// a 65 MiB one is refused by name, and a client of protocol 8 is refused at attach.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "formats/wire.h"
#include "kvtier/kvtier.h"
#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kEach = 2;  // blocks stored per shape

struct Shape {
  std::string model;
  kvtier_contract_desc desc{};
  uint64_t id = 0;
  uint64_t block_bytes = 0;
};

std::vector<Shape> ListedShapes() {
  std::vector<Shape> out;
  for (uint32_t layers : {32u, 80u, 36u}) {
    for (uint8_t format : {uint8_t{0}, uint8_t{1}, uint8_t{2}}) {  // nvfp4, fp8, bf16
      for (uint32_t tokens : {16u, 64u}) {
        Shape s;
        s.model = "shape/L" + std::to_string(layers) + "-f" + std::to_string(format) + "-t" + std::to_string(tokens);
        out.push_back(std::move(s));
        kvtier_contract_desc& d = out.back().desc;
        d.model_revision = "r1";
        d.tokenizer_revision = "t1";
        d.num_layers = layers;
        d.num_kv_heads = 8;
        d.head_dim = 128;
        d.block_tokens = tokens;
        d.tp_size = 1;
        d.kv_format = format;
      }
    }
  }
  for (Shape& s : out) {
    s.desc.model_id = s.model.c_str();
    EXPECT_EQ(kvtier_contract_block_bytes(&s.desc, &s.block_bytes), KVTIER_OK);
  }
  return out;
}

kvtier_client* Connect(const std::string& socket, const char* name) {
  kvtier_connect_options o{};
  o.name = name;
  kvtier_client* c = nullptr;
  return kvtier_connect(socket.c_str(), &o, &c) == KVTIER_OK ? c : nullptr;
}

kvtier_key KeyOf(size_t shape, uint64_t i) { return kvtier_key{0x5A0E0000ull + shape, i + 1}; }

kvtier_tier_stats Stat(kvtier_client* c, kvtier_tier t) {
  kvtier_tier_stats s[4] = {};
  size_t n = 0;
  EXPECT_EQ(kvtier_stats(c, s, 4, &n), KVTIER_OK) << kvtier_last_error();
  for (size_t i = 0; i < n; ++i) {
    if (s[i].tier == t) return s[i];
  }
  return {};
}

// The shipped config file, with the socket, metrics port, capacities and NVMe folder of
// this test: 3 GiB host and NVMe tiers hold 24 and 23 slabs of 128 MiB (a slab holds the
// largest block twice), one for each of the 17 slot sizes of the shapes and the 64 MiB one.
std::vector<std::string> ShippedArgs(const DaemonProcess& d) {
  return {"--set", "daemon.socket=\"" + d.socket() + "\"",
          "--set", "daemon.metrics_port=" + std::to_string(d.metrics_port()),
          "--set", "tiers.host.capacity=3GiB",
          "--set", "tiers.nvme.capacity=3GiB",
          "--set", "tiers.nvme.dir=\"" + d.dir() + "/nvme\""};
}

// Stores kEach blocks of each shape in `mine` from client c: every lease is taken first
// (staging slots of several sizes held at once), then written, committed and released.
void StoreShapes(kvtier_client* c, const std::vector<Shape>& shapes, const std::vector<size_t>& mine) {
  uint64_t window = 0;
  auto* base = static_cast<uint8_t*>(kvtier_host_arena(c, &window));
  ASSERT_NE(base, nullptr);
  const uint64_t granule = kvtier_host_granule(c);
  struct Held {
    size_t shape;
    uint64_t lease;
    kvtier_slot slots[kEach];
  };
  std::vector<Held> held;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // staging slots: [offset, offset + slot bytes)
  for (size_t j : mine) {
    uint64_t slot_bytes = 0;
    ASSERT_EQ(kvtier_contract_slot(c, shapes[j].id, &slot_bytes, nullptr), KVTIER_OK);
    Held h{j, 0, {}};
    ASSERT_EQ(kvtier_alloc_wait(c, shapes[j].id, kEach, KVTIER_TIER_HOST, 10000, &h.lease, h.slots), KVTIER_OK)
        << shapes[j].model << ": " << kvtier_last_error();
    for (const kvtier_slot& s : h.slots) {
      auto* p = static_cast<uint8_t*>(kvtier_host_slot_write(c, s.slot));
      ASSERT_NE(p, nullptr) << "staging slot " << s.slot;
      const uint64_t off = uint64_t{s.slot} * granule;
      EXPECT_EQ(p, base + off);
      EXPECT_LE(off + slot_bytes, window) << shapes[j].model;
      ranges.emplace_back(off, off + slot_bytes);
    }
    held.push_back(h);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "staging slots overlap";
  }
  for (const Held& h : held) {
    const Shape& s = shapes[h.shape];
    kvtier_commit_item items[kEach] = {};
    for (uint64_t i = 0; i < kEach; ++i) {
      items[i].slot = h.slots[i];
      items[i].key = KeyOf(h.shape, i);
      FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c, h.slots[i].slot)), s.block_bytes, s.id, items[i].key);
    }
    size_t committed = 0;
    ASSERT_EQ(kvtier_commit(c, s.id, h.lease, items, kEach, &committed), KVTIER_OK) << kvtier_last_error();
    EXPECT_EQ(committed, kEach);
    ASSERT_EQ(kvtier_release(c, h.lease), KVTIER_OK);
  }
}

// Acquires every stored block of a shape into host from client c and checks its bytes.
void CheckShape(kvtier_client* c, const Shape& s, size_t j) {
  kvtier_key keys[kEach];
  for (uint64_t i = 0; i < kEach; ++i) keys[i] = KeyOf(j, i);
  for (uint64_t i = 0; i < kEach; ++i) {
    kvtier_slot slot{};
    uint64_t lease = 0;
    size_t got = 0;
    ASSERT_EQ(kvtier_acquire(c, s.id, &keys[i], 1, KVTIER_TIER_HOST, &lease, &slot, &got), KVTIER_OK)
        << s.model << ": " << kvtier_last_error();
    ASSERT_EQ(got, 1u) << s.model << " block " << i << " is not served";
    const auto* p = static_cast<const uint8_t*>(kvtier_host_slot(c, slot.slot));
    ASSERT_NE(p, nullptr);
    EXPECT_TRUE(CheckBlock(p, s.block_bytes, s.id, keys[i])) << s.model << " block " << i << " bytes differ";
    EXPECT_EQ(kvtier_release(c, lease), KVTIER_OK);
  }
}

TEST(PerContractSlots, ListedShapesShareTheShippedConfigWithinTenPercentAndSurviveARestart) {
  std::vector<Shape> shapes = ListedShapes();
  ASSERT_EQ(shapes.size(), 18u);
  DaemonProcess d;
  WriteText(d.config_path(), ReadText(std::string(KVTIER_SOURCE_DIR) + "/config/kvtier.toml"));
  const std::vector<std::string> args = ShippedArgs(d);
  ASSERT_TRUE(d.Start(args)) << d.log();
  kvtier_client* a = Connect(d.socket(), "per-contract-a");
  kvtier_client* b = Connect(d.socket(), "per-contract-b");
  ASSERT_NE(a, nullptr) << kvtier_last_error();
  ASSERT_NE(b, nullptr) << kvtier_last_error();
  // No class table fixed at attach: slot_bytes is the largest block, the granule 4 KiB
  // (a 3 GiB host tier).
  EXPECT_EQ(kvtier_slot_bytes(a), 64 * kMiB);
  EXPECT_EQ(kvtier_host_slot_classes(a, nullptr, 0), 0u);
  const uint64_t granule = kvtier_host_granule(a);
  EXPECT_EQ(granule, 4096u);
  // Both clients register every shape; each learns its host slot (the block rounded up to
  // the granule) and no HBM slot (no HBM tier here).
  for (kvtier_client* c : {a, b}) {
    for (Shape& s : shapes) {
      ASSERT_EQ(kvtier_register_contract(c, &s.desc, &s.id), KVTIER_OK) << s.model << ": " << kvtier_last_error();
      uint64_t slot = 0, hbm = 1;
      double fill = 0;
      ASSERT_EQ(kvtier_contract_slot(c, s.id, &slot, &fill), KVTIER_OK);
      EXPECT_EQ(slot, (s.block_bytes + granule - 1) / granule * granule) << s.model;
      EXPECT_GE(fill, 0.9) << s.model;
      ASSERT_EQ(kvtier_contract_hbm_slot(c, s.id, &hbm), KVTIER_OK);
      EXPECT_EQ(hbm, 0u);
    }
  }
  std::vector<size_t> even, odd;
  for (size_t j = 0; j < shapes.size(); ++j) (j % 2 ? odd : even).push_back(j);
  StoreShapes(a, shapes, even);
  StoreShapes(b, shapes, odd);
  uint64_t block_bytes = 0;
  for (const Shape& s : shapes) block_bytes += kEach * s.block_bytes;
  // Each client reads the other's blocks.
  for (size_t j : odd) CheckShape(a, shapes[j], j);
  for (size_t j : even) CheckShape(b, shapes[j], j);
  const kvtier_tier_stats host = Stat(a, KVTIER_TIER_HOST);
  ASSERT_EQ(host.blocks, kEach * shapes.size()) << "every block is in host (a slab for each size)";
  EXPECT_GE(host.used_bytes, block_bytes);
  EXPECT_LE(static_cast<double>(host.used_bytes), 1.10 * static_cast<double>(block_bytes));
  ASSERT_EQ(kvtier_flush(a), KVTIER_OK) << kvtier_last_error();
  const kvtier_tier_stats nvme = Stat(a, KVTIER_TIER_NVME);
  ASSERT_EQ(nvme.blocks, kEach * shapes.size());
  EXPECT_GE(nvme.used_bytes, block_bytes);
  EXPECT_LE(static_cast<double>(nvme.used_bytes), 1.10 * static_cast<double>(block_bytes));
  std::printf("%zu shapes x %llu blocks: %.1f MiB of blocks, host slots %.1f MiB (%.2f%% over), NVMe records "
              "%.1f MiB (%.2f%% over)\n",
              shapes.size(), static_cast<unsigned long long>(kEach), static_cast<double>(block_bytes) / kMiB,
              static_cast<double>(host.used_bytes) / kMiB,
              100.0 * (static_cast<double>(host.used_bytes) / static_cast<double>(block_bytes) - 1.0),
              static_cast<double>(nvme.used_bytes) / kMiB,
              100.0 * (static_cast<double>(nvme.used_bytes) / static_cast<double>(block_bytes) - 1.0));
  kvtier_close(a);
  kvtier_close(b);

  // A restart: the blocks come back from NVMe, the contracts registered in another order.
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start(args)) << d.log();
  kvtier_client* c = Connect(d.socket(), "per-contract-c");
  ASSERT_NE(c, nullptr) << kvtier_last_error();
  EXPECT_EQ(Stat(c, KVTIER_TIER_NVME).blocks, kEach * shapes.size());
  for (size_t j = shapes.size(); j-- > 0;) {
    ASSERT_EQ(kvtier_register_contract(c, &shapes[j].desc, &shapes[j].id), KVTIER_OK) << kvtier_last_error();
  }
  for (size_t j = 0; j < shapes.size(); ++j) CheckShape(c, shapes[j], j);

  // The limit: a 64 MiB block (256 layers of 64-token BF16 pages) is stored and read
  // back; a 65 MiB one is refused at registration, naming tiers.slot_bytes.
  Shape top;
  top.model = "shape/limit";
  top.desc = shapes.back().desc;
  top.desc.model_id = top.model.c_str();
  top.desc.num_layers = 256;
  ASSERT_EQ(kvtier_contract_block_bytes(&top.desc, &top.block_bytes), KVTIER_OK);
  ASSERT_EQ(top.block_bytes, 64 * kMiB);
  ASSERT_EQ(kvtier_register_contract(c, &top.desc, &top.id), KVTIER_OK) << kvtier_last_error();
  shapes.push_back(top);
  StoreShapes(c, shapes, {shapes.size() - 1});
  CheckShape(c, shapes.back(), shapes.size() - 1);
  Shape over = top;
  over.model = "shape/over";
  over.desc.model_id = over.model.c_str();
  over.desc.num_layers = 260;
  ASSERT_EQ(kvtier_contract_block_bytes(&over.desc, &over.block_bytes), KVTIER_OK);
  ASSERT_EQ(over.block_bytes, 65 * kMiB);
  EXPECT_EQ(kvtier_register_contract(c, &over.desc, &over.id), KVTIER_UNSUPPORTED);
  const std::string why = kvtier_last_error();
  EXPECT_NE(why.find("68157440"), std::string::npos) << why;
  EXPECT_NE(why.find("larger than the largest block this daemon holds (67108864 bytes: tiers.slot_bytes)"),
            std::string::npos)
      << why;
  kvtier_close(c);

  // A client of protocol 8 would address slots by a class table fixed at attach: refused,
  // saying why.
  RawClient old;
  wire::AttachReply reply;
  ASSERT_TRUE(old.Attach(d.socket(), &reply, 8));
  EXPECT_EQ(reply.status, static_cast<int32_t>(StatusCode::kUnsupported));
  const std::string msg(reply.message, strnlen(reply.message, sizeof reply.message));
  EXPECT_NE(msg.find("per-contract"), std::string::npos) << msg;
  EXPECT_NE(msg.find("protocol 9"), std::string::npos) << msg;
  EXPECT_TRUE(old.WaitSocketClosed(5000));
  EXPECT_TRUE(d.Alive());
}

}  // namespace
}  // namespace kvtier::testing
