// Scale contract identity and the key chain: canonical bytes, ids, golden values.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <fstream>
#include <map>
#include <string>

#include "formats/contract.h"
#include "formats/keys.h"

namespace kvtier {
namespace {

ScaleContract TestContract() {
  ScaleContract c;
  c.model_id = "kvtier/test-llama";
  c.model_revision = "r1";
  c.tokenizer_revision = "t1";
  c.geometry = {2, 2, 64, 16};
  c.k_scales = {1.0f, 0.5f};
  c.v_scales = {0.25f, 2.0f};
  return c;
}

// Golden values in tests/data/golden_identity.txt: "name value" lines.
std::map<std::string, std::string> Golden() {
  std::map<std::string, std::string> m;
  std::ifstream in(std::string(KVTIER_TEST_DATA_DIR) + "/golden_identity.txt");
  std::string k, v;
  while (in >> k >> v) m[k] = v;
  return m;
}

TEST(Contract, CanonicalBytesBuiltByHand) {
  // Independent construction of the canonical serialization of TestContract().
  std::vector<uint8_t> b;
  auto raw = [&](const void* p, size_t n) {
    b.insert(b.end(), (const uint8_t*)p, (const uint8_t*)p + n);
  };
  auto u32 = [&](uint32_t v) { for (int i = 0; i < 4; ++i) b.push_back((v >> (8 * i)) & 0xFF); };
  auto str = [&](const std::string& s) { u32(s.size()); raw(s.data(), s.size()); };
  auto f32 = [&](float f) { uint32_t u; std::memcpy(&u, &f, 4); u32(u); };
  raw("KVTC", 4);
  b.push_back(1); b.push_back(0);  // version 1, LE
  str("kvtier/test-llama"); str("r1"); str("t1");
  u32(2); u32(2); u32(64); u32(16); u32(0); u32(1);
  b.push_back(0); b.push_back(0); b.push_back(0); b.push_back(0);  // nvfp4, max6, no swizzle
  u32(1);
  f32(1.0f); f32(0.5f); f32(0.25f); f32(2.0f);
  EXPECT_EQ(TestContract().Serialize(), b);
  EXPECT_EQ(TestContract().Id(), XXH3_64bits(b.data(), b.size()));
}

TEST(Contract, IdMatchesGolden) {
  auto g = Golden();
  ASSERT_TRUE(g.count("contract_id")) << "missing tests/data/golden_identity.txt";
  EXPECT_EQ(ContractIdHex(TestContract().Id()), g["contract_id"]);
}

TEST(Contract, EveryFieldChangesTheId) {
  const uint64_t base = TestContract().Id();
  std::vector<ScaleContract> variants(12, TestContract());
  variants[0].model_id = "kvtier/other";
  variants[1].model_revision = "r2";
  variants[2].tokenizer_revision = "t2";
  variants[3].geometry.block_tokens = 32;
  variants[4].geometry.head_dim = 128;
  variants[5].tp_size = 2;
  variants[6].scale_rule = nvfp4::ScaleRule::k4over6;
  variants[7].v_scale_swizzle = true;
  variants[8].k_scales[1] = 0.5000001f;
  variants[9].v_scales[0] = 0.125f;
  variants[10].format = KvFormat::kFp8;
  variants[11].geometry.num_kv_heads = 4;
  for (size_t i = 0; i < variants.size(); ++i) EXPECT_NE(variants[i].Id(), base) << i;
}

TEST(Contract, RoundTripAndValidation) {
  const auto bytes = TestContract().Serialize();
  auto back = ScaleContract::Deserialize(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, TestContract());
  // Every truncation is refused.
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(ScaleContract::Deserialize(std::span(bytes.data(), n)).ok()) << n;
  }
  auto bad = TestContract();
  bad.k_scales.pop_back();
  EXPECT_TRUE(bad.Validate().IsInvalid());
  bad = TestContract();
  bad.v_scales[0] = -1.0f;
  EXPECT_TRUE(bad.Validate().IsInvalid());
  bad = TestContract();
  bad.model_id.clear();
  EXPECT_TRUE(bad.Validate().IsInvalid());
  bad = TestContract();
  bad.tp_rank = 1;
  EXPECT_TRUE(bad.Validate().IsInvalid());
  bad = TestContract();
  bad.layout_version = 2;
  EXPECT_EQ(bad.Validate().code(), StatusCode::kUnsupported);
}

TEST(Keys, XxhLibraryVector) {
  // XXH3-128 of the empty input, seed 0 (xxHash's published test vector).
  const XXH128_hash_t h = XXH3_128bits(nullptr, 0);
  EXPECT_EQ(h.high64, 0x99AA06D3014798D8ull);
  EXPECT_EQ(h.low64, 0x6001C324468D497Full);
}

TEST(Keys, ChainBuiltByHand) {
  std::vector<uint32_t> tokens(64);
  for (uint32_t i = 0; i < 64; ++i) tokens[i] = i * 7919u + 3;
  const uint64_t cid = 0x0123456789ABCDEFull;
  const auto keys = KeyChain(cid, tokens, 16);
  ASSERT_EQ(keys.size(), 4u);
  // key_0: contract id as 8 bytes LE, then the tokens as u32 LE.
  std::vector<uint8_t> buf;
  for (int i = 0; i < 8; ++i) buf.push_back((cid >> (8 * i)) & 0xFF);
  auto push_tokens = [&](size_t from) {
    for (size_t i = from; i < from + 16; ++i) {
      for (int j = 0; j < 4; ++j) buf.push_back((tokens[i] >> (8 * j)) & 0xFF);
    }
  };
  push_tokens(0);
  XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  EXPECT_EQ(keys[0].hi, h.high64);
  EXPECT_EQ(keys[0].lo, h.low64);
  for (size_t k = 1; k < 4; ++k) {
    buf.clear();
    // The parent's canonical form: high 64 bits big-endian, then low 64 bits big-endian.
    for (int i = 7; i >= 0; --i) buf.push_back((h.high64 >> (8 * i)) & 0xFF);
    for (int i = 7; i >= 0; --i) buf.push_back((h.low64 >> (8 * i)) & 0xFF);
    push_tokens(k * 16);
    h = XXH3_128bits(buf.data(), buf.size());
    EXPECT_EQ(keys[k].hi, h.high64) << k;
    EXPECT_EQ(keys[k].lo, h.low64) << k;
  }
  // Only full blocks are keyed; a shared prefix gives shared keys.
  std::vector<uint32_t> longer = tokens;
  longer.resize(64 + 15, 1);
  EXPECT_EQ(KeyChain(cid, longer, 16), keys);
  EXPECT_TRUE(KeyChain(cid, tokens, 0).empty());
}

TEST(Keys, GoldenHex) {
  auto g = Golden();
  std::vector<uint32_t> tokens(64);
  for (uint32_t i = 0; i < 64; ++i) tokens[i] = i * 7919u + 3;
  const auto keys = KeyChain(TestContract().Id(), tokens, 16);
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string name = "key_" + std::to_string(i);
    ASSERT_TRUE(g.count(name)) << name;
    EXPECT_EQ(keys[i].ToHex(), g[name]);
  }
}

TEST(Keys, HexRoundTripAndRefusal) {
  const Key128 k{0x0011223344556677ull, 0x8899AABBCCDDEEFFull};
  EXPECT_EQ(k.ToHex(), "00112233445566778899aabbccddeeff");
  EXPECT_EQ(Key128::FromHex(k.ToHex()), k);
  EXPECT_FALSE(Key128::FromHex("0011").has_value());
  EXPECT_FALSE(Key128::FromHex("g0112233445566778899aabbccddeeff").has_value());
  uint64_t id = 0;
  EXPECT_TRUE(ParseContractIdHex("0123456789abcdef", &id));
  EXPECT_EQ(id, 0x0123456789abcdefull);
  EXPECT_FALSE(ParseContractIdHex("0123", &id));
}

}  // namespace
}  // namespace kvtier
