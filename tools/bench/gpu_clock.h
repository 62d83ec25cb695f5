// GPU clock and power while a benchmark times a kernel, through NVML (the driver's
// management library, loaded with dlopen at run time, so kvtier-bench neither links it nor
// needs its header at build time; without it the sampler reports nothing).
//
// Why: on an H200 a sustained ALU-heavy kernel (the NVFP4 decode) reaches the board's
// power limit and the driver lowers the SM clock (throttle reason "SW power cap"), while
// short bursts run at the full boost clock. A time without the clock it ran at is half a
// number; docs/kernels.md ("Power") has the measurements.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace kvtier::bench {

struct ClockStats {
  int samples = 0;           // 0: NVML unavailable or nothing sampled
  double mean_sm_mhz = 0;    // mean SM clock over the samples
  double min_sm_mhz = 0;
  double max_power_w = 0;    // highest power reading (the driver's own averaging)
  double power_capped = 0;   // fraction of samples with the SW power cap throttle reason
};

class GpuClockSampler {
 public:
  // `pci_bus_id` as cudaDeviceGetPCIBusId gives it (e.g. "0000:19:00.0"). Never fails:
  // Available() says whether NVML and the device were found.
  explicit GpuClockSampler(const std::string& pci_bus_id);
  ~GpuClockSampler();
  GpuClockSampler(const GpuClockSampler&) = delete;
  GpuClockSampler& operator=(const GpuClockSampler&) = delete;

  bool Available() const { return dev_ != nullptr; }
  // Samples every `period_us` on a background thread until Stop().
  void Start(int period_us = 2000);
  ClockStats Stop();
  // "1980 MHz", "1612 MHz, power cap 85%", or "n/a" (no NVML / no samples).
  static std::string Describe(const ClockStats& s);

 private:
  struct Api;
  std::unique_ptr<Api> api_;
  void* dev_ = nullptr;
  std::thread th_;
  std::atomic<bool> run_{false};
  std::vector<uint32_t> mhz_, mw_;
  std::vector<uint64_t> reasons_;
};

}  // namespace kvtier::bench
