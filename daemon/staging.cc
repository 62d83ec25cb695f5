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

StatusOr<std::unique_ptr<StagingArea>> StagingArea::Create(const std::string& name, uint32_t units,
                                                           uint64_t unit_bytes, uint32_t slots, uint32_t first_id,
                                                           std::shared_ptr<StagingBudget> budget) {
  if (units == 0 || slots == 0 || unit_bytes == 0 || unit_bytes % 4096 != 0 || unit_bytes / 4096 > UINT32_MAX ||
      uint64_t{first_id} + units > UINT32_MAX) {
    return Status::Invalid("staging area: " + std::to_string(units) + " units of " + std::to_string(unit_bytes) +
                           " bytes");
  }
  std::unique_ptr<StagingArea> a(new StagingArea());
  a->units_ = units;
  a->unit_bytes_ = unit_bytes;
  a->slots_ = slots;
  a->first_id_ = first_id;
  a->bytes_ = a->slot_offset(units);
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
  void* m = ::mmap(nullptr, a->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, a->fd_, 0);
  if (m == MAP_FAILED) return Status::IoError(std::string("mmap staging area: ") + std::strerror(errno));
  a->base_ = static_cast<uint8_t*>(m);
  a->held_.assign(units, 0);
  a->free_.emplace(0, units);
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

Status StagingArea::Alloc(uint32_t n, uint64_t bytes_each, uint64_t slot_bytes, std::vector<uint32_t>* out) {
  if (slot_bytes == 0 || slot_bytes % unit_bytes_ != 0 || slot_bytes > bytes_) {
    return Status::Invalid("staging slot of " + std::to_string(slot_bytes) + " bytes in an area of " +
                           std::to_string(bytes_) + " bytes in units of " + std::to_string(unit_bytes_));
  }
  const auto len = static_cast<uint32_t>(slot_bytes / unit_bytes_);
  const uint64_t each = std::min(slot_bytes, Pages(bytes_each));
  // The pages unit k of a slot holds for `each` bytes (whole pages).
  auto want = [&](uint32_t k) -> uint32_t {
    const uint64_t at = uint64_t{k} * unit_bytes_;
    return static_cast<uint32_t>(at >= each ? 0 : std::min(unit_bytes_, each - at) / 4096);
  };
  uint64_t need = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {
    {
      std::lock_guard<std::mutex> l(mu_);
      // The runs that would come out: first-fit, n slots (a run may hold several).
      std::vector<uint32_t> starts;
      starts.reserve(n);
      for (auto it = free_.begin(); it != free_.end() && starts.size() < n; ++it) {
        for (uint32_t off = 0; off + len <= it->second && starts.size() < n; off += len) {
          starts.push_back(it->first + off);
        }
      }
      if (starts.size() < n || taken_.size() + n > slots_) {
        return Status::Rejected("staging area full (" + std::to_string(taken_.size()) + " slots of " +
                                std::to_string(used_bytes_) + " bytes taken in an area of " +
                                std::to_string(bytes_) + " bytes, at most " + std::to_string(slots_) + " slots; " +
                                std::to_string(n) + " of " + std::to_string(slot_bytes) + " bytes asked)");
      }
      need = 0;
      for (uint32_t s : starts) {
        for (uint32_t k = 0; k < len; ++k) need += want(k) > held_[s + k] ? uint64_t{4096} * (want(k) - held_[s + k]) : 0;
      }
      if (need == 0 || budget_ == nullptr || budget_->TryCharge(need)) {
        for (uint32_t s : starts) {
          // Cut [s, s + len) out of the free run holding it.
          auto it = std::prev(free_.upper_bound(s));
          const uint32_t run = it->first, run_len = it->second;
          free_.erase(it);
          if (s > run) free_.emplace(run, s - run);
          if (s + len < run + run_len) free_.emplace(s + len, run + run_len - (s + len));
          taken_.emplace(s, len);
          for (uint32_t k = 0; k < len; ++k) held_[s + k] = std::max(held_[s + k], want(k));
          used_bytes_ += slot_bytes;
          out->push_back(s);
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
  // From the highest free run down: first-fit reaches those last.
  for (auto it = free_.rbegin(); it != free_.rend() && released < want; ++it) {
    uint64_t run_held = 0;
    for (uint32_t k = 0; k < it->second; ++k) run_held += uint64_t{4096} * held_[it->first + k];
    if (run_held == 0) continue;
    if (::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(slot_offset(it->first)),
                    static_cast<off_t>(uint64_t{it->second} * unit_bytes_)) != 0) {
      break;  // kept: the budget refuses instead
    }
    for (uint32_t k = 0; k < it->second; ++k) held_[it->first + k] = 0;
    released += run_held;
    ++punched;
    charged_ -= run_held;
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

void StagingArea::FreeLocked(uint32_t i) {
  auto t = taken_.find(i);
  if (t == taken_.end()) return;  // never double-listed
  uint32_t s = i, len = t->second;
  used_bytes_ -= uint64_t{len} * unit_bytes_;
  taken_.erase(t);
  // Join the free neighbours.
  auto next = free_.lower_bound(s);
  if (next != free_.end() && next->first == s + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == s) {
      s = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_.emplace(s, len);
}

void StagingArea::Free(uint32_t i) {
  std::lock_guard<std::mutex> l(mu_);
  FreeLocked(i);
}

void StagingArea::Free(std::span<const uint32_t> slots) {
  std::lock_guard<std::mutex> l(mu_);
  for (uint32_t i : slots) FreeLocked(i);
}

uint32_t StagingArea::used() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<uint32_t>(taken_.size());
}

uint64_t StagingArea::used_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return used_bytes_;
}

}  // namespace kvtier::daemon
