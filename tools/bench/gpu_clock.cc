#include "tools/bench/gpu_clock.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace kvtier::bench {

// The few NVML entry points used here (stable C ABI since NVML 5; the functions return 0
// on success). NVML_CLOCK_SM = 1; the SW power cap throttle reason is bit 0x4.
struct GpuClockSampler::Api {
  void* lib = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*by_pci)(const char*, void**) = nullptr;
  int (*clock)(void*, int, unsigned*) = nullptr;
  int (*power)(void*, unsigned*) = nullptr;
  int (*reasons)(void*, unsigned long long*) = nullptr;
  bool inited = false;
};

namespace {
constexpr int kNvmlClockSm = 1;
constexpr uint64_t kSwPowerCap = 0x4;
template <class F>
void Sym(void* lib, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
}
}  // namespace

GpuClockSampler::GpuClockSampler(const std::string& pci_bus_id) : api_(std::make_unique<Api>()) {
  Api& a = *api_;
  a.lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (a.lib == nullptr) return;
  Sym(a.lib, "nvmlInit_v2", &a.init);
  Sym(a.lib, "nvmlShutdown", &a.shutdown);
  Sym(a.lib, "nvmlDeviceGetHandleByPciBusId_v2", &a.by_pci);
  Sym(a.lib, "nvmlDeviceGetClockInfo", &a.clock);
  Sym(a.lib, "nvmlDeviceGetPowerUsage", &a.power);
  Sym(a.lib, "nvmlDeviceGetCurrentClocksEventReasons", &a.reasons);
  if (a.reasons == nullptr) Sym(a.lib, "nvmlDeviceGetCurrentClocksThrottleReasons", &a.reasons);
  if (!a.init || !a.shutdown || !a.by_pci || !a.clock || a.init() != 0) return;
  a.inited = true;
  void* dev = nullptr;
  if (a.by_pci(pci_bus_id.c_str(), &dev) == 0) dev_ = dev;
}

GpuClockSampler::~GpuClockSampler() {
  if (run_) Stop();
  if (api_->inited) api_->shutdown();
  if (api_->lib != nullptr) dlclose(api_->lib);
}

void GpuClockSampler::Start(int period_us) {
  if (!Available() || run_) return;
  mhz_.clear();
  mw_.clear();
  reasons_.clear();
  run_ = true;
  th_ = std::thread([this, period_us] {
    const Api& a = *api_;
    while (run_.load(std::memory_order_relaxed)) {
      unsigned mhz = 0, mw = 0;
      unsigned long long rs = 0;
      if (a.clock(dev_, kNvmlClockSm, &mhz) == 0) {
        mhz_.push_back(mhz);
        mw_.push_back(a.power != nullptr && a.power(dev_, &mw) == 0 ? mw : 0);
        reasons_.push_back(a.reasons != nullptr && a.reasons(dev_, &rs) == 0 ? rs : 0);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(period_us));
    }
  });
}

ClockStats GpuClockSampler::Stop() {
  ClockStats s;
  if (!run_) return s;
  run_ = false;
  th_.join();
  s.samples = static_cast<int>(mhz_.size());
  if (s.samples == 0) return s;
  double sum = 0;
  int capped = 0;
  s.min_sm_mhz = 1e9;
  for (size_t i = 0; i < mhz_.size(); ++i) {
    sum += mhz_[i];
    s.min_sm_mhz = std::min<double>(s.min_sm_mhz, mhz_[i]);
    s.max_power_w = std::max<double>(s.max_power_w, mw_[i] / 1000.0);
    if (reasons_[i] & kSwPowerCap) ++capped;
  }
  s.mean_sm_mhz = sum / s.samples;
  s.power_capped = static_cast<double>(capped) / s.samples;
  return s;
}

std::string GpuClockSampler::Describe(const ClockStats& s) {
  if (s.samples == 0) return "n/a";
  char buf[64];
  if (s.power_capped > 0) {
    std::snprintf(buf, sizeof buf, "%.0f MHz, power cap %.0f%%", s.mean_sm_mhz, 100 * s.power_capped);
  } else {
    std::snprintf(buf, sizeof buf, "%.0f MHz", s.mean_sm_mhz);
  }
  return buf;
}

}  // namespace kvtier::bench
