// Export files: round trip byte-identical; every truncation and flipped byte refused by
// a full verification pass; another version refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "formats/export.h"
#include "formats/nvfp4.h"
#include "tools/cli.h"
#include "tools/export_file.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

ScaleContract SmallContract() {
  ScaleContract c;
  c.model_id = "kvtier/test";
  c.geometry = {2, 2, 64, 16};
  c.SetUnitScales();
  return c;
}

// An NVFP4 block quantized from Gaussian values: what real payloads look like.
std::vector<uint8_t> Nvfp4Block(const ScaleContract& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<uint8_t> out(c.block_bytes());
  const auto g = c.geometry;
  const size_t values = size_t{g.num_kv_heads} * g.block_tokens * g.head_dim;
  const PageLayout p = MakePageLayout(KvFormat::kNvfp4, g);
  std::vector<float> x(values);
  for (uint32_t l = 0; l < g.num_layers; ++l) {
    for (size_t side : {p.k_data, p.v_data}) {
      for (auto& v : x) v = d(rng);
      uint8_t* base = out.data() + PageOffset(KvFormat::kNvfp4, g, l) + side;
      nvfp4::QuantizeUnchecked(x.data(), values, 0.01f, nvfp4::ScaleRule::kMax6, base, base + values / 2);
    }
  }
  return out;
}

class ExportFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvtier_export_" + std::to_string(getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `n` blocks (every third one all zeros, so compression is exercised).
  std::string WriteFile(int n, std::vector<std::vector<uint8_t>>* blocks, std::vector<Key128>* keys) {
    const auto path = (dir_ / "x.kvt").string();
    auto w = ExportWriter::Create(path, SmallContract());
    EXPECT_TRUE(w.ok());
    Key128 parent{};
    for (int i = 0; i < n; ++i) {
      auto b = (i % 3 == 2) ? std::vector<uint8_t>(SmallContract().block_bytes(), 0) : Nvfp4Block(SmallContract(), i);
      const Key128 k{static_cast<uint64_t>(i) + 1, 0xABCDull * (i + 7)};
      EXPECT_TRUE((*w)->Add(k, parent, b).ok());
      parent = k;
      blocks->push_back(b);
      keys->push_back(k);
    }
    EXPECT_TRUE((*w)->Finish().ok());
    EXPECT_EQ((*w)->records(), static_cast<uint64_t>(n));
    if (n >= 3) {
      EXPECT_GT((*w)->compressed_records(), 0u);  // the all-zero blocks
    }
    return path;
  }
  std::vector<uint8_t> Slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void Spit(const std::string& p, const std::vector<uint8_t>& b) {
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
  }
  // The verification pass must refuse the file (or Open must).
  bool Refused(const std::string& p) {
    auto r = ExportReader::Open(p);
    if (!r.ok()) return true;
    uint64_t n;
    return !(*r)->VerifyAll(nullptr, &n).ok();
  }
  fs::path dir_;
};

TEST_F(ExportFile, RoundTripByteIdentical) {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<Key128> keys;
  const auto path = WriteFile(9, &blocks, &keys);
  auto r = ExportReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->contract(), SmallContract());
  uint64_t n = 0;
  ASSERT_TRUE((*r)->VerifyAll(nullptr, &n).ok());
  EXPECT_EQ(n, 9u);
  RecordHeader rec;
  std::vector<uint8_t> payload;
  bool eof = false;
  for (int i = 0; i < 9; ++i) {
    ASSERT_TRUE((*r)->Next(&rec, &payload, &eof).ok());
    ASSERT_FALSE(eof);
    EXPECT_EQ(rec.key, keys[i]);
    EXPECT_EQ(rec.parent, i ? keys[i - 1] : Key128{});
    EXPECT_EQ(payload, blocks[i]) << i;
  }
  ASSERT_TRUE((*r)->Next(&rec, &payload, &eof).ok());
  EXPECT_TRUE(eof);
}

TEST_F(ExportFile, EveryTruncationRefused) {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<Key128> keys;
  const auto path = WriteFile(3, &blocks, &keys);
  const auto bytes = Slurp(path);
  const auto cut = (dir_ / "cut.kvt").string();
  // Every length short of the whole file (step 7 keeps the test fast; the ends exact).
  for (size_t n = 0; n < bytes.size(); n += (n < 200 || n + 200 > bytes.size()) ? 1 : 7) {
    Spit(cut, std::vector<uint8_t>(bytes.begin(), bytes.begin() + n));
    ASSERT_TRUE(Refused(cut)) << "truncated to " << n << " of " << bytes.size();
  }
  auto longer = bytes;
  longer.push_back(0);
  Spit(cut, longer);
  EXPECT_TRUE(Refused(cut));
}

TEST_F(ExportFile, EveryFlippedByteRefused) {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<Key128> keys;
  const auto path = WriteFile(3, &blocks, &keys);
  const auto bytes = Slurp(path);
  const auto bad = (dir_ / "bad.kvt").string();
  std::mt19937 rng(std::random_device{}());
  for (size_t i = 0; i < bytes.size(); i += (i < 400 ? 1 : 97)) {
    auto copy = bytes;
    copy[i] ^= static_cast<uint8_t>(1u << (rng() % 8));
    Spit(bad, copy);
    ASSERT_TRUE(Refused(bad)) << "flipped byte " << i;
  }
}

TEST_F(ExportFile, OtherVersionRefusedByName) {
  std::vector<std::vector<uint8_t>> blocks;
  std::vector<Key128> keys;
  auto bytes = Slurp(WriteFile(1, &blocks, &keys));
  bytes[4] = 2;  // version 2
  const auto p = (dir_ / "v2.kvt").string();
  Spit(p, bytes);
  auto r = ExportReader::Open(p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(r.status().message().find("version 2"), std::string::npos);
  bytes[0] = 'X';
  Spit(p, bytes);
  EXPECT_NE(ExportReader::Open(p).status().message().find("not a kvtier export file"), std::string::npos);
}

TEST_F(ExportFile, WriterRefusesOversizedPayloadAndLeavesNoPartialFile) {
  const auto path = (dir_ / "y.kvt").string();
  {
    auto w = ExportWriter::Create(path, SmallContract());
    ASSERT_TRUE(w.ok());
    std::vector<uint8_t> big(SmallContract().block_bytes() + 1, 1);
    EXPECT_TRUE((*w)->Add(Key128{1, 1}, Key128{}, big).IsInvalid());
    // Destroyed without Finish(): nothing under the real name, no .tmp left.
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// tests/data/export_v1.kvt was written by export format version 1 (3 blocks of the
// SmallContract: bytes i * 7 + 13 b for blocks 0 and 1, zeros for block 2, chained keys).
// Every later version must read it or refuse it by name.
TEST(ExportFileCompat, ReadsVersion1File) {
  auto r = ExportReader::Open(std::string(KVTIER_TEST_DATA_DIR) + "/export_v1.kvt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->contract(), SmallContract());
  uint64_t n = 0;
  ASSERT_TRUE((*r)->VerifyAll(nullptr, &n).ok());
  ASSERT_EQ(n, 3u);
  RecordHeader rec;
  std::vector<uint8_t> payload;
  bool eof = false;
  Key128 parent{};
  for (int b = 0; b < 3; ++b) {
    ASSERT_TRUE((*r)->Next(&rec, &payload, &eof).ok());
    ASSERT_FALSE(eof);
    const Key128 k{static_cast<uint64_t>(b) + 1, 0x5151ull * (b + 3)};
    EXPECT_EQ(rec.key, k);
    EXPECT_EQ(rec.parent, parent);
    ASSERT_EQ(payload.size(), SmallContract().block_bytes());
    for (size_t i = 0; i < payload.size(); ++i) {
      ASSERT_EQ(payload[i], b == 2 ? 0 : static_cast<uint8_t>(i * 7 + b * 13)) << b << " " << i;
    }
    parent = k;
  }
}

// kvtierctl's other outputs (codec, synth, calibrate, plots) go through WriteFileAtomic: a
// link planted at the old fixed temp name (FILE.tmp) is never followed, and no temp file is
// left behind.
TEST(WriteFileAtomic, DoesNotFollowAPlantedTempLink) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("kvtier-atomic-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string out = (dir / "out.bin").string(), victim = (dir / "victim").string();
  { std::ofstream(victim) << "precious"; }
  ASSERT_EQ(::symlink(victim.c_str(), (out + ".tmp").c_str()), 0);
  const std::string payload = "new bytes";
  ASSERT_TRUE(cli::WriteFileAtomic(out, payload.data(), payload.size()).ok());
  std::ifstream v(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(v), {}), "precious") << "the link's target was written";
  ASSERT_TRUE(fs::is_regular_file(fs::symlink_status(out)));
  std::ifstream o(out);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(o), {}), payload);
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 3u) << "victim, the planted link and the output only";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvtier
