// SpinThenBlockMutex: a mutex that spins briefly on a held lock before it sleeps.
//
// glibc's default mutex (std::mutex) goes to FUTEX_WAIT at the first failed attempt, and the
// wake-up that follows the holder's unlock costs the waiter 10-30 us on another core. The
// TierManager's index lock is held for well under a microsecond per step (a lookup, two
// entries of a listing page), so a waiter that spins for up to kSpinNs finds it free almost
// always and sleeps only behind a long hold (glibc's PTHREAD_MUTEX_ADAPTIVE_NP makes the
// same trade with a spin count it learns). It spins only while the holder last took the
// lock on another CPU: with kvtierd pinned to one core a spin would only delay the holder. Measured with `kvtier-bench bystander --no-pin`
// on a 16-core host, a bystander's 1-key lookup while another client lists 30,000
// contracts: p99 29.5 us with std::mutex (one contract copied a hold), 15.6 us with a 4 us
// spin (16 contract pointers a hold), 7.0 us with a 50 us spin, and 2.6 us with a 10 us
// spin and 2 pointers a hold, against 2.2 us idle (bench/README.md, "bystander").
//
// Meets Lockable (lock, try_lock, unlock), so std::lock_guard and std::unique_lock take it;
// a condition variable waiting on it is std::condition_variable_any.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>

namespace kvtier {

class SpinThenBlockMutex {
 public:
  static constexpr int64_t kSpinNs = 10000;

  void lock() {
    if (!m_.try_lock()) Wait();
    holder_cpu_.store(::sched_getcpu(), std::memory_order_relaxed);
  }
  bool try_lock() {
    if (!m_.try_lock()) return false;
    holder_cpu_.store(::sched_getcpu(), std::memory_order_relaxed);
    return true;
  }
  void unlock() { m_.unlock(); }

 private:
  // Spins while the holder runs on another CPU; a holder on this CPU (threads pinned to one
  // core) cannot let go while this thread spins, so the wait sleeps at once.
  void Wait() {
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kSpinNs);
    while (holder_cpu_.load(std::memory_order_relaxed) != ::sched_getcpu()) {
      for (int i = 0; i < 4; ++i) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
      }
      if (m_.try_lock()) return;
      if (std::chrono::steady_clock::now() >= until) break;
    }
    m_.lock();
  }

  std::mutex m_;
  std::atomic<int> holder_cpu_{-1};  // the CPU the holder took the lock on (a hint)
};

}  // namespace kvtier
