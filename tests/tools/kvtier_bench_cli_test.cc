// kvtier-bench's command line as a user runs it: `kvtier-bench COMMAND --help` prints the
// command's options and exits 0 (the top-level usage promises it), for every suite; bad
// options are refused with exit code 2 and change nothing; the suites that start kvtierd
// run end to end at small sizes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/tools/help_walk.h"
#include "tests/tools/run_tool.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;

using Result = testing_tools::ToolResult;

Result Bench(const std::vector<std::string>& args, const fs::path& dir) {
  return testing_tools::RunTool("kvtier-bench", args, dir);
}

class KvtierBenchCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kvtier_bench_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(KvtierBenchCli, EveryCommandAnswersHelpWithItsOptions) {
  // Each suite and options its usage must name (the ones CheckKnown accepts).
  const std::vector<std::pair<std::string, std::vector<std::string>>> suites = {
      {"bystander",
       {"--seconds", "--rounds", "--pace-us", "--keys", "--loads", "--no-pin", "--bulk-nice", "--results",
        "--no-append"}},
      {"client", {"--blocks", "--iters", "--seconds", "--no-pin", "--results", "--no-append"}},
      {"codec", {"--mib", "--reps", "--results", "--no-append"}},
      {"decode", {"--quick", "--iters", "--formats", "--shapes", "--block-tokens", "--splits", "--sustain-ms",
                  "--json", "--results"}},
      {"ops", {"--blocks", "--reps", "--results", "--no-append"}},
      {"quality", {"--layers", "--tokens", "--seed", "--results", "--no-append"}},
      {"remote", {"--nodes", "--port", "--blocks", "--layers", "--batch", "--reps", "--results", "--no-append"}},
      {"tiers", {"--dir", "--blocks", "--layers", "--qd", "--reps", "--hbm-copy", "--hbm-streams", "--results",
                 "--no-append"}},
  };
  for (const auto& [cmd, opts] : suites) {
    for (const char* h : {"--help", "-h"}) {
      const Result r = Bench({cmd, h}, dir_);
      EXPECT_EQ(r.code, 0) << cmd << " " << h << ": " << r.err;
      EXPECT_EQ(r.out.rfind("usage: kvtier-bench " + cmd + " ", 0), 0u) << r.out;
      for (const std::string& o : opts) EXPECT_NE(r.out.find(o), std::string::npos) << cmd << " lacks " << o;
    }
  }
  // --help after other options still prints the usage and runs nothing.
  const Result r = Bench({"codec", "--mib", "1", "--help"}, dir_);
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage: kvtier-bench codec"), std::string::npos);
  EXPECT_EQ(r.out.find("GB/s"), std::string::npos) << "the benchmark ran";
}

// Every suite the top-level --help lists answers --help and -h (a suite added later too).
TEST_F(KvtierBenchCli, EveryListedCommandAnswersHelp) {
  testing_tools::ExpectEveryCommandAnswersHelp("kvtier-bench", dir_,
                                               {"bystander", "client", "codec", "decode", "ops", "quality", "remote", "tiers"});
}

// The suites that start kvtierd run end to end at small sizes: a change in the daemon's
// defaults (a tier share, a limit) that refuses what a suite does shows here, not first
// when someone runs it for a table. Their targets are timings and are not judged here.
TEST_F(KvtierBenchCli, DaemonSuitesRunEndToEnd) {
  const fs::path results = dir_ / "results.md";
  // A 2,048-block restore from NVMe, blocking and in steps (the bulk thread's path).
  Result r = Bench({"overlap", "--tokens", "32768", "--compute-ms", "1", "--chunk", "64", "--iters", "1",
                    "--results", results.string()},
                   dir_);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  // A bystander's lookups beside the 16,384-block acquire loop, one short round.
  r = Bench({"bystander", "--seconds", "0.2", "--rounds", "1", "--loads", "acquire", "--keys", "4", "--no-pin",
             "--results", results.string()},
            dir_);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  std::ifstream in(results);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("restore of 2048 blocks"), std::string::npos) << text;
  EXPECT_NE(text.find("all rounds: acquire 16,384 keys"), std::string::npos) << text;
}

TEST_F(KvtierBenchCli, BadOptionsAreRefused) {
  const fs::path results = dir_ / "results.md";
  Result r = Bench({"codec", "--mib", "0", "--results", results.string()}, dir_);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--mib"), std::string::npos) << r.err;
  r = Bench({"codec", "--bogus", "1", "--results", results.string()}, dir_);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("bogus"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(results)) << "a refused run wrote results";
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--hbm-copy", "fast"},
                                              std::vector<std::string>{"--hbm-streams", "9"},
                                              std::vector<std::string>{"--hbm-streams", "0"}}) {
    std::vector<std::string> a = {"tiers", "--dir", dir_.string(), "--results", results.string()};
    a.insert(a.end(), bad.begin(), bad.end());
    r = Bench(a, dir_);
    EXPECT_EQ(r.code, 2) << bad[0] << " " << bad[1] << ": " << r.err;
    EXPECT_NE(r.err.find(bad[0]), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(results)) << "a refused run wrote results";
  }
  // The bystander's lookup keys, loads and nice value are checked before any daemon starts.
  for (const std::vector<std::string>& bad : {std::vector<std::string>{"--keys", "0"},
                                              std::vector<std::string>{"--keys", "1025"},
                                              std::vector<std::string>{"--bulk-nice", "-1"},
                                              std::vector<std::string>{"--bulk-nice", "20"},
                                              std::vector<std::string>{"--loads", "acquire,bogus"},
                                              std::vector<std::string>{"--loads", "nops,nops"}}) {
    std::vector<std::string> a = {"bystander", "--results", results.string()};
    a.insert(a.end(), bad.begin(), bad.end());
    r = Bench(a, dir_);
    EXPECT_EQ(r.code, 2) << bad[0] << " " << bad[1] << ": " << r.err;
    EXPECT_NE(r.err.find(bad[0]), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(results)) << "a refused run wrote results";
  }
  r = Bench({"nosuch"}, dir_);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown command"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvtier
