#include "daemon/staging.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kvtier::daemon {

namespace {
uint64_t Pages(uint64_t bytes) { return (bytes + 4095) & ~uint64_t{4095}; }
}  // namespace

bool StagingBudget::TryCharge(uint64_t bytes) {
  uint64_t was = charged_.load(std::memory_order_relaxed);
  do {
    if (limit_ != 0 && was + bytes > limit_) return false;
  } while (!charged_.compare_exchange_weak(was, was + bytes, std::memory_order_relaxed));
  return true;
}

void StagingBudget::TakeBack(uint64_t bytes) {
  std::lock_guard<std::mutex> l(mu_);
  // Least recently attached first: an area in steady use keeps its warm slots longest.
  for (StagingArea* a : areas_) {
    const uint64_t now = charged();
    if (limit_ == 0 || now + bytes <= limit_) break;
    a->TakeBackFree(now + bytes - limit_);
  }
}

void StagingBudget::Register(StagingArea* a) {
  std::lock_guard<std::mutex> l(mu_);
  areas_.push_back(a);
}

void StagingBudget::Unregister(StagingArea* a) {
  std::lock_guard<std::mutex> l(mu_);
  areas_.erase(std::remove(areas_.begin(), areas_.end(), a), areas_.end());
}

StatusOr<std::unique_ptr<StagingArea>> StagingArea::Create(const std::string& name, uint32_t slots,
                                                           uint64_t slot_bytes, uint32_t first_id,
                                                           uint32_t stride, std::shared_ptr<StagingBudget> budget) {
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
  a->held_.assign(slots, 0);
  a->free_.reserve(slots);
  for (uint32_t i = slots; i-- > 0;) a->free_.push_back(i);  // slot 0 on top
  a->budget_ = std::move(budget);
  if (a->budget_) a->budget_->Register(a.get());
  return a;
}

StagingArea::~StagingArea() {
  if (budget_) {
    budget_->Unregister(this);  // no take-back reaches this area after it
    budget_->Uncharge(charged_);
  }
  if (base_) ::munmap(base_, bytes_);
  if (fd_ >= 0) ::close(fd_);
}

Status StagingArea::Alloc(uint32_t n, uint64_t bytes_each, std::vector<uint32_t>* out) {
  const uint64_t each = std::min(slot_bytes_, Pages(bytes_each));
  uint64_t need = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (free_.size() < n) {
        return Status::Rejected("staging area full (" + std::to_string(free_.size()) + " of " +
                                std::to_string(slots_) + " slots free, " + std::to_string(n) + " asked)");
      }
      // The slots that would come out (the top of the stack) and the pages they lack.
      need = 0;
      for (uint32_t k = 0; k < n; ++k) {
        const uint32_t i = free_[free_.size() - 1 - k];
        need += each > held_[i] ? each - held_[i] : 0;
      }
      if (need == 0 || budget_ == nullptr || budget_->TryCharge(need)) {
        for (uint32_t k = 0; k < n; ++k) {
          const uint32_t i = free_.back();
          free_.pop_back();
          taken_[i] = 1;
          held_[i] = std::max(held_[i], each);
          out->push_back(i);
        }
        charged_ += need;
        return Status::Ok();
      }
    }
    if (attempt == 0) budget_->TakeBack(need);  // no lock of this area held
  }
  return Status::Retry("the staging memory of every client is in use (" + std::to_string(budget_->charged()) +
                       " of tiers.host.staging_bytes_total = " + std::to_string(budget_->limit()) + " bytes; " +
                       std::to_string(need) + " more asked): clients must release leases first");
}

uint64_t StagingArea::TakeBackFree(uint64_t want) {
  std::lock_guard<std::mutex> l(mu_);
  uint64_t released = 0, punched = 0;
  // From the bottom of the stack: the slots freed longest ago, which the next allocs
  // would reach last.
  for (size_t k = 0; k < free_.size() && released < want; ++k) {
    const uint32_t i = free_[k];
    if (held_[i] == 0) continue;
    if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(slot_offset(i)),
                    static_cast<off_t>(slot_bytes_)) != 0) {
      break;  // kept: the budget refuses instead
    }
    released += held_[i];
    ++punched;
    charged_ -= held_[i];
    held_[i] = 0;
  }
  if (released > 0) {
    budget_->Uncharge(released);
    budget_->taken_back_.fetch_add(punched, std::memory_order_relaxed);
  }
  return released;
}

uint64_t StagingArea::charged() const {
  std::lock_guard<std::mutex> l(mu_);
  return charged_;
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
