// BulkRunner: runs the steps of a session's big requests on a thread of lower CPU priority.
//
// An acquire or a release of thousands of keys is milliseconds of CPU (about 1.5 us a
// block, acquire and release). Taking turns at the index lock (one hold per step of
// Session::kAcquireLockChunk keys) is not enough where the machine has fewer cores than
// busy threads: the thread running the big request takes a core from a bystander's ring
// thread or from the bystander's own client, and on a 2-core host a 16-key lookup that ran
// in 1.3 us waits 10 us and more behind it (bench/README.md, "bystander"). A thread of
// higher nice value gets the core only when others leave it, so small requests go first,
// and an idle machine runs the big one at full speed.
//
// Linux lets an unprivileged thread raise its nice value but not lower it again, so the
// request's own thread cannot lower itself for one request: each session that makes a big
// request gets one thread of its own at `daemon.bulk_nice` above the daemon's nice value
// (started at its first big request, joined when the session goes). Run() hands the steps
// (those past the first Session::kInlineSteps, which the request's thread runs itself) to
// it and waits, so the session's requests still complete in order and the waiting
// thread gives its core away.
//
// No starving: where every core is busy with work of normal priority, a thread at nice 10
// gets a few percent of one, and a big request would take seconds. The waiting thread
// watches the bulk thread's CPU clock: past kTakeOverAfter with less than kMinShare of a
// core, it runs the remaining steps itself at the daemon's priority (the steps are claimed
// one at a time, so the two threads never run the same one). A big request is then at most
// about kTakeOverAfter slower than at full priority.
//
// Priority inversion: while the bulk thread holds the index lock for a step (about 20 us),
// a thread waiting for that lock sleeps after a short spin (common/spin_mutex.h), which
// frees its core for the holder; a holder starved longer is what the take-over ends.
#pragma once

#include <time.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace kvtier::daemon {

class BulkRunner {
 public:
  // The waiting thread takes over the steps left when, this long after the hand-over, the
  // bulk thread has run for less than kMinShare of it.
  static constexpr std::chrono::milliseconds kTakeOverAfter{10};
  static constexpr double kMinShare = 0.125;

  // `nice`: how far above the daemon's own nice value the thread runs, [0, 19] (a nice
  // value past 19 is 19). 0: no thread; Run() runs the steps in place.
  explicit BulkRunner(int nice);
  ~BulkRunner();  // stops and joins the thread (detaches it when called from it)
  BulkRunner(const BulkRunner&) = delete;
  BulkRunner& operator=(const BulkRunner&) = delete;

  // Calls `step` until it returns false, on the bulk thread, and returns after the last
  // call returned (throwing what a step threw, once every call has returned). `step` must
  // claim its work atomically: the calling thread calls it too once it takes over. In
  // place when the runner has no thread (nice 0), when called from a bulk thread, or when
  // the thread could not be started (logged once).
  // Returns true when the calling thread took over.
  bool Run(const std::function<bool()>& step);

  int nice() const { return nice_; }
  // True once the thread runs (after a first Run()); for tests.
  bool started() const;
  // The bulk thread's nice value as the kernel reports it (-100 with no thread); for tests.
  int thread_nice() const;
  // Runs in which the calling thread took over; for tests.
  uint64_t take_overs() const;

 private:
  // What the thread shares with the runner: the thread keeps it alive, so a runner
  // destroyed on the bulk thread itself (the last owner of its session let go in a
  // callback there) leaves the thread nothing freed to touch.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    const std::function<bool()>* step = nullptr;  // set by Run, cleared by the thread when done
    std::exception_ptr failed;                    // what a step threw on the thread
    bool stop = false;
    int tid = 0;  // the thread's kernel id, once it runs
  };
  static void Loop(std::shared_ptr<State> st, int nice);
  bool Start();          // under run_mu_
  int64_t ThreadCpuNs() const;  // the bulk thread's CPU time (0 when unknown)

  const int nice_;
  mutable std::mutex run_mu_;  // one Run at a time
  std::shared_ptr<State> st_;
  std::thread thread_;
  clockid_t cpu_clock_{};
  bool has_cpu_clock_ = false;
  bool start_failed_ = false;
  uint64_t take_overs_ = 0;  // under run_mu_
};

}  // namespace kvtier::daemon
