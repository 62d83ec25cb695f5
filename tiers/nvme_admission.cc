#include "tiers/nvme_admission.h"

#include <algorithm>

namespace kvtier::tiers {

bool OfferMemory::Likely(const BlockId& id, uint32_t uses) {
  if (offered_.contains(id)) return true;
  offered_.insert(id);
  order_.push_back(id);
  while (order_.size() > capacity_) {
    offered_.erase(order_.front());
    order_.pop_front();
  }
  return uses >= 2;
}

NvmeAdmission::NvmeAdmission(Admission mode, uint64_t daily_budget_bytes, size_t ghost_capacity,
                             Clock::time_point now)
    : mode_(mode), budget_(daily_budget_bytes), ghost_capacity_(std::max<size_t>(1024, ghost_capacity)),
      window_start_(now), offers_(ghost_capacity_) {}

void NvmeAdmission::Configure(Admission mode, uint64_t daily_budget_bytes) {
  mode_ = mode;
  budget_ = daily_budget_bytes;
}

bool NvmeAdmission::Admit(const BlockId& id, uint64_t bytes, uint32_t uses, bool force, Clock::time_point now) {
  // reuse records every unforced offer, refused or not, as ReuseAdmission does.
  const bool likely = force || mode_ != Admission::kReuse || offers_.Likely(id, uses);
  if (budget_ > 0) {
    constexpr auto kWindow = std::chrono::hours(24);
    if (now - window_start_ >= kWindow) {
      window_start_ = now;
      budget_used_ = 0;
    }
    const double spent = static_cast<double>(budget_used_) / static_cast<double>(budget_);
    const double elapsed = std::chrono::duration<double>(now - window_start_) / kWindow;
    if (budget_used_ + bytes > budget_ || !ReusePaceAdmits(likely, spent, elapsed)) {
      ++rejects_;
      return false;
    }
  }
  if (!force && mode_ == Admission::kSecondHit && uses < 2) {
    if (ghost_set_.erase(id) == 0) {  // first time offered: remember it, refuse it
      ghost_set_.insert(id);
      ghost_.push_back(id);
      while (ghost_.size() > ghost_capacity_) {
        ghost_set_.erase(ghost_.front());
        ghost_.pop_front();
      }
      ++rejects_;
      return false;
    }
  }
  budget_used_ += bytes;
  return true;
}

void NvmeAdmission::Refund(uint64_t bytes) { budget_used_ -= std::min(budget_used_, bytes); }

bool ClientWriteBudget::Fits(uint64_t writer, uint64_t bytes, Clock::time_point now) {
  if (budget_ == 0 || writer == 0) return true;
  if (now - window_start_ >= std::chrono::hours(24)) {
    window_start_ = now;
    used_.clear();
  }
  if (used(writer) + bytes > budget_) {
    ++rejects_;
    return false;
  }
  return true;
}

void ClientWriteBudget::Charge(uint64_t writer, uint64_t bytes) {
  if (budget_ == 0 || writer == 0) return;
  used_[writer] += bytes;
}

void ClientWriteBudget::Refund(uint64_t writer, uint64_t bytes) {
  auto it = used_.find(writer);
  if (it == used_.end()) return;
  it->second -= std::min(it->second, bytes);
}

std::string ReuseAdmission::Options::Check() const {
  if (!(window_s > 0.0)) return "window_s must be > 0";
  if (memory < 1024) return "memory must be >= 1024";
  return "";
}

ReuseAdmission::ReuseAdmission(const Options& o, double now_s) : o_(o), window_start_(now_s), offers_(o.memory) {}

bool ReuseAdmission::Admit(const BlockId& id, uint64_t bytes, uint32_t uses, double now_s) {
  const bool likely = offers_.Likely(id, uses);
  if (o_.budget_bytes > 0) {
    while (now_s - window_start_ >= o_.window_s) {
      window_start_ += o_.window_s;
      budget_used_ = 0;
    }
    const double spent = static_cast<double>(budget_used_) / static_cast<double>(o_.budget_bytes);
    const double elapsed = (now_s - window_start_) / o_.window_s;
    if (!ReusePaceAdmits(likely, spent, elapsed) || budget_used_ + bytes > o_.budget_bytes) {
      ++rejects_;
      return false;
    }
  }
  budget_used_ += bytes;
  return true;
}

}  // namespace kvtier::tiers
