// The test hooks live in the test daemon only: the kvtierd that scripts/run.sh builds and
// starts holds no KVTIER_TEST_* name and runs through every kill point alive with them all
// set, while kvtierd-test, under the same workload and environment, dies at the first
// point (so the workload does reach the points: this test can fail).
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "tests/reliability/reliability_util.h"

namespace kvtier::reliability {
namespace {

using testing::DaemonConfig;
using testing::DaemonProcess;

std::string ReadBinary(const std::string& name) {
  std::ifstream in(std::string(KVTIER_BIN_DIR) + "/" + name, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

TEST(TestBuild, ProductionKvtierdHoldsNoTestVariableName) {
  const std::string prod = ReadBinary("kvtierd");
  ASSERT_FALSE(prod.empty()) << "no " << KVTIER_BIN_DIR << "/kvtierd";
  for (const char* name : {"KVTIER_TEST_KILL_POINT", "KVTIER_TEST_KILL_AFTER", "KVTIER_TEST_KILL_ONE_IN",
                           "KVTIER_TEST_KILL_SEED", "KVTIER_TEST_FAULTS", "KVTIER_TEST_"}) {
    EXPECT_EQ(prod.find(name), std::string::npos) << "kvtierd holds " << name;
  }
#if KVTIER_TEST_POINTS
  const std::string test = ReadBinary("kvtierd-test");
  EXPECT_NE(test.find("KVTIER_TEST_KILL_POINT"), std::string::npos) << "kvtierd-test lost its kill points";
  EXPECT_NE(test.find("KVTIER_TEST_FAULTS"), std::string::npos) << "kvtierd-test lost fault injection";
#endif
}

// Stores blocks until `deadline` or until the daemon dies; the 64-slot host tier demotes
// to NVMe all along, through the NvmeStore write points. Returns the blocks committed.
uint64_t StoreUntil(DaemonProcess& d, std::chrono::steady_clock::time_point deadline) {
  Conn c;
  if (c.Open(d.socket(), 3000, "test-build") != KVTIER_OK) return 0;
  uint64_t committed = 0, next = 0;
  while (d.Alive() && std::chrono::steady_clock::now() < deadline) {
    std::vector<kvtier_key> keys;
    for (int i = 0; i < 4; ++i) keys.push_back(MakeKey(3, next++));
    size_t done = 0;
    const kvtier_status s = c.Store(keys, [](const kvtier_key&) {}, &done);
    committed += done;
    if (s == KVTIER_RETRY) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    else if (s != KVTIER_OK && s != KVTIER_REJECTED) break;
  }
  return committed;
}

TEST(TestBuild, ProductionKvtierdIgnoresKillPointsAndFaults) {
  ScopedEnv kill("KVTIER_TEST_KILL_POINT", "*");
  ScopedEnv after("KVTIER_TEST_KILL_AFTER", "1");
  ScopedEnv one_in("KVTIER_TEST_KILL_ONE_IN", "1");
  ScopedEnv faults("KVTIER_TEST_FAULTS", "write_error=1,seed=1");

  DaemonProcess prod{DaemonConfig()};
  ASSERT_TRUE(prod.Start()) << prod.log();
  const uint64_t committed = StoreUntil(prod, std::chrono::steady_clock::now() + std::chrono::seconds(2));
  EXPECT_TRUE(prod.Alive()) << "kvtierd obeyed a KVTIER_TEST_* variable\n" << prod.log();
  EXPECT_GT(committed, 256u) << "too few blocks to pass the host tier and reach NVMe";
  EXPECT_EQ(prod.log().find("killed at"), std::string::npos) << prod.log();
  EXPECT_EQ(prod.log().find("fault inject"), std::string::npos) << prod.log();
  prod.Kill();

#if KVTIER_TEST_POINTS
  DaemonConfig tc;
  tc.binary = "kvtierd-test";
  DaemonProcess test(tc);
  // The test daemon may die at a point during start already (restart verification); either
  // way it must die at one.
  if (test.Start()) (void)StoreUntil(test, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  const auto t0 = std::chrono::steady_clock::now();
  while (test.Alive() && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_FALSE(test.Alive()) << "kvtierd-test ran through its kill points\n" << test.log();
  EXPECT_NE(test.log().find("killed at"), std::string::npos) << test.log();
#endif
}

}  // namespace
}  // namespace kvtier::reliability
