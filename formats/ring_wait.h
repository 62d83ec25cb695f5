// Waiting on and waking the peer of a ring (formats/wire.h, "Wake-up"), written once for
// both ends: the daemon's ring thread waits for requests, a client waits for completions.
//
// The futex word is a ring's `tail` inside a MAP_SHARED memfd mapping that another
// process maps too, so the futex operations are the shared (not PRIVATE) ones.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <ctime>

#include "formats/wire.h"

namespace kvtier::wire {

inline void FutexWait(uint32_t* addr, uint32_t expected, long timeout_ns) {
  timespec ts{timeout_ns / 1000000000L, timeout_ns % 1000000000L};
  ::syscall(SYS_futex, addr, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
inline void FutexWake(uint32_t* addr) {
  ::syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

// Producer side, after a TryPush: wakes the consumer when it said it sleeps.
template <typename Entry>
inline void WakeConsumer(RingView<Entry>& ring) {
  if (ring.ConsumerSleeping()) FutexWake(ring.tail_word());
}

// One poll of a consumer's bounded spin on `mine` while `peer` is the ring its peer
// consumes. Every 64 polls it republishes its CPU and yields only when the peer last ran
// on this same CPU (the peer cannot answer while we spin there); otherwise it never
// yields: under CFS a yield hands the CPU to any runnable task (another process's build)
// for a whole time slice, which put multi-millisecond stalls into the p99.
template <typename Mine, typename Peer>
inline void SpinOnce(RingView<Mine>& mine, const RingView<Peer>& peer, uint32_t* spins) {
  CpuRelax();
  if ((++*spins & 63) == 0) {
    const int cpu = ::sched_getcpu();
    mine.SetConsumerCpu(cpu);
    if (cpu >= 0 && cpu == peer.ConsumerCpu()) ::sched_yield();
  }
}

// Consumer side, after the spin: the sleep protocol (flag, re-check, futex-wait on the
// tail word for at most timeout_ns). Returns early when an entry arrives; spurious
// returns are allowed (the caller re-checks the ring). `cancelled()` is asked after the
// flag is set, so a stop published before the wake-up is not slept through.
template <typename Entry, typename Cancelled>
inline void SleepUntilPushed(RingView<Entry>& ring, long timeout_ns, Cancelled cancelled) {
  ring.SetSleeping(true);
  const uint32_t tail = ring.LoadTail();
  uint32_t n = 0;
  if (ring.Available(&n) && n == 0 && !cancelled()) FutexWait(ring.tail_word(), tail, timeout_ns);
  ring.SetSleeping(false);
}
template <typename Entry>
inline void SleepUntilPushed(RingView<Entry>& ring, long timeout_ns) {
  SleepUntilPushed(ring, timeout_ns, [] { return false; });
}

}  // namespace kvtier::wire
