#include "tiers/host/host_pool.h"

#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <string>

#include "common/cuda_env.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010  // Linux 5.1; older libc headers lack the name
#endif

namespace kvtier::tiers {

Status HostPoolOptions::Validate() const {
  double sum = 0;
  for (double sh : part_shares) {
    if (!(sh >= 0.0 && sh <= 1.0)) return Status::Invalid("host pool: a part's share is not in [0, 1]");
    sum += sh;
  }
  if (sum > 1.0 + 1e-9) return Status::Invalid("host pool: the parts' shares sum to more than 1");
  if (classes_at_registration && !classes.empty()) {
    return Status::Invalid("host pool: slot classes are listed and made at registration: one or the other");
  }
  if (!classes.empty()) return Status::Ok();  // SlabAllocator::Make checks them
  if (classes_at_registration) {
    if (slot_bytes == 0 || slot_bytes > slab_bytes) {
      return Status::Invalid("host pool: the largest block (" + std::to_string(slot_bytes) +
                             " bytes) does not fit a slab of " + std::to_string(slab_bytes));
    }
    return Status::Ok();  // SlabAllocator::MakeOnGranule checks the rest
  }
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
  const bool uniform = p->uniform(), later = opts.classes_at_registration;
  const uint64_t all = uint64_t{opts.slots} * opts.slot_bytes;
  const uint64_t granule = later ? AutoGranule(opts.arena_bytes) : 0;
  // A region's allocator (the whole arena's: the one region without parts, the geometry's
  // check with).
  auto make = [&](const char* what, uint64_t bytes) {
    return uniform ? SlabAllocator::Make(what, bytes, bytes, {opts.slot_bytes})
           : later ? SlabAllocator::MakeOnGranule(what, bytes, opts.slab_bytes, granule)
                   : SlabAllocator::Make(what, bytes, opts.slab_bytes, opts.classes);
  };
  auto whole = make("host tier", uniform ? all : opts.arena_bytes);
  if (!whole.ok()) return whole.status();
  p->granule_ = whole->granule();
  p->arena_bytes_ = whole->arena_bytes();
  // Parts in units of one slot (one class) or one slab (classes); the common pool last.
  const uint64_t unit = uniform ? opts.slot_bytes : opts.slab_bytes;
  const uint64_t units = p->arena_bytes_ / unit;
  std::vector<uint64_t> sizes;
  uint64_t owned = 0;
  for (double sh : opts.part_shares) {
    const auto n = std::min<uint64_t>(units - owned, static_cast<uint64_t>(sh * static_cast<double>(units)));
    sizes.push_back(n);
    owned += n;
  }
  sizes.push_back(units - owned);
  uint64_t off = 0;
  uint32_t slab = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Region r;
    r.offset = off;
    r.bytes = sizes[i] * unit;
    r.first_id = static_cast<uint32_t>(off / p->granule_);
    r.ids = static_cast<uint32_t>(r.bytes / p->granule_);
    r.first_slab = slab;
    if (sizes.size() == 1) {
      r.alloc = std::move(*whole);
    } else if (r.bytes > 0) {
      auto a = make("host tier part", r.bytes);
      if (!a.ok()) return a.status();
      r.alloc = std::move(*a);
    }
    if (r.alloc) {
      slab += r.alloc->num_slabs();
      p->live_ = i;
    }
    off += r.bytes;
    p->regions_.push_back(std::move(r));
  }
  p->num_slabs_ = slab;
  p->classes_.store(static_cast<int>(p->any().num_classes()), std::memory_order_release);
  const int flags = MAP_SHARED | (opts.populate ? MAP_POPULATE : 0);
  if (p->regions_.size() > 1) {
    // One reservation: the parts are mapped into it at their offsets (MAP_FIXED), so the
    // arena is one range of addresses here as without parts.
    void* m = mmap(nullptr, p->arena_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return Status::IoError(std::string("mmap host arena reservation: ") + std::strerror(errno));
    p->base_ = static_cast<uint8_t*>(m);
  }
  for (size_t i = 0; i < p->regions_.size(); ++i) {
    Region& r = p->regions_[i];
    if (r.bytes == 0) continue;
    const std::string name = p->regions_.size() == 1 ? "kvtier-host-arena"
                             : i + 1 == p->regions_.size() ? "kvtier-host-common"
                                                           : "kvtier-host-part-" + std::to_string(i);
    r.fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (r.fd < 0) return Status::IoError(std::string("memfd_create: ") + std::strerror(errno));
    if (ftruncate(r.fd, static_cast<off_t>(r.bytes)) != 0) {
      return Status::IoError(std::string("ftruncate host arena to ") + std::to_string(r.bytes) + " bytes: " +
                             std::strerror(errno));
    }
    void* want = p->base_ ? p->base_ + r.offset : nullptr;
    void* m = mmap(want, r.bytes, PROT_READ | PROT_WRITE, flags | (want ? MAP_FIXED : 0), r.fd, 0);
    if (m == MAP_FAILED) return Status::IoError(std::string("mmap host arena: ") + std::strerror(errno));
    if (!p->base_) p->base_ = static_cast<uint8_t*>(m);
    // Clients map this fd. Sealed after the daemon's own writable mapping exists: its
    // size (no client can shrink the arena under the others: a SIGBUS for everyone
    // touching the pages) and every future write access (F_SEAL_FUTURE_WRITE: a PROT_WRITE
    // shared mapping, an mprotect to PROT_WRITE, write(2), fallocate and a reopen of the
    // fd through /proc all fail for everyone but the mapping made above).
    if (fcntl(r.fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
      return Status::IoError(std::string("sealing the host arena: ") + std::strerror(errno));
    }
  }
  if (opts.cuda_register && cuda::DeviceCount() > 0) {
    // Per part: each is a mapping of its own memfd, and no slot straddles two.
    bool all_ok = true;
    for (Region& r : p->regions_) {
      if (r.bytes == 0) continue;
      Status s = cuda::HostRegister(p->base_ + r.offset, r.bytes);
      r.cuda = s.ok();
      if (!s.ok()) {
        all_ok = false;
        spdlog::warn("host pool: {} (host<->HBM copies will be slow)", s.ToString());
      }
    }
    p->cuda_registered_ = all_ok;
  }
  return p;
}

HostPool::~HostPool() {
  for (Region& r : regions_) {
    if (r.cuda) (void)cuda::HostUnregister(base_ + r.offset);
  }
  if (base_) munmap(base_, arena_bytes_);
  for (Region& r : regions_) {
    if (r.fd >= 0) close(r.fd);
  }
}

int HostPool::RegionOf(uint32_t id) const {
  // The last region starting at or before id (a region of no slot shares its first id
  // with the next one).
  int r = 0;
  for (size_t i = 1; i < regions_.size(); ++i) {
    if (regions_[i].first_id <= id) r = static_cast<int>(i);
  }
  return r;
}

int HostPool::RegionOfSlab(uint32_t slab) const {
  int r = -1;
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (regions_[i].alloc && regions_[i].first_slab <= slab) r = static_cast<int>(i);
  }
  return r;
}

int HostPool::PartOfSlab(uint32_t slab) const { return slab < num_slabs_ ? RegionOfSlab(slab) : -1; }

StatusOr<int> HostPool::AddClass(uint64_t bytes) {
  if (!opts_.classes_at_registration) {
    const int c = any().ClassOfBytes(bytes);
    if (c < 0) return Status::Invalid("host tier: no slot class of " + std::to_string(bytes) + " bytes");
    return c;
  }
  const uint64_t slot = bytes == 0 ? 0 : (bytes + granule_ - 1) / granule_ * granule_;
  std::lock_guard<std::mutex> l(mu_);
  const int have = any().ClassOfBytes(slot);
  if (have >= 0) return have;
  // Every part's allocator has the same classes in the same order: check that all can
  // take it before any does, so that a refusal changes nothing.
  for (const Region& r : regions_) {
    if (!r.alloc) continue;
    if (slot == 0 || slot > r.alloc->slab_bytes() || r.alloc->num_classes() >= kMaxArenaClasses) {
      auto probe = SlabAllocator(*r.alloc).AddClass(slot);
      return Status::Invalid("host tier: " + probe.status().message());
    }
  }
  int made = -1;
  for (Region& r : regions_) {
    if (!r.alloc) continue;
    auto c = r.alloc->AddClass(slot);
    if (!c.ok()) return Status::Invalid("host tier: " + c.status().message());  // checked above
    made = *c;
  }
  classes_.store(static_cast<int>(any().num_classes()), std::memory_order_release);
  return made;
}

uint32_t HostPool::slots() const {
  const int n = num_classes();
  if (n == 0) {
    uint32_t all = 0;
    for (const Region& r : regions_) {
      if (r.alloc) all += r.alloc->num_slabs() * static_cast<uint32_t>(r.alloc->slab_bytes() / opts_.slot_bytes);
    }
    return all;
  }
  int smallest = 0;
  for (int c = 1; c < n; ++c) smallest = class_bytes(c) < class_bytes(smallest) ? c : smallest;
  return most(smallest);
}

uint32_t HostPool::most(int cls) const {
  uint32_t n = 0;
  for (const Region& r : regions_) {
    if (r.alloc) n += r.alloc->num_slabs() * r.alloc->slots_per_slab(cls);
  }
  return n;
}

std::optional<uint32_t> HostPool::Alloc(int cls, int part) {
  std::lock_guard<std::mutex> l(mu_);
  const size_t common = regions_.size() - 1;
  if (part >= 0 && static_cast<size_t>(part) < common) {
    Region& r = regions_[static_cast<size_t>(part)];
    if (r.alloc) {
      if (auto s = r.alloc->Alloc(cls)) return r.first_id + *s;
    }
  }
  Region& r = regions_[common];
  if (!r.alloc) return std::nullopt;
  auto s = r.alloc->Alloc(cls);
  if (!s) return std::nullopt;
  return r.first_id + *s;
}

Status HostPool::Free(uint32_t slot) {
  std::lock_guard<std::mutex> l(mu_);
  Region& r = regions_[static_cast<size_t>(PartOfSlot(slot))];
  if (!r.alloc || !r.alloc->Free(slot - r.first_id)) {
    return Status::Invalid("host pool: slot " + std::to_string(slot) + " is not allocated");
  }
  return Status::Ok();
}

uint64_t HostPool::slot_size(uint32_t slot) const {
  std::lock_guard<std::mutex> l(mu_);
  const Region& r = regions_[static_cast<size_t>(PartOfSlot(slot))];
  const int c = r.alloc ? r.alloc->ClassOfSlot(slot - r.first_id) : -1;
  return c < 0 ? 0 : r.alloc->class_bytes(c);
}
bool HostPool::IsAllocated(uint32_t slot) const {
  std::lock_guard<std::mutex> l(mu_);
  const Region& r = regions_[static_cast<size_t>(PartOfSlot(slot))];
  return r.alloc && r.alloc->IsTaken(slot - r.first_id);
}
uint32_t HostPool::used() const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  for (const Region& r : regions_) n += r.alloc ? r.alloc->used() : 0;
  return n;
}
uint32_t HostPool::used(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  for (const Region& r : regions_) n += r.alloc ? r.alloc->used(cls) : 0;
  return n;
}
uint32_t HostPool::free_count(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  for (const Region& r : regions_) n += r.alloc ? r.alloc->free_count(cls) : 0;
  return n;
}
uint32_t HostPool::free_count(int cls, int part) const {
  std::lock_guard<std::mutex> l(mu_);
  const size_t common = regions_.size() - 1;
  uint32_t n = regions_[common].alloc ? regions_[common].alloc->free_count(cls) : 0;
  if (part >= 0 && static_cast<size_t>(part) < common && regions_[static_cast<size_t>(part)].alloc) {
    n += regions_[static_cast<size_t>(part)].alloc->free_count(cls);
  }
  return n;
}
uint32_t HostPool::capacity(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  for (const Region& r : regions_) n += r.alloc ? r.alloc->capacity(cls) : 0;
  return n;
}
uint64_t HostPool::used_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t n = 0;
  for (const Region& r : regions_) n += r.alloc ? r.alloc->used_bytes() : 0;
  return n;
}
uint32_t HostPool::free_slabs() const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  for (const Region& r : regions_) n += r.alloc ? r.alloc->free_slabs() : 0;
  return n;
}
uint32_t HostPool::slabs(int cls) const {
  std::lock_guard<std::mutex> l(mu_);
  uint32_t n = 0;
  for (const Region& r : regions_) n += r.alloc ? r.alloc->slabs(cls) : 0;
  return n;
}
StatusOr<std::vector<uint32_t>> HostPool::BeginMove(uint32_t slab, int to) {
  std::lock_guard<std::mutex> l(mu_);
  const int ri = PartOfSlab(slab);
  if (ri < 0) return Status::Invalid("slab " + std::to_string(slab) + " is out of range");
  Region& r = regions_[static_cast<size_t>(ri)];
  auto taken = r.alloc->BeginMove(slab - r.first_slab, to);
  if (taken.ok()) {
    for (uint32_t& s : *taken) s += r.first_id;
  }
  return taken;
}
void HostPool::CancelMove(uint32_t slab) {
  std::lock_guard<std::mutex> l(mu_);
  const int ri = PartOfSlab(slab);
  if (ri < 0) return;
  Region& r = regions_[static_cast<size_t>(ri)];
  r.alloc->CancelMove(slab - r.first_slab);
}
std::vector<uint32_t> HostPool::TakenSlots(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  const int ri = PartOfSlab(slab);
  if (ri < 0) return {};
  const Region& r = regions_[static_cast<size_t>(ri)];
  std::vector<uint32_t> out = r.alloc->TakenSlots(slab - r.first_slab);
  for (uint32_t& s : out) s += r.first_id;
  return out;
}
int HostPool::SlabClass(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  const int ri = PartOfSlab(slab);
  if (ri < 0) return -1;
  const Region& r = regions_[static_cast<size_t>(ri)];
  return r.alloc->SlabClass(slab - r.first_slab);
}
bool HostPool::Draining(uint32_t slab) const {
  std::lock_guard<std::mutex> l(mu_);
  const int ri = PartOfSlab(slab);
  if (ri < 0) return false;
  const Region& r = regions_[static_cast<size_t>(ri)];
  return r.alloc->Draining(slab - r.first_slab);
}
uint32_t HostPool::SlabOf(uint32_t slot) const {
  const Region& r = regions_[static_cast<size_t>(PartOfSlot(slot))];
  return r.alloc ? r.first_slab + r.alloc->SlabOf(slot - r.first_id) : num_slabs_;
}

}  // namespace kvtier::tiers
