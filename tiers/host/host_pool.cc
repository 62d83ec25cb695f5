#include "tiers/host/host_pool.h"

#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/cuda_env.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1; older libc headers lack the name
#endif

namespace kvtier::tiers {

Status HostPoolOptions::Validate() const {
  if (!classes.empty()) return Status::Ok();  // SlabAllocator::Make checks them
  if (slot_bytes == 0 || slot_bytes % 4096 != 0) {
    return Status::Invalid("host pool: slot_bytes " + std::to_string(slot_bytes) +
                           " is not a positive multiple of 4096");
  }
  if (slots == 0) return Status::Invalid("host pool: zero slots");
  return Status::Ok();
}

StatusOr<std::unique_ptr<HostPool>> HostPool::Create(const HostPoolOptions& opts) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  std::unique_ptr<HostPool> p(new HostPool());
  p->opts_ = opts;
  const uint64_t uniform = uint64_t{opts.slots} * opts.slot_bytes;
  auto alloc = opts.classes.empty() ? SlabAllocator::Make("host tier", uniform, uniform, {opts.slot_bytes})
                                    : SlabAllocator::Make("host tier", opts.arena_bytes, opts.slab_bytes, opts.classes);
  if (!alloc.ok()) return alloc.status();
  p->alloc_ = std::move(*alloc);
  p->arena_bytes_ = p->alloc_.arena_bytes();
  p->fd_ = memfd_create("kvtier-host-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (p->fd_ < 0) return Status::IoError(std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(p->fd_, static_cast<off_t>(p->arena_bytes_)) != 0) {
    return Status::IoError(std::string("ftruncate host arena to ") +
                           std::to_string(p->arena_bytes_) + " bytes: " + std::strerror(errno));
  }
  int flags = MAP_SHARED | (opts.populate ? MAP_POPULATE : 0);
  void* m = mmap(nullptr, p->arena_bytes_, PROT_READ | PROT_WRITE, flags, p->fd_, 0);
  if (m == MAP_FAILED) return Status::IoError(std::string("mmap host arena: ") + std::strerror(errno));
  // Every client maps this fd. Sealed after the daemon's own writable mapping exists:
  // its size (no client can shrink the arena under the others: a SIGBUS for everyone
  // touching the pages) and every future write access (F_SEAL_FUTURE_WRITE: a PROT_WRITE
  // shared mapping, an mprotect to PROT_WRITE, write(2), fallocate and a reopen of the fd
  // through /proc all fail for everyone but the mapping made above).
  if (fcntl(p->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    const std::string err = std::strerror(errno);
    munmap(m, p->arena_bytes_);
    return Status::IoError("sealing the host arena: " + err);
  }
  p->base_ = static_cast<uint8_t*>(m);
  if (opts.cuda_register && cuda::DeviceCount() > 0) {
    Status s = cuda::HostRegister(p->base_, p->arena_bytes_);
    if (s.ok()) {
      p->cuda_registered_ = true;
    } else {
      spdlog::warn("host pool: {} (host<->HBM copies will be slow)", s.ToString());
    }
  }
  return p;
}

HostPool::~HostPool() {
  if (cuda_registered_) (void)cuda::HostUnregister(base_);
  if (base_) munmap(base_, arena_bytes_);
  if (fd_ >= 0) close(fd_);
}

std::optional<uint32_t> HostPool::Alloc(int cls) {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.Alloc(cls);
}

Status HostPool::Free(uint32_t slot) {
  std::lock_guard<std::mutex> l(mu_);
  if (!alloc_.Free(slot)) {
    return Status::Invalid("host pool: slot " + std::to_string(slot) + " is not allocated");
  }
  return Status::Ok();
}

uint64_t HostPool::slot_size(uint32_t slot) const {
  std::lock_guard<std::mutex> l(mu_);
  const int c = alloc_.ClassOfSlot(slot);
  return c < 0 ? 0 : alloc_.class_bytes(c);
}
bool HostPool::IsAllocated(uint32_t slot) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.IsTaken(slot);
}
uint32_t HostPool::used() const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.used();
}
uint32_t HostPool::used(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.used(cls);
}
uint32_t HostPool::free_count(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.free_count(cls);
}
uint32_t HostPool::capacity(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.capacity(cls);
}
uint64_t HostPool::used_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.used_bytes();
}
uint32_t HostPool::free_slabs() const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.free_slabs();
}
uint32_t HostPool::slabs(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.slabs(cls);
}
StatusOr<std::vector<uint32_t>> HostPool::BeginMove(uint32_t slab, int to) {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.BeginMove(slab, to);
}
void HostPool::CancelMove(uint32_t slab) {
  std::lock_guard<std::mutex> l(mu_);
  alloc_.CancelMove(slab);
}
std::vector<uint32_t> HostPool::TakenSlots(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  return alloc_.TakenSlots(slab);
}
int HostPool::SlabClass(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  return slab < alloc_.num_slabs() ? alloc_.SlabClass(slab) : -1;
}
bool HostPool::Draining(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  return slab < alloc_.num_slabs() && alloc_.Draining(slab);
}

}  // namespace kvtier::tiers
