// kvtier.hpp as C++17 and as C++20 (tests/client/cpp_scenario.cc, compiled once per
// standard), against a real kvtierd.
#include <gtest/gtest.h>

#include <string>

#include "tests/daemon/harness.h"

namespace kvtier::testing {
std::string CppScenario17(const char* socket);
std::string CppScenario20(const char* socket);
namespace {

TEST(ClientCpp, HeaderWorksAsCpp17AndCpp20) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  EXPECT_EQ(CppScenario17(d.socket().c_str()), "");
  EXPECT_EQ(CppScenario20(d.socket().c_str()), "");
  EXPECT_EQ(d.Stop(), 0) << d.log();
}

}  // namespace
}  // namespace kvtier::testing
