// BulkRunner (daemon/bulk_runner.h): a big request's steps on a thread of higher nice value,
// each step once; the waiting thread takes over from a starved bulk thread; nice 0 and
// nested runs stay in place; a step's exception reaches the caller.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "daemon/bulk_runner.h"

namespace kvtier::daemon {
namespace {

int Tid() { return static_cast<int>(::syscall(SYS_gettid)); }

std::string ThreadName(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string s;
  std::getline(in, s);
  return s;
}

// Steps 0..n-1, each claimed once; records which thread ran each.
struct Steps {
  explicit Steps(size_t n) : ran_by(n, 0), runs(n, 0) {}
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::vector<int> ran_by;
  std::vector<int> runs;
  std::function<bool()> Fn(std::chrono::microseconds sleep = {}) {
    return [this, sleep] {
      const size_t k = next.fetch_add(1);
      if (k >= ran_by.size()) return false;
      if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
      std::lock_guard<std::mutex> l(mu);
      ran_by[k] = Tid();
      ++runs[k];
      return true;
    };
  }
  std::set<int> Threads() const { return {ran_by.begin(), ran_by.end()}; }
  bool EachOnce() const {
    return std::all_of(runs.begin(), runs.end(), [](int r) { return r == 1; });
  }
};

TEST(BulkRunner, NiceZeroRunsEveryStepInPlace) {
  BulkRunner r(0);
  Steps s(100);
  r.Run(s.Fn());
  EXPECT_TRUE(s.EachOnce());
  EXPECT_EQ(s.Threads(), std::set<int>{Tid()});
  EXPECT_FALSE(r.started());
}

// Every step once, on one thread that is not the caller's, named kvtier-bulk, at the
// caller's nice value plus the runner's (at most 19); the thread serves later runs too.
TEST(BulkRunner, RunsTheStepsOnAThreadOfHigherNice) {
  errno = 0;
  const int own = ::getpriority(PRIO_PROCESS, 0);
  ASSERT_EQ(errno, 0);
  BulkRunner r(10);
  for (int round = 0; round < 3; ++round) {
    Steps s(1000);
    r.Run(s.Fn());
    ASSERT_TRUE(s.EachOnce()) << "round " << round;
    const auto threads = s.Threads();
    if (r.take_overs() == 0) {
      ASSERT_EQ(threads.size(), 1u);
      const int bulk = *threads.begin();
      EXPECT_NE(bulk, Tid());
      EXPECT_EQ(ThreadName(bulk), "kvtier-bulk");
    }
  }
  EXPECT_TRUE(r.started());
  EXPECT_EQ(r.thread_nice(), std::min(own + 10, 19));
  // The caller's own nice value is untouched.
  EXPECT_EQ(::getpriority(PRIO_PROCESS, 0), own);
}

// A bulk thread that gets no CPU (here: its steps sleep, which its CPU clock shows as
// starving) is helped: after kTakeOverAfter the caller runs the steps left beside it,
// each still once.
TEST(BulkRunner, TheCallerTakesOverFromAStarvedBulkThread) {
  BulkRunner r(10);
  Steps s(400);
  r.Run(s.Fn(std::chrono::microseconds(1000)));  // alone: 400 ms
  EXPECT_TRUE(s.EachOnce());
  EXPECT_EQ(r.take_overs(), 1u);
  EXPECT_EQ(s.Threads().size(), 2u);
  // Two threads sleeping 1 ms a step after the first 10 ms: the caller runs about half of
  // the steps; a quarter is a bound that holds however the sleeps stretch under load.
  const auto mine = std::count(s.ran_by.begin(), s.ran_by.end(), Tid());
  EXPECT_GE(mine, 100) << "the caller ran " << mine << " of 400 steps";
}

// A step that reaches Run again (of this runner or another) runs it in place, on the bulk
// thread, instead of waiting for itself.
TEST(BulkRunner, ANestedRunRunsInPlace) {
  BulkRunner outer(10), inner(10);
  Steps in(300);
  int outer_tid = 0;
  bool once = false;
  outer.Run([&] {
    if (once) return false;
    once = true;
    outer_tid = Tid();
    outer.Run(in.Fn());
    inner.Run(in.Fn());
    return true;
  });
  EXPECT_TRUE(in.EachOnce());
  EXPECT_EQ(in.Threads(), std::set<int>{outer_tid});
  EXPECT_FALSE(inner.started());
}

// What a step throws on the bulk thread reaches Run's caller, after every call returned;
// the runner serves the next run.
TEST(BulkRunner, AStepsExceptionReachesTheCaller) {
  BulkRunner r(10);
  std::atomic<int> calls{0};
  EXPECT_THROW(r.Run([&]() -> bool {
    if (calls.fetch_add(1) == 5) throw std::runtime_error("step 5");
    return calls.load() < 10;
  }),
               std::runtime_error);
  Steps s(50);
  r.Run(s.Fn());
  EXPECT_TRUE(s.EachOnce());
}

// Runs from several threads at once take turns; each gets all of its steps.
TEST(BulkRunner, RunsFromSeveralThreadsTakeTurns) {
  BulkRunner r(10);
  std::vector<std::unique_ptr<Steps>> steps;
  for (int i = 0; i < 4; ++i) steps.push_back(std::make_unique<Steps>(500));
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) callers.emplace_back([&, i] { r.Run(steps[i]->Fn()); });
  for (auto& t : callers) t.join();
  for (const auto& s : steps) EXPECT_TRUE(s->EachOnce());
}

}  // namespace
}  // namespace kvtier::daemon
