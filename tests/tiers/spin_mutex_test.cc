// SpinThenBlockMutex (common/spin_mutex.h): mutual exclusion whether a waiter finds the
// lock within its spin or sleeps for it, and a condition variable waits on it.
#include "common/spin_mutex.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

// Threads increment a plain counter under the lock, each hold short (found while the
// waiters spin) or, every 64th, long past the spin (the waiters sleep): no update is lost
// and no two holders overlap.
TEST(SpinThenBlockMutex, ExcludesSpinnersAndSleepers) {
  SpinThenBlockMutex mu;
  uint64_t counter = 0;
  std::atomic<int> inside{0};
  std::atomic<bool> overlap{false};
  constexpr int kThreads = 4, kIters = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < kIters; ++i) {
        std::lock_guard<SpinThenBlockMutex> l(mu);
        if (inside.fetch_add(1) != 0) overlap = true;
        ++counter;
        if (i % 64 == 0) {
          const auto until = std::chrono::steady_clock::now() +
                             std::chrono::nanoseconds(2 * SpinThenBlockMutex::kSpinNs);
          while (std::chrono::steady_clock::now() < until) {
          }
        }
        inside.fetch_sub(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_FALSE(overlap.load()) << "two threads held the lock at once";
  EXPECT_EQ(counter, uint64_t{kThreads} * kIters);
}

TEST(SpinThenBlockMutex, TryLockFailsWhileHeldAndConditionVariableWaits) {
  SpinThenBlockMutex mu;
  mu.lock();
  std::thread other([&] { EXPECT_FALSE(mu.try_lock()) << "try_lock took a held lock"; });
  other.join();
  mu.unlock();
  EXPECT_TRUE(mu.try_lock());
  mu.unlock();

  std::condition_variable_any cv;
  bool ready = false;
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::lock_guard<SpinThenBlockMutex> l(mu);
    ready = true;
    cv.notify_all();
  });
  std::unique_lock<SpinThenBlockMutex> l(mu);
  EXPECT_TRUE(cv.wait_for(l, std::chrono::seconds(10), [&] { return ready; }));
  l.unlock();
  setter.join();
}

}  // namespace
}  // namespace kvtier
