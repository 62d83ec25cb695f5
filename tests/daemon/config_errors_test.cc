// kvtierd refuses bad configs at start: one line on stderr naming the key, exit code 2,
// and nothing started (no socket file, no NVMe folder).
#include <gtest/gtest.h>

#include "tests/daemon/harness.h"

namespace kvtier::testing {
namespace {

std::string Base(const std::string& dir) {
  return "[daemon]\nsocket = \"" + dir + "/s/kvtierd.sock\"\nmetrics_port = 0\n[tiers]\nslot_bytes = \"4KiB\"\n"
         "[tiers.host]\ncapacity = \"256KiB\"\n[tiers.nvme]\ncapacity = \"1MiB\"\ndir = \"" + dir + "/nvme\"\n";
}

void ExpectConfigError(const RunResult& r, const std::string& key, const std::string& also) {
  EXPECT_EQ(r.exit_code, 2) << r.err;
  // Exactly one line, naming the key.
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
  EXPECT_NE(r.err.find(key), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(also), std::string::npos) << r.err;
}

void ExpectNothingStarted(const std::string& dir) {
  EXPECT_FALSE(std::filesystem::exists(dir + "/s/kvtierd.sock"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/nvme"));
}

TEST(ConfigErrors, UnknownKey) {
  TempDir t;
  WriteText(t.path() + "/c.toml", "[daemon]\nsockett = \"x\"\n");
  auto r = RunKvtierd({"--config", t.path() + "/c.toml"}, t.path());
  ExpectConfigError(r, "daemon.sockett", "unknown key");
  ExpectNothingStarted(t.path());
}

TEST(ConfigErrors, BadSize) {
  TempDir t;
  std::string cfg = Base(t.path());
  cfg.replace(cfg.find("\"256KiB\""), 8, "\"4GiX\"");
  WriteText(t.path() + "/c.toml", cfg);
  auto r = RunKvtierd({"--config", t.path() + "/c.toml"}, t.path());
  ExpectConfigError(r, "tiers.host.capacity", "bad size");
  ExpectNothingStarted(t.path());
}

TEST(ConfigErrors, WatermarkOrder) {
  TempDir t;
  WriteText(t.path() + "/c.toml", Base(t.path()));
  auto r = RunKvtierd({"--config", t.path() + "/c.toml", "--set", "tiers.nvme.low_watermark=0.97"},
                      t.path());
  ExpectConfigError(r, "tiers.nvme.low_watermark", "high_watermark");
  ExpectNothingStarted(t.path());
}

TEST(ConfigErrors, UnknownOverrideKey) {
  TempDir t;
  WriteText(t.path() + "/c.toml", Base(t.path()));
  auto r = RunKvtierd({"--config", t.path() + "/c.toml", "--set", "tiers.hots.capacity=1GiB"}, t.path());
  ExpectConfigError(r, "tiers.hots.capacity", "unknown key");
}

TEST(ConfigErrors, MissingFolderPermission) {
  TempDir t;
  const std::string locked = t.path() + "/locked";
  ASSERT_EQ(::mkdir(locked.c_str(), 0555), 0);
  std::string cfg = Base(t.path());
  cfg.replace(cfg.find(t.path() + "/nvme"), t.path().size() + 5, locked + "/nvme");
  WriteText(t.path() + "/c.toml", cfg);
  ::chmod((t.path() + "/c.toml").c_str(), 0644);
  // root ignores permission bits: run the daemon as nobody then, so the check is real.
  const bool root = ::geteuid() == 0;
  auto r = RunKvtierd({"--config", t.path() + "/c.toml"}, t.path(), root);
  if (r.exit_code == 98 || r.exit_code == 99) GTEST_SKIP() << "cannot run kvtierd as nobody here";
  ExpectConfigError(r, "tiers.nvme.dir", "no write permission");
  EXPECT_FALSE(std::filesystem::exists(locked + "/nvme"));
}

TEST(ConfigErrors, SyntaxErrorAndMissingFile) {
  TempDir t;
  WriteText(t.path() + "/c.toml", "[daemon\n");
  auto r = RunKvtierd({"--config", t.path() + "/c.toml"}, t.path());
  ExpectConfigError(r, t.path() + "/c.toml:1", "");
  r = RunKvtierd({"--config", t.path() + "/missing.toml"}, t.path());
  ExpectConfigError(r, "missing.toml", "cannot open");
}

TEST(ConfigErrors, ShippedConfigPassesCheck) {
  TempDir t;
  auto r = RunKvtierd({"--config", std::string(KVTIER_TEST_DATA_DIR) + "/../../config/kvtier.toml",
                       "--check"},
                      t.path());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace kvtier::testing
