// TierManagerImpl: opening the tiers, contracts, lookup, the client's alloc / commit /
// unpin, settings and stats. The class and the map of its files: tier_manager_impl.h.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <random>

#include <cstring>

#include "common/cuda_env.h"
#include "formats/record.h"
#include "tiers/tier_manager_impl.h"

namespace kvtier::tiers {

namespace {
uint64_t RandomSeed() {
  std::random_device rd;
  const uint64_t s = (uint64_t{rd()} << 32) ^ rd();
  return s != 0 ? s : 0x9E3779B97F4A7C15ull;
}
}  // namespace

namespace {
std::atomic<bool> g_trace_copies{false};
}  // namespace

bool TraceCopies() { return g_trace_copies.load(std::memory_order_relaxed); }

TierManagerImpl::TierManagerImpl(const TierManagerOptions& o)
    : opts_(o),
      slot_bytes_(o.slot_bytes),
      classes_at_registration_(o.classes_at_registration),
      blocks_(0, BlockIndexHash{o.index_seed != 0 ? o.index_seed : RandomSeed()}) {}

StatusOr<std::unique_ptr<TierManager>> TierManager::Open(const TierManagerOptions& opts) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  g_trace_copies.store(opts.trace_copies, std::memory_order_relaxed);
  auto tm = std::make_unique<TierManagerImpl>(opts);
  KVTIER_RETURN_IF_ERROR(tm->Init());
  return std::unique_ptr<TierManager>(std::move(tm));
}

Status TierManagerImpl::Init() {
  HostPoolOptions ho;
  ho.slot_bytes = opts_.slot_bytes;
  ho.slots = static_cast<uint32_t>(opts_.host.capacity_bytes / opts_.slot_bytes);
  ho.classes = opts_.slot_classes;
  ho.slab_bytes = opts_.slab_bytes;
  ho.arena_bytes = opts_.host.capacity_bytes;
  if (classes_at_registration_) {
    // No class yet; the granule from the arena's size alone, slabs that hold the largest
    // block (an arena smaller than that is one slab, and blocks are limited to it).
    const uint64_t g = AutoGranule(opts_.host.capacity_bytes);
    ho.classes.clear();
    ho.classes_at_registration = true;
    ho.slab_bytes = AutoSlabBytes(opts_.host.capacity_bytes, opts_.slot_bytes, g);
    ho.slot_bytes = std::min(opts_.slot_bytes, ho.slab_bytes);
  }
  if (opts_.host_parts && quotas()) {
    // One part per group with a host share, in group order; the rest is the common pool.
    part_of_group_.assign(opts_.groups.size(), -1);
    for (size_t g = 0; g < opts_.groups.size(); ++g) {
      if (opts_.groups[g].share[kS] <= 0) continue;
      part_of_group_[g] = static_cast<int>(ho.part_shares.size());
      ho.part_shares.push_back(opts_.groups[g].share[kS]);
    }
  }
  auto host = HostPool::Create(ho);
  if (!host.ok()) return host.status();
  host_ = std::move(host.value());
  host_geometry_.granule = host_->granule();
  host_geometry_.slab_bytes = host_->slab_bytes();
  host_geometry_.arena_bytes = host_->arena_bytes();
  host_geometry_.num_slabs = host_->num_slabs();
  // Classes made at registration are appended (MakeHostClassLocked): never a reallocation.
  host_geometry_.classes.reserve(kMaxArenaClasses);
  host_geometry_.per_slab.reserve(kMaxArenaClasses);
  host_geometry_.most.reserve(kMaxArenaClasses);
  for (int c = 0; c < host_->num_classes(); ++c) {
    host_geometry_.classes.push_back(host_->class_bytes(c));
    host_geometry_.per_slab.push_back(host_->slots_per_slab(c));
    host_geometry_.most.push_back(host_->most(c));
  }

  std::string hbm_why;
  if (opts_.hbm.capacity_bytes == 0) {
    hbm_why = "hbm capacity is 0";
  } else if (cuda::DeviceCount(&hbm_why) > 0) {
    HbmPoolOptions hb;
    hb.device = opts_.cuda_device;
    hb.slot_bytes = opts_.slot_bytes;
    hb.slots = static_cast<uint32_t>(opts_.hbm.capacity_bytes / opts_.slot_bytes);
    // The host tier's classes and slabs, when the HBM arena holds a slab of them; with
    // classes made at registration, the HBM arena's own granule and slabs.
    if (classes_at_registration_) {
      hb.classes_at_registration = true;
      hb.arena_bytes = opts_.hbm.capacity_bytes;
      hb.slab_bytes = AutoSlabBytes(hb.arena_bytes, opts_.slot_bytes, AutoGranule(hb.arena_bytes));
      hb.slot_bytes = std::min(opts_.slot_bytes, hb.slab_bytes);
    } else if (!opts_.slot_classes.empty() && opts_.hbm.capacity_bytes >= opts_.slab_bytes) {
      hb.classes = opts_.slot_classes;
      hb.slab_bytes = opts_.slab_bytes;
      hb.arena_bytes = opts_.hbm.capacity_bytes;
    }
    hb.copy = opts_.hbm_copy;
    hb.streams = opts_.hbm_copy_streams;
    hb.trace_copies = opts_.trace_copies;
    auto hbm = HbmPool::Create(hb);
    if (!hbm.ok()) return hbm.status();  // a GPU is there but unusable: say so at start
    hbm_ = std::move(hbm.value());
    if (host_->num_parts() > 0) {  // each part is registered with CUDA on its own
      std::vector<uintptr_t> breaks;
      for (int p = 1; p <= host_->num_parts(); ++p) {
        breaks.push_back(reinterpret_cast<uintptr_t>(host_->base() + host_->part_offset(p)));
      }
      hbm_->SetHostBreaks(std::move(breaks));
    }
    hbm_geometry_.granule = hbm_->granule();
    hbm_geometry_.slab_bytes = hbm_->slab_bytes();
    hbm_geometry_.arena_bytes = hbm_->arena_bytes();
    hbm_geometry_.num_slabs = hbm_->num_slabs();
    hbm_geometry_.classes.reserve(kMaxArenaClasses);  // MakeClassesLocked appends
    hbm_geometry_.per_slab.reserve(kMaxArenaClasses);
    hbm_geometry_.most.reserve(kMaxArenaClasses);
    for (int c = 0; c < hbm_->num_classes(); ++c) {
      hbm_geometry_.classes.push_back(hbm_->class_bytes(c));
      hbm_geometry_.per_slab.push_back(hbm_->slots_per_slab(c));
      hbm_geometry_.most.push_back(hbm_->most(c));
    }
  }

  if (opts_.nvme.tier.capacity_bytes > 0) {
    NvmeStoreOptions no;
    no.dir = opts_.nvme.dir;
    no.capacity_bytes = opts_.nvme.tier.capacity_bytes;
    no.slot_bytes = opts_.slot_bytes;
    // The host tier's classes, one record class each, when the tier holds a slab of them;
    // else one class of slot_bytes.
    if (classes_at_registration_) {
      no.records_by_size = true;  // slabs: AutoSlabBytes(capacity, slot_bytes + 4096)
      no.slab_bytes = 0;
      // The largest record the tier holds caps the blocks it takes, as a slab caps the host's
      // and HBM's: a tier smaller than slot_bytes + 4 KiB starts, and a contract whose block
      // it cannot hold is refused at registration (CheckRegistrable), by name.
      const uint64_t whole = no.capacity_bytes / 4096 * 4096;
      if (whole >= 2 * 4096 && whole - 4096 < no.slot_bytes) no.slot_bytes = whole - 4096;
    } else if (host_->num_classes() > 1 && opts_.nvme.tier.capacity_bytes >= opts_.nvme.slab_bytes) {
      for (int c = 0; c < host_->num_classes(); ++c) no.classes.push_back(host_->class_bytes(c));
      no.slab_bytes = opts_.nvme.slab_bytes;
    }
    no.queue_depth = opts_.nvme.queue_depth;
    no.verify_on_restart = opts_.nvme.verify_on_restart;
    // One fixed region per part (each its own mapping).
    for (int p = 0; p <= host_->num_parts(); ++p) {
      if (host_->part_bytes(p) > 0) no.fixed.push_back({host_->base() + host_->part_offset(p), host_->part_bytes(p)});
    }
    auto st = NvmeStore::Open(no);
    if (!st.ok()) return st.status();
    nvme_ = std::move(st.value());
  }

  if (quotas()) {
    for (TierState& ts : tiers_) ts.groups = &group_of_;
    group_evictions_.assign(opts_.groups.size(), {0, 0, 0});
  }
  T(kH).Init(Tier::kHbm, &opts_.hbm, hbm_.get(), nullptr, nullptr);
  if (hbm_) hbm_client_.assign(hbm_->id_space(), 0);
  T(kS).Init(Tier::kHost, &opts_.host, nullptr, host_.get(), nullptr);
  T(kN).Init(Tier::kNvme, &opts_.nvme.tier, nullptr, nullptr, nvme_.get());
  admission_ = std::make_unique<NvmeAdmission>(opts_.nvme.admission, opts_.nvme.daily_write_budget_bytes,
                                               T(kN).total());
  client_budget_ = std::make_unique<ClientWriteBudget>(ClientBudgetBytes(opts_.nvme));
  if (nvme_) {
    auto ents = nvme_->Entries();
    std::sort(ents.begin(), ents.end(), [](const NvmeEntry& a, const NvmeEntry& b) { return a.sequence < b.sequence; });
    for (const NvmeEntry& e : ents) {
      auto b = std::make_unique<Block>();
      b->id = e.id;
      b->parent = e.parent;
      b->bytes = e.payload_len;
      b->nvme = true;
      b->uses = e.hits;
      T(kN).policy->Insert(e.id, BlockId{e.id.contract, e.parent}, T(kN).BlockWeight(e.payload_len));
      InsertBlockLocked(std::move(b));
    }
  }
  std::string host_classes;
  for (int c = 0; c < host_->num_classes(); ++c) {
    host_classes += fmt::format("{}{} B", host_classes.empty() ? "" : ", ", host_->class_bytes(c));
  }
  host_classes = classes_at_registration_
                     ? fmt::format("classes made at registration on a {} B granule in {} slabs of {} B",
                                   host_->granule(), host_->num_slabs(), host_->slab_bytes())
                 : host_->num_classes() == 1
                     ? fmt::format("{} each", host_classes)
                     : fmt::format("classes {} in {} slabs of {} B", host_classes, host_->num_slabs(), host_->slab_bytes());
  spdlog::info("kvtier tiers: hbm {} | host {} slots ({}; {}) | nvme {}",
               hbm_ ? fmt::format("{} slots on device {} ({}; {})", hbm_->slots(), opts_.cuda_device,
                                  cuda::DeviceName(opts_.cuda_device),
                                  hbm_->num_classes() == 1 ? fmt::format("{} B each", hbm_->slot_bytes())
                                                           : fmt::format("the host's classes in {} slabs", hbm_->num_slabs()))
                    : fmt::format("absent ({})", hbm_why),
               host_->slots(), host_classes,
               host_->cuda_registered() ? "cudaHostRegister'ed" : "not CUDA-registered",
               nvme_ ? fmt::format("{} under {} ({} blocks loaded)", nvme_->geometry().ToString(),
                                   opts_.nvme.dir, blocks_.size())
                     : std::string("absent"));
  if (opts_.remote.enabled()) {
    auto r = remote::RemoteTier::Open(opts_.remote);
    if (!r.ok()) return r.status();
    remote_ = std::make_unique<RemoteStage>(std::move(r.value()), &opts_.remote, static_cast<StagingHost*>(this));
    const char* w[] = {"off", "on-demote", "write-through"};
    spdlog::info("kvtier tiers: remote Redis Cluster via {} ({} seeds, write {}, timeouts {}/{} ms)",
                 opts_.remote.nodes[0], opts_.remote.nodes.size(), w[static_cast<int>(opts_.remote.write)],
                 opts_.remote.connect_timeout_ms, opts_.remote.command_timeout_ms);
    remote_->Start();
  }
  mover_ = std::thread([this] { MoverLoop(); });
  return Status::Ok();
}

TierManagerImpl::~TierManagerImpl() {
  if (remote_) remote_->Stop();
  if (mover_.joinable()) {
    Drain();
    {
      std::lock_guard<IndexMutex> l(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    mover_.join();
  }
}

SlotFit TierManagerImpl::Fit(const ScaleContract& c) const {
  SlotFit f;
  if (c.slot_bytes() > slot_bytes_) return f;  // HBM and NVMe slots are slot_bytes
  if (classes_at_registration_) {
    // The class of its block rounded up to the granule: made when it registers (-1 until
    // then, with the size it will have).
    const uint64_t g = host_->granule(), slot = (c.slot_bytes() + g - 1) / g * g;
    if (slot > host_->slab_bytes() || (hbm_ && c.slot_bytes() > hbm_->slab_bytes()) ||
        (nvme_ && c.block_bytes() > nvme_->slot_bytes())) {
      return f;
    }
    const int cls = host_->ClassFor(slot);
    f.cls = cls >= 0 && host_->class_bytes(cls) == slot ? cls : -1;
    f.slot_bytes = slot;
    f.fill = static_cast<double>(c.block_bytes()) / static_cast<double>(slot);
    return f;
  }
  f.cls = host_->ClassFor(c.slot_bytes());
  if (f.cls < 0) return f;
  f.slot_bytes = host_->class_bytes(f.cls);
  f.fill = static_cast<double>(c.block_bytes()) / static_cast<double>(f.slot_bytes);
  return f;
}

uint64_t TierManagerImpl::ContractSlotBytes(uint64_t contract_id, Tier t) const {
  std::lock_guard<IndexMutex> l(mu_);
  auto it = contracts_.find(contract_id);
  if (it == contracts_.end()) return 0;
  // The class each tier gives the contract's blocks (TierState::ClassOf: the smallest
  // that holds them, its own when classes are made at registration).
  const uint64_t bytes = it->second->block_bytes();
  if (t == Tier::kHost) {
    const int c = host_->ClassFor(bytes);
    return c < 0 ? 0 : host_->class_bytes(c);
  }
  if (t == Tier::kHbm && hbm_) {
    const int c = hbm_->ClassFor(bytes);
    return c < 0 ? 0 : hbm_->class_bytes(c);
  }
  return 0;
}

int TierManagerImpl::HostSlotClass(uint32_t slot) const {
  const uint64_t size = host_->slot_size(slot);
  return size == 0 ? -1 : host_->ClassFor(size);
}

SlotFit TierManagerImpl::FitOf(uint64_t contract_id) const {
  std::lock_guard<IndexMutex> l(mu_);
  auto it = contracts_.find(contract_id);
  return it == contracts_.end() ? SlotFit{} : Fit(*it->second);
}

// A contract kvtier can hold: valid, and its block fits a slot.
Status TierManagerImpl::CheckRegistrable(const ScaleContract& c) const {
  KVTIER_RETURN_IF_ERROR(c.Validate());
  if (classes_at_registration_) {
    if (Fit(c).slot_bytes == 0) {
      const uint64_t slabs = std::min<uint64_t>(host_->slab_bytes(), hbm_ ? hbm_->slab_bytes() : slot_bytes_);
      const uint64_t nvme = nvme_ ? nvme_->slot_bytes() : slot_bytes_;
      const uint64_t limit = std::min<uint64_t>({slot_bytes_, slabs, nvme});
      return Status::Unsupported("contract block of " + std::to_string(c.block_bytes()) +
                                 " bytes is larger than the largest block this daemon holds (" +
                                 std::to_string(limit) + " bytes: tiers.slot_bytes" +
                                 (slabs < slot_bytes_ && slabs == limit ? ", and a tier's slab" : "") +
                                 (nvme < slot_bytes_ && nvme == limit ? ", and the NVMe tier's capacity, less a 4KiB "
                                                                        "record header"
                                                                      : "") +
                                 ")");
    }
    return Status::Ok();
  }
  if (Fit(c).cls < 0) {
    const uint64_t want = (uint64_t{c.slot_bytes()} + 4095) / 4096 * 4096;
    return Status::Unsupported("contract block of " + std::to_string(c.block_bytes()) +
                               " bytes does not fit a slot of " + std::to_string(slot_bytes_) +
                               " (tiers.slot_bytes); a daemon with tiers.slot_bytes of at least " +
                               std::to_string(want) + " (" + std::to_string(want / 1024) +
                               "KiB) holds it");
  }
  return Status::Ok();
}

Status TierManagerImpl::MakeClassesLocked(const ScaleContract& c) {
  if (!classes_at_registration_) return Status::Ok();
  auto h = host_->AddClass(c.slot_bytes());
  if (!h.ok()) return Status::Unsupported(h.status().message());
  std::lock_guard<std::mutex> g(geometry_mu_);
  if (static_cast<size_t>(*h) == host_geometry_.classes.size()) {  // a new one
    host_geometry_.classes.push_back(host_->class_bytes(*h));
    host_geometry_.per_slab.push_back(host_->slots_per_slab(*h));
    host_geometry_.most.push_back(host_->most(*h));
  }
  if (hbm_) {
    auto b = hbm_->AddClass(c.slot_bytes());
    if (!b.ok()) return Status::Unsupported(b.status().message());
    if (static_cast<size_t>(*b) == hbm_geometry_.classes.size()) {
      hbm_geometry_.classes.push_back(hbm_->class_bytes(*b));
      hbm_geometry_.per_slab.push_back(hbm_->slots_per_slab(*b));
      hbm_geometry_.most.push_back(hbm_->most(*b));
    }
  }
  if (nvme_) {
    auto n = nvme_->AddClassFor(c.block_bytes());
    if (!n.ok()) return Status::Unsupported(n.status().message());
  }
  return Status::Ok();
}

Status TierManagerImpl::RegisterContract(const ScaleContract& c) {
  KVTIER_RETURN_IF_ERROR(CheckRegistrable(c));
  std::lock_guard<IndexMutex> l(mu_);
  KVTIER_RETURN_IF_ERROR(MakeClassesLocked(c));
  if (contracts_.emplace(c.Id(), std::make_shared<const ScaleContract>(c)).second) {
    contracts_gen_.fetch_add(1, std::memory_order_release);
  }
  return Status::Ok();
}

bool TierManagerImpl::ForgetContractIfUnused(uint64_t id) {
  std::lock_guard<IndexMutex> l(mu_);
  auto it = contracts_.find(id);
  if (it == contracts_.end()) return false;
  if (indexed_.count(id) != 0) return false;  // blocks cached or in flight between tiers
  for (const TierState& ts : tiers_) {
    if (ts.policy && ts.policy->Count(id) != 0) return false;
  }
  contracts_.erase(it);
  contracts_gen_.fetch_add(1, std::memory_order_release);
  group_of_.erase(id);
  remote_ns_.erase(id);
  return true;
}

Status TierManagerImpl::RegisterContractAs(const ScaleContract& c, uint64_t id, uint32_t group,
                                           const std::string& remote_ns) {
  if (id == 0) return Status::Invalid("RegisterContractAs: id 0");
  KVTIER_RETURN_IF_ERROR(remote::CheckKeyPart(remote_ns, "RegisterContractAs: remote namespace"));
  if (group != 0 && group >= opts_.groups.size()) {
    return Status::Invalid("RegisterContractAs: quota group " + std::to_string(group) + " unknown");
  }
  KVTIER_RETURN_IF_ERROR(CheckRegistrable(c));
  std::lock_guard<IndexMutex> l(mu_);
  auto found = contracts_.find(id);
  if (found == contracts_.end() || *found->second == c) KVTIER_RETURN_IF_ERROR(MakeClassesLocked(c));
  if (found != contracts_.end() && !(*found->second == c)) {
    return Status::Invalid("RegisterContractAs: id " + ContractIdHex(id) + " is another contract's");
  }
  if (found != contracts_.end() && RemoteNsLocked(id) != remote_ns) {
    return Status::Invalid("RegisterContractAs: contract " + ContractIdHex(id) + " is in remote namespace \"" +
                           RemoteNsLocked(id) + "\"");
  }
  const bool fresh = found == contracts_.end();
  if (fresh) {
    contracts_.emplace(id, std::make_shared<const ScaleContract>(c));
    if (!remote_ns.empty()) remote_ns_[id] = remote_ns;
    contracts_gen_.fetch_add(1, std::memory_order_release);
  }
  if (quotas()) {
    const uint32_t was = GroupOfLocked(id);
    if (was != group) {
      if (was != 0) {
        return Status::Invalid("RegisterContractAs: contract " + ContractIdHex(id) + " is in quota group " +
                               std::to_string(was));
      }
      // Blocks indexed before the group was known (a warm restart) move to it.
      group_of_[id] = group;
      for (TierState& ts : tiers_) ts.policy->Regroup(id, 0, group);
    }
  }
  return Status::Ok();
}

ContractView TierManagerImpl::View(uint64_t contract_id) const {
  ContractView v;
  std::lock_guard<IndexMutex> l(mu_);
  auto it = contracts_.find(contract_id);
  if (it == contracts_.end()) return v;
  const ScaleContract& c = *it->second;
  v.registered = true;
  v.block_bytes = c.block_bytes();
  // As ContractSlotBytes and FitOf, under the same hold.
  const int host_cls = host_->ClassFor(v.block_bytes);
  v.host_slot_bytes = host_cls < 0 ? 0 : host_->class_bytes(host_cls);
  if (hbm_) {
    const int hbm_cls = hbm_->ClassFor(v.block_bytes);
    v.hbm_slot_bytes = hbm_cls < 0 ? 0 : hbm_->class_bytes(hbm_cls);
  }
  v.fit = Fit(c);
  return v;
}

uint64_t TierManagerImpl::block_bytes(uint64_t contract_id) const {
  std::lock_guard<IndexMutex> l(mu_);
  auto it = contracts_.find(contract_id);
  return it == contracts_.end() ? 0 : it->second->block_bytes();
}

LookupResult TierManagerImpl::Lookup(uint64_t contract_id, std::span<const Key128> keys) {
  LookupResult r;
  r.tiers.resize(keys.size());
  r.hit_blocks = LookupInto(contract_id, keys, r.tiers.data(), &r.est_seconds_to_hbm);
  r.tiers.resize(r.hit_blocks);
  return r;
}

size_t TierManagerImpl::LookupInto(uint64_t contract_id, std::span<const Key128> keys, Tier* tiers_out,
                                   double* est_seconds_to_hbm) {
  *est_seconds_to_hbm = 0.0;
  std::unique_lock<IndexMutex> l(mu_);
  if (!contracts_.count(contract_id)) return 0;
  // Byte sums and the hit count stay in registers: summed into the result's fields (or a
  // double) they were a chain through memory from each block to the next.
  uint64_t host_bytes = 0, nvme_bytes = 0;
  double remote_bytes = 0;
  // On an index too big for the caches, prefetching the table a few keys ahead overlaps
  // the misses of independent probes (measured with the map this replaced: 1 M blocks
  // 38.7 -> 32.3 us; below 256 K the second hash cost more than it saved). It brings the
  // control bytes and the pointer, not the Block; kept, as neither size measured worse.
  constexpr size_t kAhead = 8;
  const size_t nk = keys.size();
  const bool prefetch = blocks_.size() >= (size_t{1} << 18);
  for (size_t i = 0; prefetch && i < std::min(nk, kAhead); ++i) blocks_.prefetch(BlockId{contract_id, keys[i]});
  size_t hit = 0;
  for (; hit < nk; ++hit) {
    if (prefetch && hit + kAhead < nk) blocks_.prefetch(BlockId{contract_id, keys[hit + kAhead]});
    const Block* b = FindLocked({contract_id, keys[hit]});
    if (!b || !b->Servable()) break;
    const Tier t = b->Fastest();
    if (t == Tier::kHost) host_bytes += b->bytes;
    if (t == Tier::kNvme) nvme_bytes += b->bytes;
    tiers_out[hit] = t;
  }
  host_bytes += nvme_bytes;
  double host_d = static_cast<double>(host_bytes);
  const double h2d = T(kH).c.write_gbps > 0 ? T(kH).c.write_gbps : opts_.host_to_hbm_gbps;
  const double nv = T(kN).c.read_gbps > 0 ? T(kN).c.read_gbps : opts_.nvme_read_gbps;
  if (remote_ && hit < keys.size()) {
    const uint64_t block = contracts_.at(contract_id)->block_bytes();
    const std::string ns = RemoteNsLocked(contract_id);
    l.unlock();  // network I/O, bounded by the remote command timeout
    const size_t n = remote_->tier().ExistsPrefix(contract_id, keys.subspan(hit), ns);
    for (size_t i = 0; i < n; ++i) tiers_out[hit + i] = Tier::kRemote;
    hit += n;
    remote_bytes = static_cast<double>(n * block);
    host_d += remote_bytes;
  }
  double rg = remote_ ? remote_->tier().stats().read_gbps : 0.0;
  if (!(rg > 0)) rg = opts_.remote.read_gbps;
  *est_seconds_to_hbm = host_d / (h2d * 1e9) + static_cast<double>(nvme_bytes) / (nv * 1e9) + remote_bytes / (rg * 1e9);
  return hit;
}

// ---- the client's writes: alloc, commit, unpin ---------------------------------------------

Status TierManagerImpl::AllocSlots(uint64_t contract_id, uint32_t n, Tier target, std::vector<SlotRef>* out) {
  if (!out) return Status::Invalid("AllocSlots: null output");
  if (target != Tier::kHbm && target != Tier::kHost) {
    return Status::Invalid(std::string("AllocSlots: tier ") + TierName(target) + " takes no direct writes");
  }
  if (!has_tier(target)) return Status::Unsupported(std::string("no ") + TierName(target) + " tier");
  std::vector<uint32_t> slots;
  {
    std::lock_guard<IndexMutex> l(mu_);
    KVTIER_RETURN_IF_ERROR(AllocLocked(contract_id, n, IndexOf(target), &slots));
  }
  for (uint32_t s : slots) out->push_back({target, s});
  return Status::Ok();
}

Status TierManagerImpl::AllocLocked(uint64_t contract_id, uint32_t n, int t, std::vector<uint32_t>* out) {
  TierState& ts = T(t);
  auto cit = contracts_.find(contract_id);
  if (cit == contracts_.end()) return Status::NotFound("AllocSlots: unknown contract " + ContractIdHex(contract_id));
  if (n == 0) return Status::Ok();
  const int cls = ts.ClassOf(cit->second->block_bytes());
  const uint32_t most = ts.most(cls);
  const std::string of_class =
      ts.num_classes() > 1 ? " of its slot class (" + std::to_string(ts.class_bytes(cls)) + " B)" : "";
  if (n > most) {
    return Status::Invalid("AllocSlots: " + std::to_string(n) + " slots asked, tier has " + std::to_string(most) + of_class);
  }
  const int64_t group = quotas() ? GroupOfLocked(contract_id) : kNoGroup;
  // With host parts: the group's part and the common pool.
  const int part = PartForLocked(t, group);
  // A starved class takes slabs from the others (TakeSlabLocked); else it evicts within
  // its class.
  while (ts.free(cls, part) < n && TakeSlabLocked(t, cls, group, n - ts.free(cls, part))) {
  }
  if (ts.free(cls, part) < n) EvictCleanLocked(t, n - ts.free(cls, part), group, cls);
  if (ts.free(cls, part) < n) {
    ts.want_free[cls] = std::max(ts.want_free[cls], n);
    ts.want_group[cls] = t == kS && !part_of_group_.empty() ? group : -1;  // host parts: its room is its own
    MaintainLocked();
    KickLocked();
    return Status::Retry(std::string(TierName(ts.tier())) + " tier full" + of_class + " (pinned or being demoted)");
  }
  ts.want_free[cls] = 0;
  ts.want_group[cls] = -1;
  for (uint32_t i = 0; i < n; ++i) {
    auto s = ts.Alloc(cls, part);
    ts.slots[*s] = SlotInfo{SlotState::kAlloc, nullptr, contract_id};
    out->push_back(*s);
  }
  if (ts.OverHigh()) KickLocked();
  return Status::Ok();
}

Status TierManagerImpl::Commit(uint64_t contract_id, SlotRef ref, const Key128& key, const Key128& parent,
                               const Committer& by, CommitOutcome* outcome) {
  if ((ref.tier != Tier::kHbm && ref.tier != Tier::kHost) || !has_tier(ref.tier)) {
    return Status::Invalid("Commit: bad tier");
  }
  Status err;
  uint64_t hash_bytes = 0;  // > 0: an HBM block to hash
  CommitOutcome o = CommitOutcome::kStored;
  {
    std::lock_guard<IndexMutex> l(mu_);
    Block* b = CommitLocked(contract_id, IndexOf(ref.tier), ref.slot, key, parent, /*pin=*/true,
                            /*from_remote=*/false, &err, &o);
    if (b != nullptr && err.ok() && b->writer == 0 && by.uid >= 0) b->writer = static_cast<uint64_t>(by.uid) + 1;
    if (b != nullptr && err.ok() && ref.tier == Tier::kHbm && b->slot[kH] == static_cast<int32_t>(ref.slot)) {
      hbm_client_[ref.slot] = by.client;
      hash_bytes = b->bytes;
    }
  }
  // Outside the lock: the block is pinned by the committing lease, so it cannot leave HBM
  // before the hash is queued, and every copy out of HBM waits for the hashes queued
  // before it (HbmPool::HashSlots).
  if (hash_bytes > 0) {
    if (Status hs = hbm_->HashSlots({{ref.slot, hash_bytes}}); !hs.ok()) {
      uint64_t held = 0;
      if (changed_log_.Allow(&held)) {
        spdlog::warn("tiers: hash of HBM slot {} not queued at commit ({}): the block is dropped when it leaves HBM "
                     "({} more such lines held back)",
                     ref.slot, hs.ToString(), held);
      }
    }
  }
  if (outcome != nullptr) *outcome = o;
  return err;
}

CommitOutcome TierManagerImpl::CompareLocked(const Block& b, uint32_t slot) const {
  const uint8_t* mine = host_->slot_ptr(slot);
  if (b.slot[kS] >= 0) {
    return std::memcmp(mine, host_->slot_ptr(static_cast<uint32_t>(b.slot[kS])), b.bytes) == 0
               ? CommitOutcome::kSame
               : CommitOutcome::kDifferent;
  }
  if (b.nvme && nvme_) {
    if (auto e = nvme_->Find(b.id)) {
      return e->payload_len == b.bytes && PayloadChecksum(std::span<const uint8_t>(mine, b.bytes)) == e->payload_xxh3
                 ? CommitOutcome::kSame
                 : CommitOutcome::kDifferent;
    }
  }
  return CommitOutcome::kUnchecked;
}

Block* TierManagerImpl::CommitLocked(uint64_t contract_id, int t, uint32_t slot, const Key128& key,
                                     const Key128& parent, bool pin, bool from_remote, Status* err,
                                     CommitOutcome* outcome) {
  TierState& ts = T(t);
  // A block that names itself as its parent would be its own prefix: refused, so that no
  // parent graph the index holds has a self-loop.
  if (parent == key) {
    *err = Status::Invalid("Commit: block " + key.ToHex() + " names itself as its parent");
    return nullptr;
  }
  if (slot >= ts.slots.size() || ts.slots[slot].state != SlotState::kAlloc) {
    *err = Status::Invalid("Commit: slot " + std::to_string(slot) + " is not an allocated, uncommitted slot");
    return nullptr;
  }
  SlotInfo& si = ts.slots[slot];
  if (si.contract != contract_id) {
    *err = Status::Invalid("Commit: slot was allocated for another contract");
    return nullptr;
  }
  auto cit = contracts_.find(contract_id);
  if (cit == contracts_.end()) {
    *err = Status::NotFound("Commit: unknown contract");
    return nullptr;
  }
  const BlockId id{contract_id, key};
  Block* b = FindLocked(id);
  if (b && b->disputed) {
    // Disputed and not yet gone: no bytes committed under the key are served until it goes,
    // whatever they are (equal to the disputed block's bytes or not).
    if (outcome != nullptr) *outcome = CommitOutcome::kDisputed;
    si.state = SlotState::kDup;  // freed by Unpin
    return b;
  }
  if (b && outcome != nullptr) {
    // A client commits a key that is cached: its bytes against the cached ones (host
    // commits; an HBM slot has no bytes on this side to compare).
    *outcome = t == kS ? CompareLocked(*b, slot) : CommitOutcome::kUnchecked;
    if (*outcome == CommitOutcome::kDifferent) {
      const OnConflict rule = opts_.on_conflict;
      const bool may_go = MayGo(*b, kAllTiers);
      if (rule != OnConflict::kKeepFirst && may_go) {
        DropBlockLocked(b);  // evicted from every tier (and from the index)
        b = FindLocked(id);  // null once erased
      } else if (rule == OnConflict::kDropDisputed && !b->disputed) {
        // It cannot go now: served no more, and dropped once its pins and moves end. Its
        // NVMe record goes now where it may, so that a restart before the drop does not
        // bring the disputed bytes back.
        b->disputed = true;
        disputed_.push_back(id);
        if (b->nvme && MayGo(*b, kN)) DropCopyLocked(kN, b, false);
      }
      if (rule != OnConflict::kReplace || !may_go) {
        si.state = SlotState::kDup;  // the new bytes are discarded (freed by Unpin)
        return b;
      }
      // kReplace: the new bytes become the block below, as for a key not cached.
      *outcome = CommitOutcome::kReplaced;
    }
  }
  if (b && (b->slot[t] >= 0 || b->promo[t])) {
    si.state = SlotState::kDup;  // equal bytes already cached here: keep the old block
    return b;
  }
  if (!b) {
    auto nb = std::make_unique<Block>();
    nb->id = id;
    nb->parent = parent;
    nb->bytes = cit->second->block_bytes();
    b = nb.get();
    InsertBlockLocked(std::move(nb));
  }
  b->uses++;
  b->slot[t] = static_cast<int32_t>(slot);
  if (pin && b->pins[t]++ == 0) ++ts.pinned;
  si = SlotInfo{SlotState::kBlock, b, 0};
  ts.policy->Insert(id, BlockId{contract_id, b->parent}, ts.BlockWeight(b->bytes));
  if (from_remote) b->remote = true;  // never written back
  if (t == kS && remote_ && remote_->write_through()) QueueRemoteWriteLocked(b);
  if (ts.OverHigh()) KickLocked();
  return b;
}

// ---- settings and stats -------------------------------------------------------------------

Status TierManagerImpl::Reconfigure(const TierManagerOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  if (o.slot_bytes != slot_bytes_ || o.slot_classes != opts_.slot_classes ||
      o.classes_at_registration != classes_at_registration_ ||
      o.slab_bytes != opts_.slab_bytes || o.hbm.capacity_bytes != opts_.hbm.capacity_bytes ||
      o.host.capacity_bytes != opts_.host.capacity_bytes ||
      o.nvme.tier.capacity_bytes != opts_.nvme.tier.capacity_bytes || o.nvme.dir != opts_.nvme.dir ||
      o.cuda_device != opts_.cuda_device || o.nvme.queue_depth != opts_.nvme.queue_depth ||
      o.hbm_copy != opts_.hbm_copy || o.hbm_copy_streams != opts_.hbm_copy_streams) {
    return Status::Invalid(
        "Reconfigure: sizes, folders, device, queue depth and HBM copy method cannot change at run time");
  }
  if (!o.remote.SameConnection(opts_.remote)) {
    return Status::Invalid(
        "Reconfigure: the remote tier's nodes, timeouts, pool, credentials, TLS and key prefix cannot change at run "
        "time");
  }
  bool groups_differ = o.groups.size() != opts_.groups.size();
  for (size_t g = 0; !groups_differ && g < o.groups.size(); ++g) {
    for (int t = 0; t < 3; ++t) groups_differ |= o.groups[g].share[t] != opts_.groups[g].share[t];
  }
  if (groups_differ) return Status::Invalid("Reconfigure: the quota groups cannot change at run time");
  g_trace_copies.store(o.trace_copies, std::memory_order_relaxed);
  std::lock_guard<IndexMutex> l(mu_);
  const TierOptions old[3] = {T(kH).opts(), T(kS).opts(), T(kN).opts()};
  opts_ = o;  // the tier states and the remote stage read their settings from here
  admission_->Configure(o.nvme.admission, o.nvme.daily_write_budget_bytes);
  client_budget_->Configure(ClientBudgetBytes(o.nvme));
  for (TierState& ts : tiers_) {
    const TierOptions& was = old[ts.index()];
    if (ts.opts().policy != was.policy || !(ts.opts().policy_options == was.policy_options)) ts.ResetPolicy(blocks_);
  }
  KickLocked();
  return Status::Ok();
}

std::vector<GroupStats> TierManagerImpl::GroupStatsAll() const {
  std::vector<GroupStats> out(opts_.groups.size());
  std::lock_guard<IndexMutex> l(mu_);
  for (size_t g = 0; g < out.size(); ++g) {
    for (int t : {kH, kS, kN}) {
      out[g].blocks[t] = T(t).policy ? T(t).policy->GroupCount(static_cast<uint32_t>(g)) : 0;
      out[g].quota[t] = QuotaSlots(t, static_cast<uint32_t>(g));
      out[g].evictions[t] = group_evictions_[g][t];
      out[g].bytes[t] = T(t).policy ? T(t).policy->GroupBytes(static_cast<uint32_t>(g)) : 0;
      out[g].quota_bytes[t] = QuotaBytes(t, static_cast<uint32_t>(g));
    }
  }
  return out;
}

std::vector<TierStats> TierManagerImpl::Stats() const {
  std::vector<TierStats> out;
  std::lock_guard<IndexMutex> l(mu_);
  for (const TierState& ts : tiers_) {
    TierStats s = ts.c;
    s.tier = ts.tier();
    s.present = has_tier(s.tier);
    s.slots_total = ts.total();
    s.slots_used = s.present ? ts.used() : 0;
    s.capacity_bytes = s.slots_total * slot_bytes_;
    s.used_bytes = s.slots_used * slot_bytes_;
    if (s.present) {  // slots (NVMe: records) of several sizes
      s.capacity_bytes = ts.arena_bytes();
      s.used_bytes = ts.used_bytes();
    }
    s.blocks = ts.policy ? ts.policy->size() : 0;
    s.slab_moves = ts.slab_moves;
    s.pinned = ts.pinned;  // kept as pins change: no scan of the block index
    if (s.tier == Tier::kNvme && nvme_) s.checksum_failures = nvme_->Stats().checksum_failures;
    out.push_back(s);
  }
  if (remote_) {
    const remote::RemoteStats rs = remote_->tier().stats();
    TierStats s;
    s.tier = Tier::kRemote;
    s.present = true;
    s.hits = rs.hits;
    s.misses = rs.misses;
    s.errors = rs.errors;
    s.checksum_failures = rs.corrupt;
    s.bytes_read = rs.bytes_read;
    s.bytes_written = rs.bytes_written;
    s.read_gbps = rs.read_gbps;
    s.promotions_in = remote_->fetched();
    s.demotions_out = rs.writes;
    s.write_errors = rs.write_errors + remote_->write_dropped();
    out.push_back(s);
  }
  return out;
}

}  // namespace kvtier::tiers
