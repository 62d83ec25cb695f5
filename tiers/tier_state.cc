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
  // Host slot ids run over the arena's granules (tiers/slab_allocator.h).
  slots.assign(tier == Tier::kNvme ? 0 : host ? host->id_space() : total(), SlotInfo{});
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

int TierState::num_classes() const { return host_ ? host_->num_classes() : 1; }

int TierState::ClassOf(uint64_t block_bytes) const {
  if (!host_) return 0;
  const int c = host_->ClassFor(block_bytes);
  return c < 0 ? 0 : c;  // registration refuses contracts no class holds
}

uint32_t TierState::total(int cls) const {
  if (host_) return host_->capacity(cls);
  return total();
}

uint32_t TierState::most(int cls) const {
  if (host_) return host_->most(cls);
  return total();
}

uint32_t TierState::free(int cls) const {
  if (host_) return host_->free_count(cls);
  return free();
}

uint32_t TierState::used(int cls) const {
  if (host_) return host_->used(cls);
  return used();
}

uint32_t TierState::free(int cls, int part) const {
  if (host_) return host_->free_count(cls, part);
  return free(cls);
}

std::optional<uint32_t> TierState::Alloc(int cls, int part) {
  if (hbm_) return hbm_->Alloc();
  if (host_) return host_->Alloc(cls, part);
  return std::nullopt;  // NVMe records are the store's to place
}

void TierState::Free(uint32_t slot) {
  if (hbm_) (void)hbm_->Free(slot);
  if (host_) (void)host_->Free(slot);
  if (slot < slots.size()) slots[slot] = SlotInfo{};
}

}  // namespace kvtier::tiers
