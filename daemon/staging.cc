#include "daemon/staging.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvtier::daemon {

StatusOr<std::unique_ptr<StagingArea>> StagingArea::Create(const std::string& name, uint32_t slots,
                                                           uint64_t slot_bytes, uint32_t first_id,
                                                           uint32_t stride) {
  if (slots == 0 || slot_bytes == 0 || slot_bytes % 4096 != 0 || stride == 0 ||
      uint64_t{first_id} + uint64_t{slots} * stride > UINT32_MAX) {
    return Status::Invalid("staging area: " + std::to_string(slots) + " slots of " + std::to_string(slot_bytes) +
                           " bytes");
  }
  std::unique_ptr<StagingArea> a(new StagingArea());
  a->slots_ = slots;
  a->slot_bytes_ = slot_bytes;
  a->first_id_ = first_id;
  a->stride_ = stride;
  a->bytes_ = a->slot_offset(slots);
  a->fd_ = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (a->fd_ < 0) return Status::IoError(std::string("memfd_create staging area: ") + std::strerror(errno));
  if (::ftruncate(a->fd_, static_cast<off_t>(a->bytes_)) != 0) {
    return Status::IoError("ftruncate staging area to " + std::to_string(a->bytes_) + " bytes: " +
                           std::strerror(errno));
  }
  // The client cannot shrink it under the daemon's copy at commit (a SIGBUS in kvtierd).
  if (::fcntl(a->fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::IoError(std::string("sealing the staging area: ") + std::strerror(errno));
  }
  void* m = ::mmap(nullptr, a->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd_, 0);
  if (m == MAP_FAILED) return Status::IoError(std::string("mmap staging area: ") + std::strerror(errno));
  a->base_ = static_cast<uint8_t*>(m);
  a->taken_.assign(slots, 0);
  a->free_.reserve(slots);
  for (uint32_t i = slots; i-- > 0;) a->free_.push_back(i);  // slot 0 on top
  return a;
}

StagingArea::~StagingArea() {
  if (base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

bool StagingArea::Alloc(uint32_t n, std::vector<uint32_t>* out) {
  std::lock_guard<std::mutex> l(mu_);
  if (free_.size() < n) return false;
  for (uint32_t k = 0; k < n; ++k) {
    const uint32_t i = free_.back();
    free_.pop_back();
    taken_[i] = 1;
    out->push_back(i);
  }
  return true;
}

void StagingArea::Free(uint32_t i) {
  std::lock_guard<std::mutex> l(mu_);
  if (i >= slots_ || !taken_[i]) return;  // never double-listed
  taken_[i] = 0;
  free_.push_back(i);
}

void StagingArea::Free(std::span<const uint32_t> slots) {
  std::lock_guard<std::mutex> l(mu_);
  for (uint32_t i : slots) {
    if (i >= slots_ || !taken_[i]) continue;
    taken_[i] = 0;
    free_.push_back(i);
  }
}

uint32_t StagingArea::used() const {
  std::lock_guard<std::mutex> l(mu_);
  return slots_ - static_cast<uint32_t>(free_.size());
}

}  // namespace kvtier::daemon
