#include "tiers/hbm/hbm_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <spdlog/spdlog.h>

#include "tiers/hbm/gather.h"
#include "tiers/hbm/hash.h"
#endif

namespace kvtier::tiers {

const char* HbmCopyName(HbmCopy c) {
  switch (c) {
    case HbmCopy::kAuto: return "auto";
    case HbmCopy::kKernel: return "kernel";
    case HbmCopy::kBatch: return "batch";
    case HbmCopy::kLoop: return "loop";
  }
  return "?";
}

StatusOr<HbmCopy> ParseHbmCopy(std::string_view name) {
  for (HbmCopy c : {HbmCopy::kAuto, HbmCopy::kKernel, HbmCopy::kBatch, HbmCopy::kLoop}) {
    if (name == HbmCopyName(c)) return c;
  }
  return Status::Invalid("hbm copy method \"" + std::string(name) + "\" unknown (auto, kernel, batch, loop)");
}

Status HbmPoolOptions::Validate() const {
  if (classes_at_registration) {
    if (!classes.empty()) return Status::Invalid("hbm pool: slot classes are listed and made at registration");
    if (slot_bytes == 0 || slot_bytes > slab_bytes) {
      return Status::Invalid("hbm pool: the largest block (" + std::to_string(slot_bytes) +
                             " bytes) does not fit a slab of " + std::to_string(slab_bytes));
    }
  } else if (!classes.empty()) {
    if (device < 0) return Status::Invalid("hbm pool: negative device ordinal");
  } else if (slot_bytes == 0 || slot_bytes % 4096) {
    return Status::Invalid("hbm pool: slot_bytes " + std::to_string(slot_bytes) +
                           " is not a positive multiple of 4096");
  }
  if (classes.empty() && !classes_at_registration && slots == 0) return Status::Invalid("hbm pool: zero slots");
  if (device < 0) return Status::Invalid("hbm pool: negative device ordinal");
  if (streams < 1 || streams > kMaxStreams) {
    return Status::Invalid("hbm pool: streams " + std::to_string(streams) + " not in [1, " +
                           std::to_string(kMaxStreams) + "]");
  }
  if (static_cast<uint8_t>(copy) > static_cast<uint8_t>(HbmCopy::kLoop)) {
    return Status::Invalid("hbm pool: copy method " + std::to_string(static_cast<int>(copy)) + " unknown");
  }
  return Status::Ok();
}

StatusOr<int> HbmPool::AddClass(uint64_t bytes, uint64_t page_bytes) {
  std::lock_guard<std::mutex> l(mu_);
  auto c = alloc_.AddClass(bytes, page_bytes);
  if (c.ok()) num_classes_.store(static_cast<int>(alloc_.num_classes()), std::memory_order_release);
  return c;
}

StatusOr<int> HbmPool::AddClass(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  if (!opts_.classes_at_registration) {
    const int c = alloc_.ClassOfBytes(bytes);
    if (c < 0) return Status::Invalid("hbm tier: no slot class of " + std::to_string(bytes) + " bytes");
    return c;
  }
  const uint64_t g = alloc_.granule();
  auto c = alloc_.AddClass(bytes == 0 ? 0 : (bytes + g - 1) / g * g);
  if (!c.ok()) return Status::Invalid("hbm tier: " + c.status().message());
  num_classes_.store(static_cast<int>(alloc_.num_classes()), std::memory_order_release);
  return c;
}

StatusOr<HbmPool::SlotSpan> HbmPool::SpanOf(uint32_t slot, uint64_t bytes) const {
  if (!InArena(slot, bytes)) return Status::Invalid("hbm copy: slot or size out of range");
  SlotSpan sp;
  sp.off = slot_offset(slot);
  std::lock_guard<std::mutex> l(mu_);
  const int cls = alloc_.SlabClass(alloc_.SlabOf(slot));
  if (cls < 0 || alloc_.page_bytes(cls) == 0) return sp;
  const uint64_t page = alloc_.page_bytes(cls), size = alloc_.class_bytes(cls);
  const uint64_t in = sp.off % slab_bytes(), j = in / size;
  const uint64_t pitch = uint64_t{alloc_.slots_per_slab(cls)} * page;
  const uint64_t pages = (bytes + page - 1) / page;
  // The slot's last page must end inside its slab: (pages - 1) * pitch + (j + 1) * page.
  if (in % size != 0 || bytes > size || j >= alloc_.slots_per_slab(cls) ||
      (pages > 0 && (pages - 1) * pitch + (j + 1) * page > slab_bytes())) {
    return Status::Invalid("hbm copy: slot " + std::to_string(slot) + " is no slot of its layer-major slab, or " +
                           std::to_string(bytes) + " bytes pass it");
  }
  sp.off = sp.off - in + j * page;
  sp.pitch = pitch;
  sp.page = page;
  return sp;
}

std::optional<uint32_t> HbmPool::Alloc(int cls) {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.Alloc(cls);
}
Status HbmPool::Free(uint32_t slot) {
  std::lock_guard<std::mutex> l(mu_);
  if (!alloc_.Free(slot)) return Status::Invalid("hbm pool: slot " + std::to_string(slot) + " is not allocated");
  if (hashed_) hashed_[slot].store(0, std::memory_order_relaxed);
  return Status::Ok();
}

std::optional<uint64_t> HbmPool::SlotHash(uint32_t slot) const {
  if (!hashed_ || slot >= id_space() || hashed_[slot].load(std::memory_order_acquire) == 0) return std::nullopt;
  return static_cast<uint64_t>(reinterpret_cast<const volatile unsigned long long*>(hash_host_)[slot]);
}
uint32_t HbmPool::used() const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.used();
}
uint32_t HbmPool::free_count() const { return free_count(0); }
uint32_t HbmPool::used(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.used(cls);
}
uint32_t HbmPool::free_count(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.free_count(cls);
}
uint32_t HbmPool::capacity(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.capacity(cls);
}
uint64_t HbmPool::used_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.used_bytes();
}
uint32_t HbmPool::slabs(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.slabs(cls);
}
StatusOr<std::vector<uint32_t>> HbmPool::BeginMove(uint32_t slab, int to) {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.BeginMove(slab, to);
}
std::vector<uint32_t> HbmPool::TakenSlots(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.TakenSlots(slab);
}
int HbmPool::SlabClass(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  return slab < alloc_.num_slabs() ? alloc_.SlabClass(slab) : -1;
}
bool HbmPool::Draining(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  return slab < alloc_.num_slabs() && alloc_.Draining(slab);
}

void HbmPool::SetHostBreaks(std::vector<uintptr_t> breaks) {
  std::sort(breaks.begin(), breaks.end());
  host_breaks_ = std::move(breaks);
}

std::vector<HbmPool::CopyRun> HbmPool::CoalesceCopies(std::vector<CopyItem> items, uint64_t granule,
                                                      const std::vector<uintptr_t>& host_breaks) {
  std::sort(items.begin(), items.end(), [](const CopyItem& a, const CopyItem& b) { return a.slot < b.slot; });
  auto at_break = [&](const void* p) {
    return !host_breaks.empty() &&
           std::binary_search(host_breaks.begin(), host_breaks.end(), reinterpret_cast<uintptr_t>(p));
  };
  std::vector<CopyRun> runs;
  for (size_t i = 0; i < items.size();) {
    CopyRun r{items[i].slot, items[i].host, items[i].bytes};
    size_t j = i;
    while (j + 1 < items.size() &&
           uint64_t{items[j + 1].slot} * granule == uint64_t{items[j].slot} * granule + items[j].bytes &&
           static_cast<uint8_t*>(items[j + 1].host) == static_cast<uint8_t*>(items[j].host) + items[j].bytes &&
           !at_break(items[j + 1].host)) {
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
  // HbmPoolOptions::trace_copies: what the batch was and when it was issued.
  bool trace = false;
  std::chrono::steady_clock::time_point t0{};
  double issue_us = 0;
  size_t items = 0, runs = 0, streams = 0;
  uint64_t bytes = 0;
  const char* method = "";
  bool to_device = true;
};
void CUDART_CB RunDone(void* p) {
  auto* c = static_cast<HostFnCtx*>(p);
  if (c->trace) {
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - c->t0).count();
    spdlog::info("hbm copy batch {}: {} items, {} runs, {} streams, {:.2f} MB, {}: issued in {:.0f} us, done after "
                 "{:.0f} us ({:.1f} GB/s)",
                 c->to_device ? "H2D" : "D2H", c->items, c->runs, c->streams, c->bytes / 1e6, c->method, c->issue_us,
                 us, us > 0 ? c->bytes / us / 1e3 : 0.0);
  }
  c->done(Status::Ok());
  delete c;
}
// One copy on stream s (none for bytes == 0), then `done` on the same stream once it has landed.
Status CopyThenDone(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind, cudaStream_t s,
                    HbmPool::CopyDone done, const char* what) {
  if (bytes > 0) KVTIER_RETURN_IF_ERROR(CudaErr(cudaMemcpyAsync(dst, src, bytes, kind, s), what));
  auto* c = new HostFnCtx{std::move(done)};
  cudaError_t e = cudaLaunchHostFunc(s, RunDone, c);
  if (e != cudaSuccess) {
    delete c;
    return CudaErr(e, "cudaLaunchHostFunc");
  }
  return Status::Ok();
}

detail::SlotSpan KernelSpan(const HbmPool::SlotSpan& sp, uint64_t bytes) {
  detail::SlotSpan k;
  k.dst_off = sp.off;
  k.pitch = sp.pitch;
  k.page = sp.page == 0 ? UINT32_MAX : static_cast<uint32_t>(sp.page);
  k.bytes = static_cast<uint32_t>(bytes);
  return k;
}

}  // namespace

Status HbmPool::CopySpan(const SlotSpan& sp, void* host, uint64_t bytes, bool to_device, void* stream) const {
  auto s = static_cast<cudaStream_t>(stream);
  uint8_t* dev = base_ + sp.off;
  const cudaMemcpyKind kind = to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  const char* what = to_device ? "cudaMemcpyAsync H2D" : "cudaMemcpyAsync D2H";
  if (sp.page == 0) {
    return CudaErr(to_device ? cudaMemcpyAsync(dev, host, bytes, kind, s) : cudaMemcpyAsync(host, dev, bytes, kind, s),
                   what);
  }
  const uint64_t full = bytes / sp.page, rest = bytes % sp.page;
  auto* h = static_cast<uint8_t*>(host);
  if (full > 0 && static_cast<int64_t>(sp.pitch) <= max_pitch_) {
    // One 2D copy: a row per page, the host's rows back to back, the slab's a layer apart.
    const cudaError_t e = to_device ? cudaMemcpy2DAsync(dev, sp.pitch, h, sp.page, sp.page, full, kind, s)
                                    : cudaMemcpy2DAsync(h, sp.page, dev, sp.pitch, sp.page, full, kind, s);
    KVTIER_RETURN_IF_ERROR(CudaErr(e, to_device ? "cudaMemcpy2DAsync H2D" : "cudaMemcpy2DAsync D2H"));
  } else {
    // A layer stride past the copy engines' pitch limit (one slab of a huge arena): a copy
    // per page.
    for (uint64_t l = 0; l < full; ++l) {
      uint8_t* d = dev + l * sp.pitch;
      uint8_t* x = h + l * sp.page;
      KVTIER_RETURN_IF_ERROR(CudaErr(
          to_device ? cudaMemcpyAsync(d, x, sp.page, kind, s) : cudaMemcpyAsync(x, d, sp.page, kind, s), what));
    }
  }
  if (rest > 0) {
    uint8_t* d = dev + full * sp.pitch;
    uint8_t* x = h + full * sp.page;
    KVTIER_RETURN_IF_ERROR(
        CudaErr(to_device ? cudaMemcpyAsync(d, x, rest, kind, s) : cudaMemcpyAsync(x, d, rest, kind, s), what));
  }
  return Status::Ok();
}

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
  const uint64_t uniform = uint64_t{opts.slots} * opts.slot_bytes;
  auto alloc = opts.classes_at_registration
                   ? SlabAllocator::MakeOnGranule("hbm tier", opts.arena_bytes, opts.slab_bytes,
                                                  AutoGranule(opts.arena_bytes))
               : opts.classes.empty() ? SlabAllocator::Make("hbm tier", uniform, uniform, {opts.slot_bytes})
                                      : SlabAllocator::Make("hbm tier", opts.arena_bytes, opts.slab_bytes, opts.classes);
  if (!alloc.ok()) return alloc.status();
  p->alloc_ = std::move(*alloc);
  p->num_classes_.store(static_cast<int>(p->alloc_.num_classes()));
  const uint32_t ids = p->alloc_.id_space();
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaSetDevice(opts.device), "cudaSetDevice"));
  int max_pitch = 0;
  if (cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, opts.device) != cudaSuccess) cudaGetLastError();
  p->max_pitch_ = max_pitch;
  // The allocation is rounded up to whole 2 MiB pages. A process that imports an allocation
  // of any other size over CUDA IPC maps it with small pages, and a decode's reads of pages
  // spread over the arena then run at about a seventh of their speed on a mapping of large
  // pages (tools/gpu/decode_ab.py: 84.5 against 11.0 ms, NVFP4 8 x 128K on the H200).
  constexpr uint64_t kGpuPage = uint64_t{2} << 20;
  const uint64_t mapped = (p->arena_bytes() + kGpuPage - 1) / kGpuPage * kGpuPage;
  void* m = nullptr;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMalloc(&m, mapped), "cudaMalloc HBM arena"));
  p->base_ = static_cast<uint8_t*>(m);
  cudaStream_t a, b;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), "stream"));
  p->h2d_ = a;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), "stream"));
  p->d2h_ = b;
  p->streams_ = opts.streams;
  for (int d = 0; d < 2; ++d) {
    for (int i = 1; i < p->streams_; ++i) {
      cudaStream_t fs;
      cudaEvent_t fe;
      KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamCreateWithFlags(&fs, cudaStreamNonBlocking), "stream"));
      p->fan_[d][i] = fs;
      KVTIER_RETURN_IF_ERROR(CudaErr(cudaEventCreateWithFlags(&fe, cudaEventDisableTiming), "event"));
      p->fan_done_[d][i] = fe;
    }
  }
  for (int d = 0; d < 2; ++d) {
    cudaStream_t cs;
    cudaEvent_t ce;
    KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), "stream"));
    p->cb_stream_[d] = cs;
    KVTIER_RETURN_IF_ERROR(CudaErr(cudaEventCreateWithFlags(&ce, cudaEventDisableTiming), "event"));
    p->cb_event_[d] = ce;
  }
  p->trace_ = opts.trace_copies;
  {
    std::random_device rd;
    p->hash_seed_ = (uint64_t{rd()} << 32) ^ rd();
  }
  // The hashes on a stream of the highest priority: a commit's hash is scheduled ahead of
  // an engine's queued kernels, so it runs soon after the commit returns.
  int least = 0, greatest = 0;
  cudaDeviceGetStreamPriorityRange(&least, &greatest);
  cudaGetLastError();
  cudaStream_t hs;
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamCreateWithPriority(&hs, cudaStreamNonBlocking, greatest), "stream"));
  p->hash_stream_ = hs;
  for (void** ev : {&p->hash_in_, &p->hash_done_}) {
    cudaEvent_t e;
    KVTIER_RETURN_IF_ERROR(CudaErr(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event"));
    *ev = e;
  }
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMalloc(reinterpret_cast<void**>(&p->hash_sums_), sizeof(unsigned long long) * ids), "cudaMalloc hash"));
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMalloc(reinterpret_cast<void**>(&p->hash_counts_), sizeof(unsigned int) * ids), "cudaMalloc hash"));
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMemset(p->hash_sums_, 0, sizeof(unsigned long long) * ids), "cudaMemset"));
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaMemset(p->hash_counts_, 0, sizeof(unsigned int) * ids), "cudaMemset"));
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaHostAlloc(reinterpret_cast<void**>(&p->hash_host_),
                                               sizeof(unsigned long long) * ids, cudaHostAllocMapped),
                                 "cudaHostAlloc hash"));
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaHostGetDevicePointer(reinterpret_cast<void**>(&p->hash_host_dev_), p->hash_host_, 0),
                                 "cudaHostGetDevicePointer"));
  p->hashed_ = std::make_unique<std::atomic<uint8_t>[]>(ids);
  for (uint32_t i = 0; i < ids; ++i) p->hashed_[i].store(0, std::memory_order_relaxed);
  // HbmPoolOptions::copy: auto (default), or one method forced for a benchmark.
  const HbmCopy mode = opts.copy;
  int host_ptr_ok = 0;
  cudaDeviceGetAttribute(&host_ptr_ok, cudaDevAttrCanUseHostPointerForRegisteredMem, opts.device);
  cudaGetLastError();
  p->gather_kernel_.store((mode == HbmCopy::kAuto || mode == HbmCopy::kKernel) && host_ptr_ok == 1);
  p->gather_always_.store(mode == HbmCopy::kKernel);
  p->batch_api_.store(mode != HbmCopy::kLoop);
  p->loop_only_.store(mode == HbmCopy::kLoop);
  p->batch_always_.store(mode == HbmCopy::kBatch);
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
  for (auto& dir : fan_) {
    for (void*& fs : dir) {
      if (fs != nullptr) {
        cudaStreamSynchronize(static_cast<cudaStream_t>(fs));
        cudaStreamDestroy(static_cast<cudaStream_t>(fs));
      }
    }
  }
  for (int d = 0; d < 2; ++d) {
    if (cb_stream_[d] != nullptr) {
      cudaStreamSynchronize(static_cast<cudaStream_t>(cb_stream_[d]));
      cudaStreamDestroy(static_cast<cudaStream_t>(cb_stream_[d]));
    }
    if (cb_event_[d] != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(cb_event_[d]));
  }
  for (auto& dir : fan_done_) {
    for (void* fe : dir) {
      if (fe != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(fe));
    }
  }
  if (hash_stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(hash_stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(hash_stream_));
  }
  if (hash_in_) cudaEventDestroy(static_cast<cudaEvent_t>(hash_in_));
  if (hash_done_) cudaEventDestroy(static_cast<cudaEvent_t>(hash_done_));
  if (hash_sums_) cudaFree(hash_sums_);
  if (hash_counts_) cudaFree(hash_counts_);
  if (hash_host_) cudaFreeHost(hash_host_);
  if (base_) cudaFree(base_);
}

Status HbmPool::QueueHashLocked(const std::vector<HashItem>& items, void* after_stream) {
  if (items.empty()) return Status::Ok();
  std::vector<detail::SlotSpan> spans;
  spans.reserve(items.size());
  for (const auto& it : items) {
    auto sp = SpanOf(it.slot, it.bytes);
    if (!sp.ok() || it.bytes > UINT32_MAX) return Status::Invalid("hbm hash: slot or size out of range");
    spans.push_back(KernelSpan(*sp, it.bytes));
  }
  auto hs = static_cast<cudaStream_t>(hash_stream_);
  if (after_stream != nullptr) {  // after the copies queued on that stream so far
    KVTIER_RETURN_IF_ERROR(CudaErr(cudaEventRecord(static_cast<cudaEvent_t>(hash_in_), static_cast<cudaStream_t>(after_stream)),
                                   "cudaEventRecord"));
    KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamWaitEvent(hs, static_cast<cudaEvent_t>(hash_in_), 0), "cudaStreamWaitEvent"));
  }
  auto args = std::make_unique<detail::HashArgs>();
  args->base = base_;
  args->seed = hash_seed_;
  args->sums = hash_sums_;
  args->counts = hash_counts_;
  args->out = hash_host_dev_;
  const uint32_t chunk = detail::HashChunkBytes();
  for (size_t i = 0; i < items.size(); i += detail::kMaxHashItems) {
    const size_t n = std::min<size_t>(items.size() - i, detail::kMaxHashItems);
    uint64_t max_bytes = 0;
    for (size_t j = 0; j < n; ++j) {
      args->items[j] = {items[i + j].slot, 0, spans[i + j]};
      max_bytes = std::max<uint64_t>(max_bytes, items[i + j].bytes);
    }
    args->n = static_cast<uint32_t>(n);
    args->chunks_per_item = static_cast<uint32_t>(std::max<uint64_t>(1, (max_bytes + chunk - 1) / chunk));
    KVTIER_RETURN_IF_ERROR(CudaErr(detail::LaunchHash(*args, hs), "hbm hash kernel"));
  }
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaEventRecord(static_cast<cudaEvent_t>(hash_done_), hs), "cudaEventRecord"));
  for (const auto& it : items) hashed_[it.slot].store(1, std::memory_order_release);
  return Status::Ok();
}

Status HbmPool::HashSlots(const std::vector<HashItem>& items) {
  cudaSetDevice(opts_.device);
  std::lock_guard<std::mutex> l(hash_mu_);
  return QueueHashLocked(items, nullptr);
}

Status HbmPool::WaitHashes(void* stream) {
  std::lock_guard<std::mutex> l(hash_mu_);
  return CudaErr(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(hash_done_), 0),
                 "cudaStreamWaitEvent");
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
  auto sp = SpanOf(slot, bytes);
  if (!sp.ok()) return sp.status();
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(h2d_);
  KVTIER_RETURN_IF_ERROR(CopySpan(*sp, const_cast<void*>(src), bytes, true, s));
  {
    std::lock_guard<std::mutex> l(hash_mu_);
    KVTIER_RETURN_IF_ERROR(QueueHashLocked({{slot, bytes}}, h2d_));
  }
  return CopyThenDone(nullptr, nullptr, 0, cudaMemcpyHostToDevice, s, std::move(done), "cudaMemcpyAsync H2D");
}

Status HbmPool::CopyToHost(uint32_t slot, void* dst, uint64_t bytes, CopyDone done) {
  auto sp = SpanOf(slot, bytes);
  if (!sp.ok()) return sp.status();
  cudaSetDevice(opts_.device);
  KVTIER_RETURN_IF_ERROR(WaitHashes(d2h_));
  KVTIER_RETURN_IF_ERROR(CopySpan(*sp, dst, bytes, false, d2h_));
  return CopyThenDone(nullptr, nullptr, 0, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(d2h_),
                      std::move(done), "cudaMemcpyAsync D2H");
}

Status HbmPool::CopyBatch(const std::vector<CopyItem>& items, bool to_device, CopyDone done) {
  const auto t0 = std::chrono::steady_clock::now();
  // Where each item's bytes lie: contiguous, or page after page in a layer-major slab.
  std::vector<SlotSpan> spans;
  spans.reserve(items.size());
  std::vector<CopyItem> flat;  // the contiguous ones (coalesced below)
  std::vector<size_t> paged;   // indexes of the layer-major ones
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    auto sp = SpanOf(it.slot, it.bytes);
    if (!sp.ok() || it.bytes > UINT32_MAX) return Status::Invalid("hbm copy: slot or size out of range");
    spans.push_back(*sp);
    if (sp->page == 0) {
      flat.push_back(it);
    } else {
      paged.push_back(i);
    }
  }
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(to_device ? h2d_ : d2h_);
  bool queued = false;
  // The copy-engine paths move coalesced runs (CoalesceCopies): neighbouring slots whose
  // host buffers are neighbours too go as one copy. A layer-major slot is a run of its own
  // (one cudaMemcpy2DAsync), after the contiguous runs; run_span[k] says where run k lies.
  std::vector<CopyRun> runs = CoalesceCopies(flat, granule(), host_breaks_);
  std::vector<SlotSpan> run_span(runs.size());
  for (size_t k = 0; k < runs.size(); ++k) run_span[k].off = slot_offset(runs[k].slot);
  const size_t flat_runs = runs.size();
  for (size_t i : paged) {
    runs.push_back({items[i].slot, items[i].host, items[i].bytes});
    run_span.push_back(spans[i]);
  }
  uint64_t total = 0;
  for (const auto& r : runs) total += r.bytes;
  const bool short_runs = !runs.empty() && total / runs.size() < (uint64_t{1} << 20);
  if (to_device && gather_kernel_.load(std::memory_order_relaxed) &&
      (short_runs || gather_always_.load(std::memory_order_relaxed))) {
    // SM loads straight from the (mapped) host slots: no per-block DMA setup.
    auto args = std::make_unique<detail::GatherArgs>();
    args->dst_base = base_;
    const uint32_t chunk = detail::GatherChunkBytes();
    cudaError_t e = cudaSuccess;
    for (size_t i = 0; i < items.size() && e == cudaSuccess; i += detail::kMaxGatherItems) {
      const size_t n = std::min<size_t>(items.size() - i, detail::kMaxGatherItems);
      uint64_t max_bytes = 0;
      for (size_t j = 0; j < n; ++j) {
        const auto& it = items[i + j];
        args->items[j] = {static_cast<const uint8_t*>(it.host), KernelSpan(spans[i + j], it.bytes)};
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
  if (queued) {
    runs.clear();
    run_span.clear();
  }
  // The copy engines: runs [b, e) on stream `cs`, as one cudaMemcpyBatchAsync or a loop of
  // cudaMemcpyAsync. A few long runs: the loop keeps the engines busiest (H200, 1.4 MiB
  // blocks: 0.895 of one cudaMemcpy against 0.87 for the batch call); many: one call (the
  // per-call cost of cudaMemcpyAsync, a few microseconds, is as long as the DMA of a
  // 144 KiB block, so a loop of them leaves the copy engine idle between blocks).
  const char* method = queued ? "gather kernel" : "";
  auto issue_runs = [&](cudaStream_t cs, size_t b, size_t e) -> Status {
    const size_t n = e - b;
    if (!to_device) KVTIER_RETURN_IF_ERROR(WaitHashes(cs));  // SlotHash ready in the completion
    // cudaMemcpyBatchAsync moves contiguous runs only.
    const bool use_batch = !loop_only_.load(std::memory_order_relaxed) && e <= flat_runs &&
                           (n > 64 || batch_always_.load(std::memory_order_relaxed));
    if (n > 1 && use_batch && batch_api_.load(std::memory_order_relaxed)) {
      std::vector<void*> dst(n);
      std::vector<const void*> src(n);
      std::vector<size_t> len(n);
      for (size_t i = 0; i < n; ++i) {
        void* dev = slot_ptr(runs[b + i].slot);
        dst[i] = to_device ? dev : runs[b + i].host;
        src[i] = to_device ? static_cast<const void*>(runs[b + i].host) : dev;
        len[i] = runs[b + i].bytes;
      }
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_idx = 0;
      if (cudaMemcpyBatchAsync(dst.data(), src.data(), len.data(), n, &attr, &attr_idx, 1, cs) == cudaSuccess) {
        method = "cudaMemcpyBatchAsync";
        return Status::Ok();
      }
      // Unsupported here (older driver, ...): nothing was queued; use the loop from now on.
      cudaGetLastError();
      batch_api_.store(false, std::memory_order_relaxed);
    }
    method = e > flat_runs ? "cudaMemcpyAsync / cudaMemcpy2DAsync loop" : "cudaMemcpyAsync loop";
    for (size_t i = b; i < e; ++i) {
      KVTIER_RETURN_IF_ERROR(CopySpan(run_span[i], runs[i].host, runs[i].bytes, to_device, cs));
    }
    return Status::Ok();
  };
  // Several runs and several streams (HbmPoolOptions::streams): the runs are split into
  // contiguous parts of about equal bytes, part k on stream k, so that one copy's DMA setup
  // overlaps another's transfer; the parts join `s` by events before the completion.
  std::lock_guard<std::mutex> fan_lock(fan_mu_);
  const int d = to_device ? 0 : 1;
  const size_t parts = std::min<size_t>(static_cast<size_t>(streams_), runs.size());
  size_t used_streams = queued ? 1 : std::max<size_t>(1, parts);
  if (!queued && !runs.empty()) {
    std::vector<size_t> cut{0};
    if (parts > 1) {
      uint64_t acc = 0;
      for (size_t i = 0; i < runs.size() && cut.size() < parts; ++i) {
        acc += runs[i].bytes;
        if (acc * parts >= total * cut.size() && i + 1 < runs.size()) cut.push_back(i + 1);
      }
    }
    cut.push_back(runs.size());
    used_streams = cut.size() - 1;
    Status st = Status::Ok();
    for (size_t k = 0; k + 1 < cut.size() && st.ok(); ++k) {
      cudaStream_t cs = k == 0 ? s : static_cast<cudaStream_t>(fan_[d][k]);
      st = issue_runs(cs, cut[k], cut[k + 1]);
      if (st.ok() && k > 0) {
        auto ev = static_cast<cudaEvent_t>(fan_done_[d][k]);
        st = CudaErr(cudaEventRecord(ev, cs), "cudaEventRecord");
        if (st.ok()) st = CudaErr(cudaStreamWaitEvent(s, ev, 0), "cudaStreamWaitEvent");
      }
    }
    if (!st.ok()) {
      // Copies already queued finish on their own; wait for them so that the caller may
      // reuse the buffers once it has the error.
      for (size_t k = 0; k + 1 < cut.size(); ++k) {
        cudaStreamSynchronize(k == 0 ? s : static_cast<cudaStream_t>(fan_[d][k]));
      }
      return st;
    }
  }
  if (to_device) {
    // Hash what landed, after the copies (or the gather kernel) on `s`.
    std::vector<HashItem> hashed;
    hashed.reserve(items.size());
    for (const auto& it : items) hashed.push_back({it.slot, it.bytes});
    std::lock_guard<std::mutex> hl(hash_mu_);
    if (Status hs = QueueHashLocked(hashed, s); !hs.ok()) {
      spdlog::warn("hbm pool: hash of {} promoted blocks not queued ({}); they leave HBM unverified", items.size(),
                   hs.ToString());
    }
  }
  auto* c = new HostFnCtx{std::move(done)};
  if (trace_) {
    c->trace = true;
    c->t0 = t0;
    c->issue_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    c->items = items.size();
    c->runs = queued ? items.size() : runs.size();
    c->streams = used_streams;
    for (const auto& it : items) c->bytes += it.bytes;
    c->method = method;
    c->to_device = to_device;
  }
  // The completion waits for the copy stream by an event, on the callback stream.
  auto cbs = static_cast<cudaStream_t>(cb_stream_[d]);
  cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(cb_event_[d]), s);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(cbs, static_cast<cudaEvent_t>(cb_event_[d]), 0);
  if (e == cudaSuccess) e = cudaLaunchHostFunc(cbs, RunDone, c);
  if (e != cudaSuccess) {
    delete c;
    cudaStreamSynchronize(s);
    return CudaErr(e, "cudaLaunchHostFunc");
  }
  return Status::Ok();
}

Status HbmPool::CopyToHostSync(uint32_t slot, void* dst, uint64_t bytes) {
  auto sp = SpanOf(slot, bytes);
  if (!sp.ok()) return sp.status();
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(d2h_);
  KVTIER_RETURN_IF_ERROR(WaitHashes(d2h_));
  KVTIER_RETURN_IF_ERROR(CopySpan(*sp, dst, bytes, false, s));
  return CudaErr(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

Status HbmPool::CopyToDeviceSync(uint32_t slot, const void* src, uint64_t bytes) {
  auto sp = SpanOf(slot, bytes);
  if (!sp.ok()) return sp.status();
  cudaSetDevice(opts_.device);
  auto s = static_cast<cudaStream_t>(h2d_);
  KVTIER_RETURN_IF_ERROR(CopySpan(*sp, const_cast<void*>(src), bytes, true, s));
  KVTIER_RETURN_IF_ERROR(CudaErr(cudaStreamSynchronize(s), "cudaStreamSynchronize"));
  std::lock_guard<std::mutex> l(hash_mu_);
  return QueueHashLocked({{slot, bytes}}, nullptr);
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
Status HbmPool::HashSlots(const std::vector<HashItem>&) { return Status::Unsupported("built without CUDA"); }
Status HbmPool::QueueHashLocked(const std::vector<HashItem>&, void*) { return Status::Unsupported("built without CUDA"); }
Status HbmPool::WaitHashes(void*) { return Status::Unsupported("built without CUDA"); }

#endif

}  // namespace kvtier::tiers
