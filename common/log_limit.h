// LogLimit: at most one log line per interval for a message a client or a full tier can
// cause at any rate. The lines held back meanwhile are counted and reported with the next
// line that goes out ("... (N more since the last line)"), so a flood costs one line per
// interval and loses no count.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvtier {

class LogLimit {
 public:
  explicit LogLimit(std::chrono::milliseconds interval = std::chrono::seconds(10)) : interval_ns_(interval.count() * 1000000) {}

  // True when a line may go out now; *held_back is the number of lines held back since the
  // last one. Thread-safe.
  bool Allow(uint64_t* held_back) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    int64_t last = last_ns_.load(std::memory_order_relaxed);
    if (last != kNever && now - last < interval_ns_) {
      held_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (!last_ns_.compare_exchange_strong(last, now, std::memory_order_relaxed)) {
      held_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    *held_back = held_.exchange(0, std::memory_order_relaxed);
    return true;
  }

 private:
  static constexpr int64_t kNever = INT64_MIN;
  const int64_t interval_ns_;
  std::atomic<int64_t> last_ns_{kNever};
  std::atomic<uint64_t> held_{0};
};

// " (N more WHAT held back)" for a line that Allow let out after holding N back; empty for 0.
inline std::string HeldBack(uint64_t n, std::string_view what) {
  if (n == 0) return {};
  return " (" + std::to_string(n) + " more " + std::string(what) + " held back)";
}

}  // namespace kvtier
