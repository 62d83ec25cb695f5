// The test daemon's environment hooks (test builds only: compiled into the object library
// kvtier_test_env, which kvtierd-test links and kvtierd does not).
//
// At start (a static initializer) this file installs
//   - a test point callback that obeys KVTIER_TEST_KILL_POINT, KVTIER_TEST_KILL_AFTER,
//     KVTIER_TEST_KILL_ONE_IN and KVTIER_TEST_KILL_SEED (testing/test_point.h), and
//     KVTIER_TEST_DELAY_POINT=name=ms[,name=ms...]: the thread that reaches a named point
//     sleeps ms milliseconds there (a race window held open on purpose), and
//   - NvmeStore's default device wrapper, a FaultDevice from KVTIER_TEST_FAULTS
//     (tiers/nvme/fault_device.h).
// Without KVTIER_TEST_POINTS the points compile to nothing and neither is installed.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "tiers/nvme/fault_device.h"
#include "tiers/nvme/nvme_store.h"
#include "testing/test_point.h"

namespace kvtier::tiers {

#if KVTIER_TEST_POINTS
namespace {
// Kill points from the environment (see test_point.h); read once, at the first point hit.
struct EnvKill {
  std::vector<std::string> names;  // empty: no named kill point
  uint64_t after = 1;              // kill at this hit of a named point
  uint64_t one_in = 0;             // 0: no random kill
  std::atomic<uint64_t> hits{0};
  std::mutex rng_mu;
  std::mt19937_64 rng;
  std::vector<std::pair<std::string, uint64_t>> delays;  // KVTIER_TEST_DELAY_POINT: name, ms

  EnvKill() {
    if (const char* v = std::getenv("KVTIER_TEST_DELAY_POINT"); v && *v) {
      const std::string s = v;
      size_t p = 0;
      while (p < s.size()) {
        size_t c = s.find(',', p);
        if (c == std::string::npos) c = s.size();
        const std::string item = s.substr(p, c - p);
        const size_t eq = item.rfind('=');
        if (eq != std::string::npos && eq > 0) {
          delays.emplace_back(item.substr(0, eq), std::strtoull(item.c_str() + eq + 1, nullptr, 10));
        }
        p = c + 1;
      }
    }
    if (const char* v = std::getenv("KVTIER_TEST_KILL_POINT"); v && *v) {
      std::string s = v;
      size_t p = 0;
      while (p <= s.size()) {
        const size_t c = s.find(',', p);
        const std::string n = s.substr(p, c == std::string::npos ? std::string::npos : c - p);
        if (!n.empty()) names.push_back(n);
        if (c == std::string::npos) break;
        p = c + 1;
      }
    }
    if (const char* v = std::getenv("KVTIER_TEST_KILL_AFTER"); v && *v) after = std::strtoull(v, nullptr, 10);
    if (after == 0) after = 1;
    if (const char* v = std::getenv("KVTIER_TEST_KILL_ONE_IN"); v && *v) one_in = std::strtoull(v, nullptr, 10);
    uint64_t seed = static_cast<uint64_t>(::getpid());
    if (const char* v = std::getenv("KVTIER_TEST_KILL_SEED"); v && *v) seed = std::strtoull(v, nullptr, 10);
    rng.seed(seed);
  }

  [[noreturn]] static void Die(std::string_view name) {
    // One line on stderr so the test can tell a kill point from a crash.
    std::fprintf(stderr, "kvtier test point: killed at %.*s\n", static_cast<int>(name.size()), name.data());
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
    ::_exit(137);
  }

  void Hit(std::string_view name) {
    for (const auto& [n, ms] : delays) {
      if (n == name) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    for (const auto& n : names) {
      if (n == "*" || n == name) {
        if (hits.fetch_add(1) + 1 == after) Die(name);
        break;
      }
    }
    if (one_in > 0) {
      bool die;
      {
        std::lock_guard<std::mutex> l(rng_mu);
        die = std::uniform_int_distribution<uint64_t>(0, one_in - 1)(rng) == 0;
      }
      if (die) Die(name);
    }
  }
};

[[maybe_unused]] const bool kInstalled = [] {
  SetTestPointCallback([](std::string_view name) {
    static EnvKill env;
    env.Hit(name);
  });
  NvmeStore::SetDefaultDeviceWrapper(&EnvironmentDeviceWrapper);
  return true;
}();

}  // namespace
#endif  // KVTIER_TEST_POINTS

}  // namespace kvtier::tiers
