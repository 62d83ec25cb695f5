// kvtierctl codec / keys as a user runs them: the real binary in a child process.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "formats/contract.h"
#include "formats/keys.h"
#include "formats/nvfp4.h"
#include "tests/tools/help_walk.h"
#include "tests/tools/run_tool.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

using Result = testing_tools::ToolResult;

// Runs build/bin/kvtierctl with args.
Result Ctl(const std::vector<std::string>& args, const fs::path& dir) {
  return testing_tools::RunTool("kvtierctl", args, dir);
}

class KvtierctlCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("kvtierctl_cli_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path Write(const std::string& name, const void* p, size_t n) {
    const fs::path f = dir_ / name;
    std::ofstream(f, std::ios::binary).write(static_cast<const char*>(p), n);
    return f;
  }
  std::vector<uint8_t> Read(const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  // One line on stderr, non-zero exit, and no output file (nor its .tmp) left behind.
  void ExpectCleanFailure(const Result& r, const fs::path& out) {
    EXPECT_NE(r.code, 0);
    EXPECT_FALSE(r.err.empty());
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_FALSE(fs::exists(out)) << out;
    EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  }
  fs::path dir_;
};

std::vector<float> Random(size_t n) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = d(rng);
  return x;
}

TEST_F(KvtierctlCli, EncodeDecodeRoundtripMatchLibrary) {
  const auto x = Random(1024);
  const auto in = Write("in.f32", x.data(), x.size() * 4);
  for (const char* rule : {"max6", "4over6"}) {
    const auto bin = dir_ / "out.bin";
    Result r = Ctl({"codec", "encode", "--rule", rule, "--kv-scale", "0.25", "--in", in, "--out", bin}, dir_);
    ASSERT_EQ(r.code, 0) << r.err;
    std::vector<uint8_t> data(512), scales(64);
    const auto rl = std::string(rule) == "max6" ? nvfp4::ScaleRule::kMax6 : nvfp4::ScaleRule::k4over6;
    ASSERT_TRUE(nvfp4::Quantize(x, 0.25f, rl, data, scales).ok());
    std::vector<uint8_t> expect = data;
    expect.insert(expect.end(), scales.begin(), scales.end());
    EXPECT_EQ(Read(bin), expect);

    const auto dec = dir_ / "dec.f32";
    r = Ctl({"codec", "decode", "--kv-scale", "0.25", "--in", bin, "--out", dec}, dir_);
    ASSERT_EQ(r.code, 0) << r.err;
    std::vector<float> y(1024);
    ASSERT_TRUE(nvfp4::Dequantize(data, scales, 0.25f, y).ok());
    const auto got = Read(dec);
    ASSERT_EQ(got.size(), 4096u);
    EXPECT_EQ(std::memcmp(got.data(), y.data(), 4096), 0);

    const auto rt = dir_ / "rt.f32";
    r = Ctl({"codec", "roundtrip", "--rule", rule, "--kv-scale", "0.25", "--in", in, "--out", rt}, dir_);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(Read(rt), got);
  }
}

TEST_F(KvtierctlCli, BadCodecInputFailsCleanly) {
  const auto out = dir_ / "o.bin";
  std::vector<float> twenty(20, 1.0f);
  const auto odd = Write("odd.f32", twenty.data(), 80);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "1", "--in", odd, "--out", out}, dir_), out);
  std::vector<float> nan(16, 1.0f);
  nan[9] = std::numeric_limits<float>::quiet_NaN();
  const auto nanf = Write("nan.f32", nan.data(), 64);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "1", "--in", nanf, "--out", out}, dir_), out);
  nan[9] = std::numeric_limits<float>::infinity();
  const auto inff = Write("inf.f32", nan.data(), 64);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "1", "--in", inff, "--out", out}, dir_), out);
  const auto empty = Write("empty.f32", nullptr, 0);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "1", "--in", empty, "--out", out}, dir_), out);
  const auto good = Write("good.f32", twenty.data(), 64);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "1", "--in", dir_ / "missing", "--out", out}, dir_), out);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "nan", "--in", good, "--out", out}, dir_), out);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "-2", "--in", good, "--out", out}, dir_), out);
  ExpectCleanFailure(Ctl({"codec", "encode", "--rule", "max5", "--kv-scale", "1", "--in", good, "--out", out}, dir_), out);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "1", "--in", good}, dir_), out);
  ExpectCleanFailure(Ctl({"codec", "encode", "--kv-scale", "1", "--in", good, "--out", out, "--bogus", "1"}, dir_), out);
  ExpectCleanFailure(Ctl({"codec", "decode", "--kv-scale", "1", "--in", good, "--out", out}, dir_), out);
  ExpectCleanFailure(Ctl({"codec", "transmogrify", "--in", good, "--out", out}, dir_), out);
}

TEST_F(KvtierctlCli, KeysMatchLibraryAndGolden) {
  std::vector<uint32_t> tokens(70);
  for (uint32_t i = 0; i < 70; ++i) tokens[i] = i * 7919u + 3;
  const auto in = Write("t.u32", tokens.data(), tokens.size() * 4);
  Result r = Ctl({"keys", "--contract", "1046e2d6e69eae7a", "--block-tokens", "16", "--in", in}, dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  std::string expect;
  for (const auto& k : KeyChain(0x1046e2d6e69eae7aull, tokens, 16)) expect += k.ToHex() + "\n";
  EXPECT_EQ(r.out, expect);
  // The golden file holds the same chain (tests/data/golden_identity.txt, key_0).
  std::ifstream g(std::string(KVTIER_TEST_DATA_DIR) + "/golden_identity.txt");
  std::string name, value;
  while (g >> name >> value) {
    if (name == "key_0") {
      EXPECT_EQ(r.out.substr(0, 32), value);
    }
  }
}

TEST_F(KvtierctlCli, BadKeysInputFailsCleanly) {
  uint8_t three[3] = {1, 2, 3};
  const auto bad = Write("bad.u32", three, 3);
  std::vector<uint32_t> t(32, 5);
  const auto good = Write("good.u32", t.data(), 128);
  const fs::path none = dir_ / "none";
  ExpectCleanFailure(Ctl({"keys", "--contract", "1046e2d6e69eae7a", "--block-tokens", "16", "--in", bad}, dir_), none);
  ExpectCleanFailure(Ctl({"keys", "--contract", "1046e2d6e69eae7a", "--block-tokens", "0", "--in", good}, dir_), none);
  ExpectCleanFailure(Ctl({"keys", "--contract", "xyz", "--block-tokens", "16", "--in", good}, dir_), none);
  ExpectCleanFailure(Ctl({"keys", "--contract", "1046e2d6e69eae7a", "--block-tokens", "16", "--in", dir_ / "missing"}, dir_), none);
  ExpectCleanFailure(Ctl({"keys", "--block-tokens", "16", "--in", good}, dir_), none);
}

// kvtierctl links what its commands use: libkvtier, the quality and replay tools, the
// config parser and the eviction policies; not the storage engine's libraries.
TEST_F(KvtierctlCli, LinksNoStorageEngineLibrary) {
  std::ifstream in(std::string(KVTIER_BIN_DIR) + "/kvtierctl", std::ios::binary);
  const std::string bin((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bin.size(), 0u);
  EXPECT_NE(bin.find("libkvtier.so"), std::string::npos) << "the NEEDED list is not where this test looks";
  for (const char* lib : {"librocksdb", "liburing", "libhiredis", "libspdlog"}) {
    EXPECT_EQ(bin.find(lib), std::string::npos) << "kvtierctl links " << lib;
  }
}

// Every command and subcommand the top-level --help lists answers --help and -h.
TEST_F(KvtierctlCli, EveryCommandAndSubcommandAnswersHelp) {
  testing_tools::ExpectEveryCommandAnswersHelp(
      "kvtierctl", dir_,
      {"analyze", "bench", "bench replay", "bench policies", "codec", "codec encode", "config", "config check",
       "config reload", "contract id", "keys", "stats", "tiers"});
  // A subcommand's options after --help (the value-taking --trace included) change nothing.
  const Result r = Ctl({"bench", "replay", "--help", "--trace"}, dir_);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("bench replay"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace kvtier
