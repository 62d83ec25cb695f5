#include "tiers/tier_state.h"

#include "tiers/hbm/hbm_pool.h"
#include "tiers/host/host_pool.h"
#include "tiers/nvme/nvme_store.h"

namespace kvtier::tiers {

void TierState::Init(Tier tier, const TierOptions* opts, HbmPool* hbm, HostPool* host, NvmeStore* nvme) {
  tier_ = tier;
  opts_ = opts;
  hbm_ = hbm;
  host_ = host;
  nvme_ = nvme;
  slots.assign(tier == Tier::kNvme ? 0 : total(), SlotInfo{});
  policy = CountingPolicy::Make(*opts, total(), groups);
}

uint32_t TierState::total() const {
  if (hbm_) return hbm_->slots();
  if (host_) return host_->slots();
  if (nvme_) return nvme_->records_total();
  return 0;
}

uint32_t TierState::used() const {
  if (hbm_) return hbm_->used();
  if (host_) return host_->used();
  if (nvme_) return nvme_->records_total() - nvme_->free_records();
  return 0;
}

std::optional<uint32_t> TierState::Alloc() {
  if (hbm_) return hbm_->Alloc();
  if (host_) return host_->Alloc();
  return std::nullopt;  // NVMe records are the store's to place
}

void TierState::Free(uint32_t slot) {
  if (hbm_) (void)hbm_->Free(slot);
  if (host_) (void)host_->Free(slot);
  if (slot < slots.size()) slots[slot] = SlotInfo{};
}

}  // namespace kvtier::tiers
