// Test-only sync/kill points (RocksDB's TEST_SYNC_POINT, reduced to what kvtier needs).
//
// KVTIER_TEST_POINT("name") calls the callback a test installed with SetTestPointCallback,
// if any; crash tests use it to _exit() a child process at an exact point of the commit
// protocol (e.g. after the payload is durable but before the index entry is written).
// Without KVTIER_TEST_POINTS (release packages) the macro compiles to nothing.
//
// Kill points from the environment (for crash tests that run a real daemon): the test
// daemon kvtierd-test links tiers/test_point_env.cc, which installs a callback at start
// by which a process whose environment has
//   KVTIER_TEST_KILL_POINT=name[,name...]  kills itself (SIGKILL) at the Nth hit of any of
//                                          these points, N = KVTIER_TEST_KILL_AFTER (default 1);
//                                          "*" matches every point;
//   KVTIER_TEST_KILL_ONE_IN=K              kills itself at each point hit with probability
//                                          1/K (RocksDB's kill_random_test), seeded by
//                                          KVTIER_TEST_KILL_SEED (default: the pid).
// The variables are read once, at the first point hit. The production kvtierd links no
// such callback and reads none of them; in a build without KVTIER_TEST_POINTS no point is
// ever reached.
#pragma once

#include <functional>
#include <string_view>

namespace kvtier {

using TestPointCallback = std::function<void(std::string_view name)>;
// Installs (or, with an empty function, removes) the process-wide callback.
void SetTestPointCallback(TestPointCallback cb);
void RunTestPoint(std::string_view name);

}  // namespace kvtier

#if KVTIER_TEST_POINTS
#define KVTIER_TEST_POINT(name) ::kvtier::RunTestPoint(name)
#else
#define KVTIER_TEST_POINT(name) \
  do {                          \
  } while (0)
#endif
