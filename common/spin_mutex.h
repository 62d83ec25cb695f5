// SpinThenBlockMutex: a mutex that spins briefly on a held lock before it sleeps.
//
// glibc's default mutex (std::mutex) goes to FUTEX_WAIT at the first failed attempt, and the
// wake-up that follows the holder's unlock costs the waiter 10-30 us on another core. The
// TierManager's index lock is held for well under a microsecond per step (a lookup, two
// entries of a listing page), so a waiter that spins for up to kSpinNs finds it free almost
// always and sleeps only behind a long hold (glibc's PTHREAD_MUTEX_ADAPTIVE_NP makes the
// same trade with a spin count it learns). Measured with `kvtier-bench bystander --no-pin`
// on a 16-core host, a bystander's 1-key lookup while another client lists 30,000
// contracts: p99 29.5 us with std::mutex (one contract copied a hold), 15.6 us with a 4 us
// spin (16 contract pointers a hold), 7.0 us with a 50 us spin, and 2.6 us with a 10 us
// spin and 2 pointers a hold, against 2.2 us idle (bench/README.md, "bystander").
//
// Meets Lockable (lock, try_lock, unlock), so std::lock_guard and std::unique_lock take it;
// a condition variable waiting on it is std::condition_variable_any.
#pragma once

#include <chrono>
#include <mutex>

namespace kvtier {

class SpinThenBlockMutex {
 public:
  static constexpr int64_t kSpinNs = 10000;

  void lock() {
    if (m_.try_lock()) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(kSpinNs);
    do {
      for (int i = 0; i < 4; ++i) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        asm volatile("yield");
#endif
      }
      if (m_.try_lock()) return;
    } while (std::chrono::steady_clock::now() < until);
    m_.lock();
  }
  bool try_lock() { return m_.try_lock(); }
  void unlock() { m_.unlock(); }

 private:
  std::mutex m_;
};

}  // namespace kvtier
