#include "tiers/hbm/hbm_pool.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "tiers/hbm/gather.h"
#endif

namespace kvtier::tiers {

Status HbmPoolOptions::Validate() const {
  if (slot_bytes == 0 || slot_bytes % 4096) {
    return Status::Invalid("hbm pool: slot_bytes " + std::to_string(slot_bytes) +
                           " is not a positive multiple of 4096");
  }
  if (slots == 0) return Status::Invalid("hbm pool: zero slots");
  if (device < 0) return Status::Invalid("hbm pool: negative device ordinal");
  return Status::Ok();
}

std::optional<uint32_t> HbmPool::Alloc() {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.Alloc();
}
Status HbmPool::Free(uint32_t slot) {
  std::lock_guard<std::mutex> l(mu_);
  if (!alloc_.Free(slot)) return Status::Invalid("hbm pool: slot " + std::to_string(slot) + " is not allocated");
  return Status::Ok();
}
uint32_t HbmPool::used() const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.used();
}
uint32_t HbmPool::free_count() const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.free_count();
}

std::vector<HbmPool::CopyRun> HbmPool::CoalesceCopies(std::vector<CopyItem> items, uint64_t slot_bytes) {
  std::sort(items.begin(), items.end(), [](const CopyItem& a, const CopyItem& b) { return a.slot < b.slot; });
  std::vector<CopyRun> runs;
  for (size_t i = 0; i < items.size();) {
    CopyRun r{items[i].slot, items[i].host, items[i].bytes};
    size_t j = i;
    while (j + 1 < items.size() && items[j].bytes == slot_bytes && items[j + 1].slot == items[j].slot + 1 &&
           static_cast<uint8_t*>(items[j + 1].host) == static_cast<uint8_t*>(items[j].host) + slot_bytes) {
      ++j;
      r.bytes += items[j].bytes;
    }
    runs.push_back(r);
    i = j + 1;
  }
  return runs;
}

#if KVTIER_HAVE_CUDA

namespace {
Status CudaErr(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  return Status::IoError(std::string(what) + ": " + cudaGetErrorString(e));
}
struct HostFnCtx {
  HbmPool::CopyDone done;
};
void CUDART_CB RunDone(void* p) {
  auto* c = static_cast<HostFnCtx*>(p);
  c->done(Status::Ok());
  delete c;
}
}  // namespace

StatusOr<std::unique_ptr<HbmPool>> HbmPool::Create(const HbmPoolOptions& opts) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return Status::Unsupported("hbm pool: no CUDA device");
  }
  if (opts.device >= n) {
    return Status::Invalid("hbm pool: device " + std::to_string(opts.device) + " of " + std::to_string(n));
  }
  std::unique_ptr<HbmPool> p(new HbmPool());
  p->opts_ = opts;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaSetDevice(opts.device), "cudaSetDevice"));
  void* m = nullptr;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMalloc(&m, p->arena_bytes()), "cudaMalloc HBM arena"));
  p->base_ = static_cast<uint8_t*>(m);
  cudaStream_t a, b;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream"));
  p->h2d_ = a;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream"));
  p->d2h_ = b;
  p->alloc_.Reset(opts.slots);
  // KVTIER_HBM_COPY (hbm_pool.h): auto (default), or one method forced for a benchmark.
  const char* env = std::getenv("KVTIER_HBM_COPY");
  const std::string mode = env != nullptr ? env : "auto";
  int host_ptr_ok = 0;
  cudaDeviceGetAttribute(&host_ptr_ok, cudaDevAttrCanUseHostPointerForRegisteredMem, opts.device);
  cudaGetLastError();
  if (mode != "auto" && mode != "kernel" && mode != "batch" && mode != "loop") {
    return Status::Invalid("KVTIER_HBM_COPY=" + mode + ": must be auto, kernel, batch or loop");
  }
  p->gather_kernel_.store((mode == "auto" || mode == "kernel") && host_ptr_ok == 1);
  p->gather_always_.store(mode == "kernel");
  p->batch_api_.store(mode != "loop");
  p->loop_only_.store(mode == "loop");
  p->batch_always_.store(mode == "batch");
  return p;
}

HbmPool::~HbmPool() {
  cudaSetDevice(opts_.device);
  if (h2d_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(h2d_));
    cudaStreamDestroy(static_cast<cudaStream_t>(h2d_));
  }
  if (d2h_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(d2h_));
    cudaStreamDestroy(static_cast<cudaStream_t>(d2h_));
  }
  if (base_) cudaFree(base_);
}

Status HbmPool::IpcHandle(uint8_t out[64]) const {
  static_assert(sizeof(cudaIpcMemHandle_t) == 64, "CUDA IPC handle is 64 bytes");
  cudaIpcMemHandle_t h;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaSetDevice(opts_.device), "cudaSetDevice"));
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaIpcGetMemHandle(&h, base_), "cudaIpcGetMemHandle"));
  std::memcpy(out, &h, 64);
  return Status::Ok();
}

Status HbmPool::CopyToDevice(uint32_t slot, const void* src, uint64_t bytes, CopyDone done) {
  if (slot >= opts_.slots || bytes > opts_.slot_bytes) return Status::Invalid("hbm copy: slot or size out of range");
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(h2d_);
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMemcpyAsync(slot_ptr(slot), src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync H2D"));
  auto* c = new HostFnCtx{std::move(done)};
  cudaError_t e = cudaLaunchHostFunc(s, RunDone, c);
  if (e != cudaSuccess) {
    delete c;
    return CudaErr(e, "cudaLaunchHostFunc");
  }
  return Status::Ok();
}

Status HbmPool::CopyToHost(uint32_t slot, void* dst, uint64_t bytes, CopyDone done) {
  if (slot >= opts_.slots || bytes > opts_.slot_bytes) return Status::Invalid("hbm copy: slot or size out of range");
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(d2h_);
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMemcpyAsync(dst, slot_ptr(slot), bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync D2H"));
  auto* c = new HostFnCtx{std::move(done)};
  cudaError_t e = cudaLaunchHostFunc(s, RunDone, c);
  if (e != cudaSuccess) {
    delete c;
    return CudaErr(e, "cudaLaunchHostFunc");
  }
  return Status::Ok();
}

Status HbmPool::CopyBatch(const std::vector<CopyItem>& items, bool to_device, CopyDone done) {
  for (const auto& it : items) {
    if (it.slot >= opts_.slots || it.bytes > opts_.slot_bytes) {
      return Status::Invalid("hbm copy: slot or size out of range");
    }
  }
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(to_device ? h2d_ : d2h_);
  const char* what = to_device ? "cudaMemcpyAsync H2D" : "cudaMemcpyAsync D2H";
  bool queued = false;
  // The copy-engine paths move coalesced runs (CoalesceCopies): neighbouring slots whose
  // host buffers are neighbours too go as one copy.
  std::vector<CopyRun> runs = CoalesceCopies(items, opts_.slot_bytes);
  uint64_t total = 0;
  for (const auto& r : runs) total += r.bytes;
  const bool short_runs = !runs.empty() && total / runs.size() < (uint64_t{1} << 20);
  if (to_device && gather_kernel_.load(std::memory_order_relaxed) &&
      (short_runs || gather_always_.load(std::memory_order_relaxed))) {
    // SM loads straight from the (mapped) host slots: no per-block DMA setup.
    auto args = std::make_unique<detail::GatherArgs>();
    args->dst_base = base_;
    args->slot_bytes = opts_.slot_bytes;
    const uint32_t chunk = detail::GatherChunkBytes();
    cudaError_t e = cudaSuccess;
    for (size_t i = 0; i < items.size() && e == cudaSuccess; i += detail::kMaxGatherItems) {
      const size_t n = std::min<size_t>(items.size() - i, detail::kMaxGatherItems);
      uint64_t max_bytes = 0;
      for (size_t j = 0; j < n; ++j) {
        const auto& it = items[i + j];
        args->items[j] = {static_cast<const uint8_t*>(it.host), it.slot, static_cast<uint32_t>(it.bytes)};
        max_bytes = std::max<uint64_t>(max_bytes, it.bytes);
      }
      args->n = static_cast<uint32_t>(n);
      args->chunks_per_item = static_cast<uint32_t>(std::max<uint64_t>(1, (max_bytes + chunk - 1) / chunk));
      e = detail::LaunchGather(*args, s);
    }
    if (e == cudaSuccess) {
      queued = true;
    } else if (e == cudaErrorInvalidValue || e == cudaErrorInvalidConfiguration ||
               e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
      // A launch was refused (nothing of it ran): copy engines from now on. Launches of
      // this batch already queued rewrite the same bytes; harmless.
      cudaGetLastError();
      gather_kernel_.store(false, std::memory_order_relaxed);
    } else {
      cudaStreamSynchronize(s);
      return CudaErr(e, "hbm gather kernel");
    }
  }
  if (queued) runs.clear();
  // A few long runs: a loop of cudaMemcpyAsync keeps the engines busiest (H200, 1.4 MiB
  // blocks: 0.895 of one cudaMemcpy against 0.87 for the batch call); many: one call.
  const bool use_batch = !loop_only_.load(std::memory_order_relaxed) &&
                         (runs.size() > 64 || batch_always_.load(std::memory_order_relaxed));
  if (!queued && runs.size() > 1 && use_batch && batch_api_.load(std::memory_order_relaxed)) {
    // One driver call for the whole batch (CUDA 12.8+): the per-call cost of
    // cudaMemcpyAsync (a few microseconds) is as long as the DMA of a 144 KiB block, so a
    // loop of them leaves the copy engine idle between blocks.
    std::vector<void*> dst(runs.size());
    std::vector<const void*> src(runs.size());
    std::vector<size_t> len(runs.size());
    for (size_t i = 0; i < runs.size(); ++i) {
      void* dev = slot_ptr(runs[i].slot);
      dst[i] = to_device ? dev : runs[i].host;
      src[i] = to_device ? static_cast<const void*>(runs[i].host) : dev;
      len[i] = runs[i].bytes;
    }
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t attr_idx = 0;
    const cudaError_t e =
        cudaMemcpyBatchAsync(dst.data(), src.data(), len.data(), runs.size(), &attr, &attr_idx, 1, s);
    if (e == cudaSuccess) {
      queued = true;
    } else {
      // Unsupported here (older driver, ...): nothing was queued; use the loop from now on.
      cudaGetLastError();
      batch_api_.store(false, std::memory_order_relaxed);
    }
  }
  for (size_t i = 0; !queued && i < runs.size(); ++i) {
    const auto& it = runs[i];
    const cudaError_t e = to_device
        ? cudaMemcpyAsync(slot_ptr(it.slot), it.host, it.bytes, cudaMemcpyHostToDevice, s)
        : cudaMemcpyAsync(it.host, slot_ptr(it.slot), it.bytes, cudaMemcpyDeviceToHost, s);
    if (e != cudaSuccess) {
      // Copies already queued finish on their own; wait for them so that the caller may
      // reuse the buffers once it has the error.
      cudaStreamSynchronize(s);
      return CudaErr(e, what);
    }
  }
  auto* c = new HostFnCtx{std::move(done)};
  cudaError_t e = cudaLaunchHostFunc(s, RunDone, c);
  if (e != cudaSuccess) {
    delete c;
    cudaStreamSynchronize(s);
    return CudaErr(e, "cudaLaunchHostFunc");
  }
  return Status::Ok();
}

Status HbmPool::CopyToHostSync(uint32_t slot, void* dst, uint64_t bytes) {
  if (slot >= opts_.slots || bytes > opts_.slot_bytes) return Status::Invalid("hbm copy: slot or size out of range");
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(d2h_);
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMemcpyAsync(dst, slot_ptr(slot), bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync D2H"));
  return CudaErr(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

Status HbmPool::CopyToDeviceSync(uint32_t slot, const void* src, uint64_t bytes) {
  if (slot >= opts_.slots || bytes > opts_.slot_bytes) return Status::Invalid("hbm copy: slot or size out of range");
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(h2d_);
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMemcpyAsync(slot_ptr(slot), src, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync H2D"));
  return CudaErr(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

#else  // !KVTIER_HAVE_CUDA

StatusOr<std::unique_ptr<HbmPool>> HbmPool::Create(const HbmPoolOptions& opts) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  return Status::Unsupported("hbm pool: built without CUDA");
}
HbmPool::~HbmPool() = default;
Status HbmPool::IpcHandle(uint8_t*) const { return Status::Unsupported("built without CUDA"); }
Status HbmPool::CopyToDevice(uint32_t, const void*, uint64_t, CopyDone) {
  return Status::Unsupported("built without CUDA");
}
Status HbmPool::CopyToHost(uint32_t, void*, uint64_t, CopyDone) { return Status::Unsupported("built without CUDA"); }
Status HbmPool::CopyToHostSync(uint32_t, void*, uint64_t) { return Status::Unsupported("built without CUDA"); }
Status HbmPool::CopyBatch(const std::vector<CopyItem>&, bool, CopyDone) {
  return Status::Unsupported("built without CUDA");
}
Status HbmPool::CopyToDeviceSync(uint32_t, const void*, uint64_t) {
  return Status::Unsupported("built without CUDA");
}

#endif

}  // namespace kvtier::tiers
