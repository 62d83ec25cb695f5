#include "daemon/bulk_runner.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include <spdlog/spdlog.h>

#include "common/log_limit.h"

namespace kvtier::daemon {

namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting Run looks at the bulk thread's CPU clock.
constexpr std::chrono::milliseconds kCheckEvery{2};

int ThreadId() { return static_cast<int>(::syscall(SYS_gettid)); }

thread_local bool t_on_bulk_thread = false;  // this thread is some runner's bulk thread

// The nice value of thread `tid` (0: the caller), or `fallback` when the kernel says no.
int NiceOf(int tid, int fallback) {
  errno = 0;
  const int n = ::getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  return errno == 0 ? n : fallback;
}

bool RunAll(const std::function<bool()>& step) {
  while (step()) {
  }
  return false;  // nothing taken over
}

}  // namespace

BulkRunner::BulkRunner(int nice) : nice_(std::clamp(nice, 0, 19)) {}

BulkRunner::~BulkRunner() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(st_->mu);
    st_->stop = true;
  }
  st_->cv.notify_all();
  if (thread_.get_id() == std::this_thread::get_id()) {
    thread_.detach();  // Loop returns after the steps on its stack; it holds st_ itself
  } else {
    thread_.join();
  }
}

bool BulkRunner::started() const {
  std::lock_guard<std::mutex> run(run_mu_);
  return thread_.joinable();
}

int BulkRunner::thread_nice() const {
  std::lock_guard<std::mutex> run(run_mu_);
  if (!st_) return -100;
  std::lock_guard<std::mutex> l(st_->mu);
  return st_->tid == 0 ? -100 : NiceOf(st_->tid, -100);
}

uint64_t BulkRunner::take_overs() const {
  std::lock_guard<std::mutex> run(run_mu_);
  return take_overs_;
}

int64_t BulkRunner::ThreadCpuNs() const {
  timespec ts{};
  if (!has_cpu_clock_ || ::clock_gettime(cpu_clock_, &ts) != 0) return 0;
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

bool BulkRunner::Start() {
  if (thread_.joinable()) return true;
  if (start_failed_) return false;
  st_ = std::make_shared<State>();
  try {
    thread_ = std::thread(Loop, st_, nice_);
  } catch (const std::system_error& e) {
    start_failed_ = true;
    static LogLimit log;
    uint64_t held = 0;
    if (log.Allow(&held)) {
      spdlog::warn("cannot start a thread for big requests ({}); they run on the request's thread at its "
                   "priority ({} more such lines held back)",
                   e.what(), held);
    }
    return false;
  }
  has_cpu_clock_ = ::pthread_getcpuclockid(thread_.native_handle(), &cpu_clock_) == 0;
  std::unique_lock<std::mutex> l(st_->mu);
  st_->cv.wait(l, [this] { return st_->tid != 0; });
  return true;
}

bool BulkRunner::Run(const std::function<bool()>& step) {
  // Already on a bulk thread (a step reached Run again): in place, at that priority.
  if (nice_ == 0 || t_on_bulk_thread) return RunAll(step);
  std::lock_guard<std::mutex> run(run_mu_);
  if (!Start()) return RunAll(step);
  const auto t0 = Clock::now();
  const int64_t cpu0 = ThreadCpuNs();
  std::unique_lock<std::mutex> l(st_->mu);
  st_->step = &step;
  st_->cv.notify_all();
  std::exception_ptr mine;  // what a step threw here, after a take-over
  bool took_over = false;
  while (st_->step != nullptr) {
    if (took_over || !has_cpu_clock_) {
      st_->cv.wait(l, [this] { return st_->step == nullptr; });
      break;
    }
    if (st_->cv.wait_for(l, kCheckEvery, [this] { return st_->step == nullptr; })) break;
    const auto wall = Clock::now() - t0;
    if (wall < kTakeOverAfter) continue;
    const double share = static_cast<double>(ThreadCpuNs() - cpu0) /
                         static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(wall).count());
    if (share >= kMinShare) continue;
    // Starved: the steps left run here, at this thread's priority, beside the bulk
    // thread's step in progress (each step is claimed once).
    took_over = true;
    ++take_overs_;
    l.unlock();
    try {
      RunAll(step);
    } catch (...) {
      mine = std::current_exception();  // thrown again once the bulk thread let go of `step`
    }
    l.lock();
  }
  std::exception_ptr failed = std::exchange(st_->failed, nullptr);
  l.unlock();
  if (mine) std::rethrow_exception(mine);
  if (failed) std::rethrow_exception(failed);  // as the step would have thrown in place
  return took_over;
}

void BulkRunner::Loop(std::shared_ptr<State> st, int nice) {
  ::pthread_setname_np(::pthread_self(), "kvtier-bulk");
  t_on_bulk_thread = true;
  const int tid = ThreadId();
  // A new thread has its creator's nice value: the daemon's, or what its service set.
  const int base = NiceOf(0, 0);
  const int want = std::min(base + nice, 19);
  if (::setpriority(PRIO_PROCESS, static_cast<id_t>(tid), want) != 0) {
    static LogLimit log;
    uint64_t held = 0;
    if (log.Allow(&held)) {
      spdlog::warn("cannot set the nice value of the thread for big requests to {} ({}); they run at nice {} "
                   "({} more such lines held back)",
                   want, std::strerror(errno), base, held);
    }
  }
  std::unique_lock<std::mutex> l(st->mu);
  st->tid = tid;
  st->cv.notify_all();
  while (true) {
    st->cv.wait(l, [&] { return st->stop || st->step != nullptr; });
    if (st->step == nullptr) return;  // stopped, nothing handed over
    const std::function<bool()>* step = st->step;
    l.unlock();
    std::exception_ptr failed;
    try {
      RunAll(*step);
    } catch (...) {
      failed = std::current_exception();
    }
    l.lock();
    st->failed = failed;
    st->step = nullptr;
    st->cv.notify_all();
  }
}

}  // namespace kvtier::daemon
