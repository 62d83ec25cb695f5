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
  // HBM and host slot ids run over their arena's granules (tiers/slab_allocator.h).
  slots.assign(hbm ? hbm->id_space() : host ? host->id_space() : 0, SlotInfo{});
  policy = CountingPolicy::Make(*opts, BlockCapacity(), groups);
}

uint64_t TierState::BlockCapacity() const {
  if (!present() || num_classes() == 1) return total();
  uint64_t in_use = 0, weighted = 0;
  for (int c = 0; c < num_classes(); ++c) {
    const uint64_t n = used(c);
    in_use += n;
    weighted += n * most(c);
  }
  return in_use == 0 ? total() : std::max<uint64_t>(1, weighted / in_use);
}

void TierState::FollowCapacity() {
  if (!policy || num_classes() == 1) return;
  const uint64_t now = BlockCapacity(), was = policy->capacity();
  const uint64_t diff = now > was ? now - was : was - now;
  if (diff * 64 > was) policy->SetCapacity(now);
}

// f(pool) on the tier's slabs (HbmPool, HostPool or NvmeStore, which share these names);
// `none` for an absent tier.
#define KVTIER_ON_POOL_(call, none) (hbm_ ? hbm_->call : host_ ? host_->call : nvme_ ? nvme_->call : (none))

uint32_t TierState::total() const {
  if (nvme_) return nvme_->records_total();
  return hbm_ ? hbm_->slots() : host_ ? host_->slots() : 0u;
}

uint32_t TierState::used() const { return KVTIER_ON_POOL_(used(), 0u); }

int TierState::num_classes() const { return KVTIER_ON_POOL_(num_classes(), 1); }

int TierState::ClassOf(uint64_t block_bytes) const {
  const int c = KVTIER_ON_POOL_(ClassFor(block_bytes), 0);
  return c < 0 ? 0 : c;  // registration refuses contracts no class holds
}

uint32_t TierState::total(int cls) const {
  if (!present()) return total();
  return KVTIER_ON_POOL_(capacity(cls), 0u);
}

uint32_t TierState::most(int cls) const {
  if (!present()) return total();
  return KVTIER_ON_POOL_(most(cls), 0u);
}

uint32_t TierState::free(int cls) const {
  if (!present()) return free();
  return KVTIER_ON_POOL_(free_count(cls), 0u);
}

uint32_t TierState::used(int cls) const {
  if (!present()) return used();
  return KVTIER_ON_POOL_(used(cls), 0u);
}

uint32_t TierState::free(int cls, int part) const {
  if (host_) return host_->free_count(cls, part);
  return free(cls);
}

uint64_t TierState::used_bytes() const { return KVTIER_ON_POOL_(used_bytes(), uint64_t{0}); }
uint64_t TierState::arena_bytes() const { return KVTIER_ON_POOL_(arena_bytes(), uint64_t{0}); }
uint64_t TierState::class_bytes(int cls) const { return KVTIER_ON_POOL_(class_bytes(cls), uint64_t{0}); }
uint32_t TierState::num_slabs() const { return KVTIER_ON_POOL_(num_slabs(), 0u); }
uint32_t TierState::slabs(int cls) const { return KVTIER_ON_POOL_(slabs(cls), 0u); }
uint32_t TierState::slots_per_slab(int cls) const { return KVTIER_ON_POOL_(slots_per_slab(cls), 0u); }
uint32_t TierState::SlabOf(uint32_t slot) const { return KVTIER_ON_POOL_(SlabOf(slot), 0u); }
int TierState::SlabClass(uint32_t slab) const { return KVTIER_ON_POOL_(SlabClass(slab), -1); }
bool TierState::Draining(uint32_t slab) const { return KVTIER_ON_POOL_(Draining(slab), false); }
std::vector<uint32_t> TierState::TakenSlots(uint32_t slab) const {
  return KVTIER_ON_POOL_(TakenSlots(slab), std::vector<uint32_t>{});
}
StatusOr<std::vector<uint32_t>> TierState::BeginMove(uint32_t slab, int to) {
  if (hbm_) return hbm_->BeginMove(slab, to);
  if (host_) return host_->BeginMove(slab, to);
  if (nvme_) return nvme_->BeginMove(slab, to);
  return Status::Unsupported("tier without slabs");
}

#undef KVTIER_ON_POOL_

std::optional<uint32_t> TierState::Alloc(int cls, int part) {
  if (hbm_) return hbm_->Alloc(cls);
  if (host_) return host_->Alloc(cls, part);
  return std::nullopt;  // NVMe records are the store's to place
}

void TierState::Free(uint32_t slot) {
  if (hbm_) (void)hbm_->Free(slot);
  if (host_) (void)host_->Free(slot);
  if (slot < slots.size()) slots[slot] = SlotInfo{};
}

}  // namespace kvtier::tiers
