// Safetensors reader/writer and the KV-dump convention; malformed files are refused with
// a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tools/quality/safetensors.h"

namespace kvtier::quality {
namespace {

std::vector<uint8_t> MakeFile(const std::string& header, size_t data_bytes, uint64_t claimed_len = ~0ull) {
  std::vector<uint8_t> f(8 + header.size() + data_bytes, 0);
  const uint64_t n = claimed_len == ~0ull ? header.size() : claimed_len;
  std::memcpy(f.data(), &n, 8);
  std::memcpy(f.data() + 8, header.data(), header.size());
  return f;
}

Status ParseStatus(const std::vector<uint8_t>& f) { return SafetensorsView::Parse(f).status(); }

void ExpectRefused(const std::vector<uint8_t>& f, const std::string& words) {
  const Status s = ParseStatus(f);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find('\n'), std::string::npos);
}

TEST(Safetensors, ConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(Bf16ToFloat(0xC040), -3.0f);
  EXPECT_EQ(FloatToF16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToFloat(0xC500), -5.0f);
}

TEST(Safetensors, WriteThenReadEveryDtype) {
  std::vector<float> a = {1.5f, -2.0f, 0.25f, 1024.0f, -0.0f, 3.0f};
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    auto bytes = SerializeSafetensors({{"x", d, {2, 3}, a}, {"y", DType::kF32, {1}, std::span(a).first(1)}},
                                      {{"who", "test"}});
    ASSERT_TRUE(bytes.ok());
    uint64_t hn;
    std::memcpy(&hn, bytes->data(), 8);
    EXPECT_EQ((8 + hn) % 8, 0u);
    auto v = SafetensorsView::Parse(*bytes);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    const TensorInfo* t = v->Find("x");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->dtype, d);
    EXPECT_EQ(t->shape, (std::vector<uint64_t>{2, 3}));
    std::vector<float> back;
    ASSERT_TRUE(v->ReadFloat(*t, &back).ok());
    EXPECT_EQ(back, a);
    EXPECT_EQ(v->metadata().at("who"), "test");
  }
}

TEST(Safetensors, RefusesMalformedFiles) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  ASSERT_TRUE(ParseStatus(MakeFile(ok, 16)).ok());
  ExpectRefused({1, 2, 3}, "too short");
  ExpectRefused(MakeFile(ok, 16, 1000), "bad header length");
  ExpectRefused(MakeFile(ok, 16, 1ull << 62), "bad header length");
  ExpectRefused(MakeFile("[1,2]", 0), "JSON object");
  ExpectRefused(MakeFile("{\"a\": ", 0), "well-formed");
  ExpectRefused(MakeFile(R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16),
                "dtype I64 is not supported");
  ExpectRefused(MakeFile(R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", 16),
                "shape mismatch");
  ExpectRefused(MakeFile(R"({"a":{"dtype":"F32","shape":[2,-2],"data_offsets":[0,16]}})", 16),
                "non-negative");
  ExpectRefused(MakeFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", 16),
                "out of range");
  ExpectRefused(MakeFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[16,0]}})", 16),
                "out of range");
  ExpectRefused(MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                            "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 16),
                "overlap");
  ExpectRefused(MakeFile(R"({"a":{"dtype":"F32","shape":[2]}})", 16), "data_offsets");
  ExpectRefused(MakeFile(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 16), "dtype");
  ExpectRefused(MakeFile(R"({"__metadata__":{"x":1}})", 0), "__metadata__");
  EXPECT_EQ(ParseStatus(MakeFile(R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16)).code(),
            StatusCode::kUnsupported);
}

TEST(Safetensors, RefusesNonFiniteValues) {
  std::vector<float> a = {1.0f, NAN};
  auto bytes = SerializeSafetensors({{"x", DType::kF32, {2}, a}});
  ASSERT_TRUE(bytes.ok());
  auto v = SafetensorsView::Parse(*bytes);
  ASSERT_TRUE(v.ok());
  std::vector<float> back;
  const Status s = v->ReadFloat(*v->Find("x"), &back);
  EXPECT_TRUE(s.IsInvalid());
  EXPECT_NE(s.message().find("not finite"), std::string::npos);
}

std::vector<uint8_t> Dump(std::vector<TensorOut> ts) {
  auto b = SerializeSafetensors(ts);
  EXPECT_TRUE(b.ok());
  return *b;
}

TEST(KvDump, IndexesTheConvention) {
  std::vector<float> kv(4 * 2 * 32, 0.5f), q(3 * 4 * 32, 1.0f);
  const std::vector<uint64_t> sh = {4, 2, 32};
  auto f = Dump({{"layers.0.k", DType::kBF16, sh, kv}, {"layers.0.v", DType::kBF16, sh, kv},
                 {"layers.1.k", DType::kF32, sh, kv}, {"layers.1.v", DType::kF16, sh, kv},
                 {"layers.0.q", DType::kF32, {3, 4, 32}, q}, {"layers.1.q", DType::kF32, {3, 4, 32}, q},
                 {"embed", DType::kF32, {1}, std::span(q).first(1)}});
  auto v = SafetensorsView::Parse(f);
  ASSERT_TRUE(v.ok());
  auto idx = IndexKvDump(*v);
  ASSERT_TRUE(idx.ok()) << idx.status().ToString();
  EXPECT_EQ(idx->layers, (std::vector<int>{0, 1}));
  EXPECT_EQ(idx->shape.tokens, 4u);
  EXPECT_EQ(idx->shape.kv_heads, 2u);
  EXPECT_EQ(idx->shape.head_dim, 32u);
  EXPECT_TRUE(idx->has_queries);
  EXPECT_EQ(idx->q_heads, 4u);
  auto only = IndexKvDump(*v, {1});
  ASSERT_TRUE(only.ok());
  EXPECT_EQ(only->layers, std::vector<int>{1});
  EXPECT_TRUE(IndexKvDump(*v, {2}).status().IsInvalid());
}

TEST(KvDump, RefusesBrokenDumps) {
  std::vector<float> kv(4 * 2 * 64, 0.5f);
  auto check = [](std::vector<uint8_t> f, const std::string& words) {
    auto v = SafetensorsView::Parse(f);
    ASSERT_TRUE(v.ok());
    const Status s = IndexKvDump(*v).status();
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(words), std::string::npos) << s.message();
  };
  check(Dump({{"layers.0.k", DType::kF32, {4, 2, 64}, kv}}), "layers.0.v is missing");
  check(Dump({{"x", DType::kF32, {4, 2, 64}, kv}}), "no KV tensors");
  check(Dump({{"layers.0.k", DType::kF32, {8, 64}, kv}, {"layers.0.v", DType::kF32, {8, 64}, kv}}),
        "expected [tokens, kv_heads, head_dim]");
  check(Dump({{"layers.0.k", DType::kF32, {4, 2, 64}, kv}, {"layers.0.v", DType::kF32, {2, 4, 64}, kv}}),
        "unlike the other");
  check(Dump({{"layers.0.k", DType::kF32, {4, 4, 32}, kv}, {"layers.0.v", DType::kF32, {4, 4, 32}, kv},
              {"layers.1.k", DType::kF32, {4, 2, 64}, kv}, {"layers.1.v", DType::kF32, {4, 2, 64}, kv}}),
        "unlike the other");
  std::vector<float> odd(4 * 2 * 48, 0.5f);
  check(Dump({{"layers.0.k", DType::kF32, {4, 2, 48}, odd}, {"layers.0.v", DType::kF32, {4, 2, 48}, odd}}),
        "multiple of 32");
  std::vector<float> q(3 * 3 * 64, 1.0f);
  check(Dump({{"layers.0.k", DType::kF32, {4, 2, 64}, kv}, {"layers.0.v", DType::kF32, {4, 2, 64}, kv},
              {"layers.0.q", DType::kF32, {3, 3, 64}, q}}),
        "multiple of kv_heads");
}

TEST(KvDump, LayerLists) {
  auto a = ParseLayerList("0,2,5-7");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, (std::vector<int>{0, 2, 5, 6, 7}));
  auto b = ParseLayerList("3,1,1");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, (std::vector<int>{1, 3}));
  for (const char* bad : {"", "a", "3-1", "1,,2", "-1", "1-", "01x"}) {
    EXPECT_TRUE(ParseLayerList(bad).status().IsInvalid()) << bad;
  }
}

}  // namespace
}  // namespace kvtier::quality
