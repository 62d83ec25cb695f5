// TierManager implementation: the block index over the three tiers, pins, eviction,
// admission and the mover thread. Design notes in docs/tiers.md.
//
// Locking: one mutex (mu_) guards the block map, the per-slot states, the policies and
// the counters. No I/O or DMA runs under it: the mover thread takes the queued work out
// under the lock, runs the NVMe batches and launches the copies without it, and applies
// the results under it again. User callbacks (AcquireDone) are queued in deferred_ and
// run by the mover with no lock held, so they may call back into the TierManager; an
// acquire that completes inside Acquire (nothing to move) runs its callback on the
// caller's thread after mu_ is released, which is just as safe.
#include "tiers/tier_manager.h"

#include <absl/container/flat_hash_set.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "tiers/block_index.h"
#include "common/cuda_env.h"
#include "tiers/hbm/hbm_pool.h"
#include "tiers/host/host_pool.h"
#include "tiers/nvme/nvme_store.h"
#include "tiers/policy/policy.h"
#include "tiers/remote/remote_tier.h"
#include "testing/test_point.h"

namespace kvtier::tiers {

const char* TierName(Tier t) {
  switch (t) {
    case Tier::kHbm: return "hbm";
    case Tier::kHost: return "host";
    case Tier::kNvme: return "nvme";
    case Tier::kRemote: return "remote";
    case Tier::kNone: return "none";
  }
  return "?";
}

Status TierOptions::Validate(const char* tier_name) const {
  if (!(low_watermark > 0.0 && low_watermark <= high_watermark && high_watermark <= 1.0)) {
    return Status::Invalid(std::string(tier_name) + ": watermarks must satisfy 0 < low (" +
                           std::to_string(low_watermark) + ") <= high (" +
                           std::to_string(high_watermark) + ") <= 1");
  }
  if (policy != PolicyKind::kLru && policy != PolicyKind::kS3Fifo && policy != PolicyKind::kPrefixLru) {
    return Status::Invalid(std::string(tier_name) + ": unknown eviction policy");
  }
  if (on_evict != OnEvict::kDemote && on_evict != OnEvict::kDrop) {
    return Status::Invalid(std::string(tier_name) + ": unknown on_evict");
  }
  return Status::Ok();
}

Status TierManagerOptions::Validate() const {
  if (slot_bytes == 0 || slot_bytes % 4096) {
    return Status::Invalid("slot_bytes " + std::to_string(slot_bytes) + " is not a positive multiple of 4096");
  }
  KVTIER_RETURN_IF_ERROR(hbm.Validate("hbm"));
  KVTIER_RETURN_IF_ERROR(host.Validate("host"));
  KVTIER_RETURN_IF_ERROR(nvme.tier.Validate("nvme"));
  if (host.capacity_bytes < slot_bytes) {
    return Status::Invalid("host tier: capacity " + std::to_string(host.capacity_bytes) +
                           " bytes holds no slot of " + std::to_string(slot_bytes));
  }
  if (host.capacity_bytes / slot_bytes > UINT32_MAX || hbm.capacity_bytes / slot_bytes > UINT32_MAX) {
    return Status::Invalid("more than 2^32 slots in a tier");
  }
  if (hbm.capacity_bytes > 0 && hbm.capacity_bytes < slot_bytes) {
    return Status::Invalid("hbm tier: capacity holds no slot");
  }
  if (cuda_device < 0) return Status::Invalid("cuda_device is negative");
  if (nvme.tier.capacity_bytes > 0) {
    if (nvme.dir.empty()) return Status::Invalid("nvme tier: empty dir");
    if (nvme.admission != Admission::kAlways && nvme.admission != Admission::kSecondHit) {
      return Status::Invalid("nvme tier: unknown admission");
    }
    if (nvme.queue_depth == 0 || nvme.queue_depth > 4096) {
      return Status::Invalid("nvme tier: queue_depth not in [1, 4096]");
    }
  }
  if (mover_batch == 0) return Status::Invalid("mover_batch is 0");
  if (!(host_to_hbm_gbps > 0) || !(nvme_read_gbps > 0)) return Status::Invalid("bandwidths must be > 0");
  if (remote.enabled()) {
    remote::ClusterOptions co;
    co.nodes = remote.nodes;
    co.connect_timeout_ms = remote.connect_timeout_ms;
    co.command_timeout_ms = remote.command_timeout_ms;
    co.pool_size = remote.pool_size;
    Status s = co.Validate();
    if (!s.ok()) return Status::Invalid("remote tier: " + s.message());
    if (remote.batch == 0 || remote.batch > 1024) return Status::Invalid("remote tier: batch not in [1, 1024]");
    if (!(remote.read_gbps > 0)) return Status::Invalid("remote tier: read_gbps must be > 0");
  }
  return Status::Ok();
}

namespace {

constexpr int kH = 0, kS = 1, kN = 2;
// tier indices: HBM, host (staging), NVMe
int Idx(Tier t) { return t == Tier::kHbm ? kH : t == Tier::kHost ? kS : kN; }
Tier TierOf(int i) { return i == kH ? Tier::kHbm : i == kS ? Tier::kHost : Tier::kNvme; }

struct Block;
using Waiter = std::function<void(bool ok)>;

struct Promotion {
  int slot = -1;                // reserved slot in the target tier
  std::vector<Waiter> waiters;  // run under mu_ when the promotion ends
};

// Aligned to a cache line: the fields a lookup reads (id, bytes, slot, nvme) share the
// first one, so a probe of the index touches one line of the Block.
struct alignas(64) Block {
  BlockId id;
  Key128 parent;
  uint64_t bytes = 0;          // payload bytes (the contract's block size)
  int32_t slot[2] = {-1, -1};  // valid copy in HBM / host
  bool nvme = false;           // valid record on NVMe
  uint32_t pins[2] = {0, 0};   // client pins (leases) in HBM / host
  uint32_t io_pins[3] = {0, 0, 0};  // source of an in-flight copy
  bool busy[2] = {false, false};    // a demotion out of HBM / host is in flight
  std::shared_ptr<Promotion> promo[2];
  uint32_t uses = 0;
  uint32_t holds = 0;  // held by a method walking several blocks: neither evicted nor erased
  bool remote = false;  // fetched from, or queued for writing to, the remote tier
};

// Hash and equality of the block index (TierManagerImpl::blocks_), a set of the Blocks
// keyed by their own id; transparent, so a BlockId finds its Block.
struct BlockIndexHash {
  using is_transparent = void;
  uint64_t seed = 0;  // TierManagerOptions::index_seed, or a random one
  size_t operator()(const BlockId& id) const noexcept { return BlockIndexHashOf(id, seed); }
  size_t operator()(const std::unique_ptr<Block>& b) const noexcept { return (*this)(b->id); }
};
struct BlockIndexEq {
  using is_transparent = void;
  static const BlockId& Id(const BlockId& id) { return id; }
  static const BlockId& Id(const std::unique_ptr<Block>& b) { return b->id; }
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const noexcept { return Id(a) == Id(b); }
};

// The tier's eviction policy, counting its blocks per contract on the way (for the
// operator views: per-contract counts without a scan of the block index).
class CountingPolicy {
 public:
  explicit CountingPolicy(std::unique_ptr<EvictionPolicy> p) : p_(std::move(p)) {}
  void Insert(const BlockId& b, const BlockId& parent) {
    if (!p_->Contains(b)) ++per_contract_[b.contract];
    p_->Insert(b, parent);
  }
  void Touch(const BlockId& b) { p_->Touch(b); }
  void Remove(const BlockId& b) {
    if (p_->Contains(b)) {
      auto it = per_contract_.find(b.contract);
      if (it != per_contract_.end() && --it->second == 0) per_contract_.erase(it);
    }
    p_->Remove(b);
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& evictable) {
    return p_->Victim(evictable);
  }
  size_t size() const { return p_->size(); }
  bool Contains(const BlockId& b) const { return p_->Contains(b); }
  uint64_t Count(uint64_t contract) const {
    auto it = per_contract_.find(contract);
    return it == per_contract_.end() ? 0 : it->second;
  }

 private:
  std::unique_ptr<EvictionPolicy> p_;
  std::unordered_map<uint64_t, uint64_t> per_contract_;
};
std::unique_ptr<CountingPolicy> MakePolicy(PolicyKind kind, uint64_t capacity) {
  return std::make_unique<CountingPolicy>(EvictionPolicy::Create(kind, capacity));
}

enum class SlotState : uint8_t { kFree, kAlloc, kBlock, kDup, kLoading };
struct SlotInfo {
  SlotState state = SlotState::kFree;
  Block* block = nullptr;  // kBlock, kLoading
  uint64_t contract = 0;   // kAlloc, kDup
};

struct Counters {
  uint64_t hits = 0, misses = 0, promotions_in = 0, demotions_out = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t evictions_demoted = 0, evictions_dropped = 0, admission_rejects = 0;
  double read_gbps = 0, write_gbps = 0;
};

struct AcquireCtx {
  TierManager::AcquireDone done;
  Tier target = Tier::kNone;
  std::vector<Block*> blocks;
  std::vector<SlotRef> slots;  // slots[i].from is set when block i is found
  std::vector<bool> ok;
  size_t pending = 0;
  // KVTIER_TRACE_COPIES=1: when the acquire came in, and how long its set-up took.
  std::chrono::steady_clock::time_point t0{};
  double setup_us = 0;
  double found_us = 0, first_send_us = -1;  // prefix found and held; first copies sent
  size_t promoted = 0;
};

uint64_t RandomSeed() {
  std::random_device rd;
  const uint64_t s = (uint64_t{rd()} << 32) ^ rd();
  return s != 0 ? s : 0x9E3779B97F4A7C15ull;
}

// KVTIER_TRACE_COPIES=1 (read once): acquires of 64 blocks or more log their timeline
// (set-up under the lock, answer), and HbmPool logs each copy batch.
bool TraceCopies() {
  static const bool on = [] {
    const char* e = std::getenv("KVTIER_TRACE_COPIES");
    return e != nullptr && std::string(e) == "1";
  }();
  return on;
}

struct RemoteFetch {  // an Acquire waiting for the remote tier
  uint64_t contract = 0;
  std::vector<Key128> keys;
  Tier target = Tier::kNone;
  TierManager::AcquireDone done;
};
struct RemoteWriteJob {  // a block's bytes, copied out of its host slot
  uint64_t contract = 0;
  Key128 key, parent;
  std::vector<uint8_t> payload;
};

struct CopyJob {  // host <-> HBM
  Block* b;
  int dst_slot;
  bool to_hbm;    // H2D (promotion) or D2H
  bool demote;    // D2H as eviction (drop the HBM copy after)
};
struct CopyDoneMsg {
  Block* b;
  int dst_slot;
  bool to_hbm, demote;
  Status st;
};

}  // namespace

class TierManagerImpl final : public TierManager {
 public:
  explicit TierManagerImpl(const TierManagerOptions& o)
      : opts_(o), blocks_(0, BlockIndexHash{o.index_seed != 0 ? o.index_seed : RandomSeed()}) {}
  ~TierManagerImpl() override;
  Status Init();

  uint64_t slot_bytes() const override { return opts_.slot_bytes; }
  bool has_tier(Tier t) const override {
    return (t == Tier::kHbm && hbm_) || (t == Tier::kHost && host_) || (t == Tier::kNvme && nvme_) ||
           (t == Tier::kRemote && remote_);
  }
  int host_arena_fd() const override { return host_->fd(); }
  uint64_t host_arena_bytes() const override { return host_->arena_bytes(); }
  uint8_t* hbm_base() const override { return hbm_ ? hbm_->base() : nullptr; }
  Status hbm_ipc_handle(uint8_t out[64]) const override {
    if (!hbm_) return Status::Unsupported("no HBM tier");
    return hbm_->IpcHandle(out);
  }
  Status RegisterContract(const ScaleContract& c) override;
  bool HasContract(uint64_t id) const override {
    std::lock_guard<std::mutex> l(mu_);
    return contracts_.count(id) != 0;
  }
  LookupResult Lookup(uint64_t contract_id, std::span<const Key128> keys) override;
  size_t LookupInto(uint64_t contract_id, std::span<const Key128> keys, Tier* tiers_out,
                    double* est_seconds_to_hbm) override;
  void Acquire(uint64_t contract_id, std::span<const Key128> keys, Tier target, AcquireDone done) override;
  Status AllocSlots(uint64_t contract_id, uint32_t n, Tier target, std::vector<SlotRef>* out) override;
  Status Commit(uint64_t contract_id, SlotRef slot, const Key128& key, const Key128& parent) override;
  Status Unpin(SlotRef slot) override;
  Status FreeSlot(SlotRef slot) override;
  void Prefetch(uint64_t contract_id, std::span<const Key128> keys, Tier target) override;
  Status Evict(uint64_t contract_id, const Key128& key) override;
  Status Flush(Tier to) override;
  Status Reconfigure(const TierManagerOptions& opts) override;
  std::vector<TierStats> Stats() const override;
  void Drain() override;
  std::vector<ContractInfo> Contracts() const override;
  Status ListBlocks(uint64_t contract_id, Tier tier, uint64_t offset, uint32_t limit,
                    std::vector<BlockInfo>* out, uint64_t* total) const override;
  StatusOr<BlockInfo> InspectBlock(uint64_t contract_id, const Key128& key) const override;
  Status VerifyNvme(uint64_t offset, uint32_t limit, VerifyReport* report) override;
  Status EvictContract(uint64_t contract_id, uint64_t* evicted, uint64_t* skipped) override;

 private:
  // ---- all *Locked methods run with mu_ held ----
  uint32_t Slots(int t) const { return t == kH ? (hbm_ ? hbm_->slots() : 0) : t == kS ? host_->slots() : (nvme_ ? nvme_->records_total() : 0); }
  uint32_t UsedLocked(int t) const {
    return t == kH ? (hbm_ ? hbm_->used() : 0) : t == kS ? host_->used() : (nvme_ ? nvme_->records_total() - nvme_->free_records() : 0);
  }
  std::optional<uint32_t> PoolAlloc(int t) { return t == kH ? hbm_->Alloc() : host_->Alloc(); }
  void PoolFree(int t, uint32_t s) {
    (void)(t == kH ? hbm_->Free(s) : host_->Free(s));
    slots_[t][s] = SlotInfo{};
  }
  bool EvictableLocked(int t, const Block& b) const {
    if (b.holds > 0) return false;
    if (t == kN) return b.io_pins[kN] == 0 && !b.busy[kS] && !b.promo[kS];
    return b.pins[t] == 0 && b.io_pins[t] == 0 && !b.busy[t] && b.slot[t] >= 0;
  }
  Block* FindLocked(const BlockId& id) {
    auto it = blocks_.find(id);
    return it == blocks_.end() ? nullptr : it->get();
  }
  bool CachedLocked(const Block& b) const { return b.slot[kH] >= 0 || b.slot[kS] >= 0 || b.nvme; }
  void MaybeEraseLocked(Block* b);
  // Drops one hold per entry of `blocks` (a block may appear several times) and erases a
  // block no longer needed once its last hold is gone. Linear: a block is looked at for
  // erasure only at its last occurrence, so no pass touches an erased block.
  void ReleaseHoldsLocked(const std::vector<Block*>& blocks) {
    for (Block* b : blocks) {
      if (--b->holds == 0) MaybeEraseLocked(b);
    }
  }
  void DropCopyLocked(int t, Block* b, bool demoted);
  // Frees up to `need` slots in tier t by dropping victims that need no I/O (a copy exists
  // below, or the tier drops on eviction). Returns how many were freed.
  uint32_t EvictCleanLocked(int t, uint32_t need);
  std::optional<uint32_t> ReserveLocked(int t, Block* loading_for);
  void EvictOneLocked(int t, Block* b, uint32_t* pending_out);
  bool AdmitLocked(Block* b, bool force);
  void MaintainLocked();
  bool OverHighLocked(int t) const;
  // Free slots a Retry'd AllocSlots is waiting for, per tier (0: none); MaintainLocked
  // demotes until they exist, watermarks or not. Guarded by mu_.
  uint32_t want_free_[3] = {0, 0, 0};
  // Promotions. Each returns false when the promotion could not even start.
  bool StartPromotionLocked(Block* b, int t, Waiter w);
  void LaunchLocked(Block* b, int t);
  void RetrySpaceWaitersLocked(int t);
  void FinishPromotionLocked(Block* b, int t, bool ok);
  // Queues ctx's answer for the mover to deliver, or, with `now` (an acquire that finished
  // inside Acquire: nothing had to move), hands it to the caller to run after unlocking.
  void FinishAcquireLocked(const std::shared_ptr<AcquireCtx>& ctx, std::function<void()>* now = nullptr);
  void AcquireLocal(uint64_t contract_id, std::span<const Key128> keys, Tier target, AcquireDone done);
  size_t LocalPrefixLocked(uint64_t contract_id, std::span<const Key128> keys) {
    size_t n = 0;
    for (const Key128& k : keys) {
      Block* b = FindLocked({contract_id, k});
      if (!b || !CachedLocked(*b)) break;
      ++n;
    }
    return n;
  }
  // Remote tier (docs/remote.md). The reader thread serves RemoteFetch jobs, the writer
  // thread RemoteWriteJobs; both take rmu_ only (never mu_ while holding it).
  void QueueRemoteWriteLocked(Block* b);
  Status CommitImpl(uint64_t contract_id, SlotRef slot, const Key128& key, const Key128& parent, bool from_remote);
  void RemoteReaderLoop();
  void RemoteWriterLoop();
  // Returns the index of the first key it fetched (the local prefix when it began).
  size_t FetchRemote(RemoteFetch& job);
  std::unique_ptr<remote::RemoteTier> remote_;
  std::mutex rmu_;
  std::condition_variable rcv_, ridle_cv_;
  std::deque<RemoteFetch> rfetch_;
  std::deque<RemoteWriteJob> rwrite_;
  uint64_t rwrite_bytes_ = 0;                   // guarded by rmu_
  std::atomic<uint64_t> rwrite_dropped_{0};     // writes refused by a full queue
  uint64_t remote_promotions_ = 0;              // guarded by mu_
  int rbusy_ = 0;                               // guarded by rmu_
  std::atomic<bool> rstop_{false};
  std::thread rreader_, rwriter_;
  void KickLocked() { work_ = true; cv_.notify_all(); }

  void MoverLoop();
  void DrainMover();
  bool HasWorkLocked() const {
    return work_ || !reads_.empty() || !writes_.empty() || !copies_.empty() || !deferred_.empty() ||
           !copy_done_.empty() || flush_req_ != nullptr;
  }
  void RunReads(std::vector<Block*> batch);
  void RunWrites(std::vector<std::pair<Block*, bool>> batch);
  void RunCopies(std::vector<CopyJob> batch);
  void SendCopiesInlineLocked(std::unique_lock<std::mutex>& l);
  void ApplyCopyDone(const CopyDoneMsg& m);
  Status DoFlush(Tier to);

  TierManagerOptions opts_;
  std::unique_ptr<HbmPool> hbm_;
  std::unique_ptr<HostPool> host_;
  std::unique_ptr<NvmeStore> nvme_;

  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::unordered_map<uint64_t, ScaleContract> contracts_;
  // The block index. An open-addressing table (abseil's SwissTable): a find is a probe of
  // one 16-byte control group and one slot, against the three dependent pointer loads and
  // a 64-bit division of std::unordered_map (a 1,000-block lookup: 15.6 -> 7.5 us). Its
  // slots hold only the Block pointer (8 bytes, found by the Block's own id): a probe
  // reads the control bytes, the pointer and the Block's first line, where the map of
  // (id -> pointer) it replaced read a 32-byte slot and then the Block as well (1,000
  // blocks: the slots fit L1; with the cheaper hash, block_index.h, 7.5 -> 4.9 us).
  // Blocks stay put (unique_ptr): Block* survive rehashing.
  absl::flat_hash_set<std::unique_ptr<Block>, BlockIndexHash, BlockIndexEq> blocks_;
  std::vector<SlotInfo> slots_[2];
  std::unique_ptr<CountingPolicy> policy_[3];
  uint64_t pinned_[3] = {0, 0, 0};  // blocks with pins[t] > 0 (hbm, host); io_pins[kN] > 0 (nvme)
  Counters c_[3];
  // Admission state (NVMe).
  std::deque<BlockId> ghost_;
  std::unordered_set<BlockId, BlockIdHash> ghost_set_;
  uint64_t budget_used_ = 0;
  std::chrono::steady_clock::time_point budget_window_start_ = std::chrono::steady_clock::now();
  // Mover queues.
  std::vector<Block*> reads_;                     // NVMe -> host promotions (slot in promo[kS])
  std::vector<std::pair<Block*, bool>> writes_;   // host -> NVMe (bool: eviction)
  std::vector<CopyJob> copies_;
  std::vector<std::function<void()>> deferred_;  // user callbacks, run without mu_
  std::vector<CopyDoneMsg> copy_done_;            // from CUDA host callbacks
  uint32_t copies_in_flight_ = 0;
  uint32_t inline_copies_ = 0;  // copy batches an acquiring thread is sending (SendCopiesInlineLocked)
  static constexpr size_t kInlineFirst = 64, kInlineCopies = 256;
  uint32_t demoting_[2] = {0, 0};           // demotions in flight out of HBM / host
  std::vector<Block*> space_wait_[2];       // promotions waiting for a demotion to free a slot
  bool work_ = false, stop_ = false, busy_step_ = false;
  std::promise<Status>* flush_req_ = nullptr;
  Tier flush_to_ = Tier::kNvme;  // with flush_req_
  std::thread mover_;
};

// ---------------------------------------------------------------------------------------

StatusOr<std::unique_ptr<TierManager>> TierManager::Open(const TierManagerOptions& opts) {
  KVTIER_RETURN_IF_ERROR(opts.Validate());
  auto tm = std::make_unique<TierManagerImpl>(opts);
  KVTIER_RETURN_IF_ERROR(tm->Init());
  return std::unique_ptr<TierManager>(std::move(tm));
}

Status TierManagerImpl::Init() {
  HostPoolOptions ho;
  ho.slot_bytes = opts_.slot_bytes;
  ho.slots = static_cast<uint32_t>(opts_.host.capacity_bytes / opts_.slot_bytes);
  auto host = HostPool::Create(ho);
  if (!host.ok()) return host.status();
  host_ = std::move(host.value());

  std::string hbm_why;
  if (opts_.hbm.capacity_bytes == 0) {
    hbm_why = "hbm capacity is 0";
  } else if (cuda::DeviceCount(&hbm_why) > 0) {
    HbmPoolOptions hb;
    hb.device = opts_.cuda_device;
    hb.slot_bytes = opts_.slot_bytes;
    hb.slots = static_cast<uint32_t>(opts_.hbm.capacity_bytes / opts_.slot_bytes);
    auto hbm = HbmPool::Create(hb);
    if (!hbm.ok()) return hbm.status();  // a GPU is there but unusable: say so at start
    hbm_ = std::move(hbm.value());
  }

  if (opts_.nvme.tier.capacity_bytes > 0) {
    NvmeStoreOptions no;
    no.dir = opts_.nvme.dir;
    no.capacity_bytes = opts_.nvme.tier.capacity_bytes;
    no.slot_bytes = opts_.slot_bytes;
    no.queue_depth = opts_.nvme.queue_depth;
    no.verify_on_restart = opts_.nvme.verify_on_restart;
    no.fixed.push_back({host_->base(), host_->arena_bytes()});
    auto st = NvmeStore::Open(no);
    if (!st.ok()) return st.status();
    nvme_ = std::move(st.value());
  }

  slots_[kH].assign(hbm_ ? hbm_->slots() : 0, SlotInfo{});
  slots_[kS].assign(host_->slots(), SlotInfo{});
  policy_[kH] = MakePolicy(opts_.hbm.policy, Slots(kH));
  policy_[kS] = MakePolicy(opts_.host.policy, Slots(kS));
  policy_[kN] = MakePolicy(opts_.nvme.tier.policy, Slots(kN));
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
      policy_[kN]->Insert(e.id, BlockId{e.id.contract, e.parent});
      blocks_.insert(std::move(b));
    }
  }
  spdlog::info("kvtier tiers: hbm {} | host {} slots x {} B ({}) | nvme {}",
               hbm_ ? fmt::format("{} slots on device {} ({})", hbm_->slots(), opts_.cuda_device,
                                  cuda::DeviceName(opts_.cuda_device))
                    : fmt::format("absent ({})", hbm_why),
               host_->slots(), opts_.slot_bytes,
               host_->cuda_registered() ? "cudaHostRegister'ed" : "not CUDA-registered",
               nvme_ ? fmt::format("{} records under {} ({} blocks loaded)", nvme_->records_total(),
                                   opts_.nvme.dir, blocks_.size())
                     : std::string("absent"));
  if (opts_.remote.enabled()) {
    auto r = remote::RemoteTier::Open(opts_.remote);
    if (!r.ok()) return r.status();
    remote_ = std::move(r.value());
    const char* w[] = {"off", "on-demote", "write-through"};
    spdlog::info("kvtier tiers: remote Redis Cluster via {} ({} seeds, write {}, timeouts {}/{} ms)",
                 opts_.remote.nodes[0], opts_.remote.nodes.size(), w[static_cast<int>(opts_.remote.write)],
                 opts_.remote.connect_timeout_ms, opts_.remote.command_timeout_ms);
    rreader_ = std::thread([this] { RemoteReaderLoop(); });
    rwriter_ = std::thread([this] { RemoteWriterLoop(); });
  }
  mover_ = std::thread([this] { MoverLoop(); });
  return Status::Ok();
}

TierManagerImpl::~TierManagerImpl() {
  if (rreader_.joinable()) {
    {
      std::lock_guard<std::mutex> l(rmu_);
      rstop_ = true;
      rcv_.notify_all();
    }
    rreader_.join();
    rwriter_.join();
  }
  if (mover_.joinable()) {
    Drain();
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    mover_.join();
  }
}

Status TierManagerImpl::RegisterContract(const ScaleContract& c) {
  KVTIER_RETURN_IF_ERROR(c.Validate());
  if (c.slot_bytes() > opts_.slot_bytes) {
    return Status::Unsupported("contract block of " + std::to_string(c.block_bytes()) +
                               " bytes does not fit a slot of " + std::to_string(opts_.slot_bytes));
  }
  std::lock_guard<std::mutex> l(mu_);
  contracts_.emplace(c.Id(), c);
  return Status::Ok();
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
  std::unique_lock<std::mutex> l(mu_);
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
    if (!b || !CachedLocked(*b)) break;
    const Tier t = b->slot[kH] >= 0 ? Tier::kHbm : b->slot[kS] >= 0 ? Tier::kHost : Tier::kNvme;
    if (t == Tier::kHost) host_bytes += b->bytes;
    if (t == Tier::kNvme) nvme_bytes += b->bytes;
    tiers_out[hit] = t;
  }
  host_bytes += nvme_bytes;
  double host_d = static_cast<double>(host_bytes);
  const double h2d = c_[kH].write_gbps > 0 ? c_[kH].write_gbps : opts_.host_to_hbm_gbps;
  const double nv = c_[kN].read_gbps > 0 ? c_[kN].read_gbps : opts_.nvme_read_gbps;
  if (remote_ && hit < keys.size()) {
    const uint64_t block = contracts_.at(contract_id).block_bytes();
    l.unlock();  // network I/O, bounded by the remote command timeout
    const size_t n = remote_->ExistsPrefix(contract_id, keys.subspan(hit));
    for (size_t i = 0; i < n; ++i) tiers_out[hit + i] = Tier::kRemote;
    hit += n;
    remote_bytes = static_cast<double>(n * block);
    host_d += remote_bytes;
  }
  double rg = remote_ ? remote_->stats().read_gbps : 0.0;
  if (!(rg > 0)) rg = opts_.remote.read_gbps;
  *est_seconds_to_hbm = host_d / (h2d * 1e9) + static_cast<double>(nvme_bytes) / (nv * 1e9) + remote_bytes / (rg * 1e9);
  return hit;
}

// ---- eviction ---------------------------------------------------------------------------

void TierManagerImpl::MaybeEraseLocked(Block* b) {
  if (CachedLocked(*b) || b->pins[0] || b->pins[1] || b->io_pins[0] || b->io_pins[1] || b->io_pins[2] ||
      b->promo[0] || b->promo[1] || b->busy[0] || b->busy[1] || b->holds) {
    return;
  }
  blocks_.erase(b->id);
}

void TierManagerImpl::DropCopyLocked(int t, Block* b, bool demoted) {
  policy_[t]->Remove(b->id);
  if (t == kN) {
    (void)nvme_->Remove(b->id);  // NotFound when the store dropped it itself (corrupt)
    b->nvme = false;
  } else {
    PoolFree(t, static_cast<uint32_t>(b->slot[t]));
    b->slot[t] = -1;
  }
  ++(demoted ? c_[t].evictions_demoted : c_[t].evictions_dropped);
}

uint32_t TierManagerImpl::EvictCleanLocked(int t, uint32_t need) {
  uint32_t freed = 0;
  const bool drop_all = t == kN || (t == kH ? opts_.hbm.on_evict : opts_.host.on_evict) == OnEvict::kDrop ||
                        (t == kS && !nvme_);
  while (freed < need) {
    auto v = policy_[t]->Victim([&](const BlockId& id) {
      Block* b = FindLocked(id);
      if (!b || !EvictableLocked(t, *b)) return false;
      if (drop_all) return true;
      return t == kH ? b->slot[kS] >= 0 : b->nvme;  // a copy below: no I/O needed
    });
    if (!v) break;
    Block* b = FindLocked(*v);
    const bool below = t == kH ? b->slot[kS] >= 0 : t == kS ? b->nvme : false;
    if (t == kS) QueueRemoteWriteLocked(b);
    DropCopyLocked(t, b, below);
    MaybeEraseLocked(b);
    ++freed;
  }
  return freed;
}

std::optional<uint32_t> TierManagerImpl::ReserveLocked(int t, Block* loading_for) {
  auto s = PoolAlloc(t);
  if (!s && EvictCleanLocked(t, 1) > 0) s = PoolAlloc(t);
  if (!s) {
    KickLocked();  // let the mover demote dirty blocks; the caller retries or fails
    return std::nullopt;
  }
  slots_[t][*s] = SlotInfo{loading_for ? SlotState::kLoading : SlotState::kAlloc, loading_for, 0};
  return s;
}

bool TierManagerImpl::AdmitLocked(Block* b, bool force) {
  const uint64_t budget = opts_.nvme.daily_write_budget_bytes;
  const uint64_t bytes = RoundUp4K(b->bytes) + kIoAlign;
  if (budget > 0) {
    auto now = std::chrono::steady_clock::now();
    if (now - budget_window_start_ >= std::chrono::hours(24)) {
      budget_window_start_ = now;
      budget_used_ = 0;
    }
    if (budget_used_ + bytes > budget) {
      ++c_[kN].admission_rejects;
      return false;
    }
  }
  if (!force && opts_.nvme.admission == Admission::kSecondHit && b->uses < 2) {
    if (ghost_set_.erase(b->id) == 0) {  // first time offered: remember it, refuse it
      ghost_set_.insert(b->id);
      ghost_.push_back(b->id);
      while (ghost_.size() > std::max<size_t>(1024, Slots(kN))) {
        ghost_set_.erase(ghost_.front());
        ghost_.pop_front();
      }
      ++c_[kN].admission_rejects;
      return false;
    }
  }
  budget_used_ += bytes;
  return true;
}

void TierManagerImpl::EvictOneLocked(int t, Block* b, uint32_t* pending_out) {
  if (t == kS) QueueRemoteWriteLocked(b);  // leaving host: its bytes are still there
  if (t == kN) {
    DropCopyLocked(kN, b, false);
    MaybeEraseLocked(b);
    return;
  }
  const OnEvict oe = t == kH ? opts_.hbm.on_evict : opts_.host.on_evict;
  const bool below = t == kH ? b->slot[kS] >= 0 : b->nvme;
  if (below || oe == OnEvict::kDrop) {
    DropCopyLocked(t, b, below);
    MaybeEraseLocked(b);
    return;
  }
  if (t == kH) {  // demote HBM -> host by DMA
    auto s = b->promo[kS] ? std::nullopt : ReserveLocked(kS, b);
    if (!s) {
      DropCopyLocked(kH, b, false);
      MaybeEraseLocked(b);
      return;
    }
    // Out of the policy at once: under prefix-lru its parent becomes a candidate in this
    // same pass, so a chain demotes in one batch instead of one block per round trip.
    policy_[kH]->Remove(b->id);
    ++demoting_[kH];
    b->busy[kH] = true;
    b->io_pins[kH]++;
    copies_.push_back({b, static_cast<int>(*s), false, true});
    ++*pending_out;
    return;
  }
  // host -> NVMe
  if (!nvme_ || !AdmitLocked(b, false)) {
    DropCopyLocked(kS, b, false);
    MaybeEraseLocked(b);
    return;
  }
  policy_[kS]->Remove(b->id);  // see the HBM case above
  ++demoting_[kS];
  b->busy[kS] = true;
  writes_.emplace_back(b, true);
  ++*pending_out;
}

bool TierManagerImpl::OverHighLocked(int t) const {
  const uint32_t total = Slots(t);
  if (total == 0) return false;
  const double hw = t == kH ? opts_.hbm.high_watermark : t == kS ? opts_.host.high_watermark : opts_.nvme.tier.high_watermark;
  return UsedLocked(t) > hw * total;
}

void TierManagerImpl::MaintainLocked() {
  for (int t : {kH, kS, kN}) {
    if (Slots(t) == 0) continue;
    // Demote above the high watermark, and also when an alloc is waiting for more free
    // slots than the watermarks would ever leave (a tier of unpinned blocks that are not
    // on the next tier yet: only demotion can free them).
    const bool over = OverHighLocked(t);
    const bool demand = want_free_[t] > 0 && Slots(t) - UsedLocked(t) < want_free_[t];
    if (!over && !demand) continue;
    const TierOptions& to = t == kH ? opts_.hbm : t == kS ? opts_.host : opts_.nvme.tier;
    double target = over ? to.low_watermark * Slots(t) : static_cast<double>(Slots(t));
    if (demand) target = std::min(target, static_cast<double>(Slots(t) - want_free_[t]));
    uint32_t pending = 0;
    // Demotions already in flight out of this tier count as freed.
    for (const auto& w : writes_) pending += (t == kS && w.second) ? 1 : 0;
    for (const auto& c : copies_) pending += (t == kH && c.demote) ? 1 : 0;
    while (UsedLocked(t) - std::min(pending, UsedLocked(t)) > target) {
      auto v = policy_[t]->Victim([&](const BlockId& id) {
        Block* b = FindLocked(id);
        return b && EvictableLocked(t, *b);
      });
      if (!v) break;  // everything left is pinned or in flight
      EvictOneLocked(t, FindLocked(*v), &pending);
    }
  }
}

// ---- data path ----------------------------------------------------------------------------

Status TierManagerImpl::AllocSlots(uint64_t contract_id, uint32_t n, Tier target, std::vector<SlotRef>* out) {
  if (!out) return Status::Invalid("AllocSlots: null output");
  if (target != Tier::kHbm && target != Tier::kHost) {
    return Status::Invalid(std::string("AllocSlots: tier ") + TierName(target) + " takes no direct writes");
  }
  if (!has_tier(target)) return Status::Unsupported(std::string("no ") + TierName(target) + " tier");
  const int t = Idx(target);
  std::lock_guard<std::mutex> l(mu_);
  if (!contracts_.count(contract_id)) return Status::NotFound("AllocSlots: unknown contract " + ContractIdHex(contract_id));
  if (n == 0) return Status::Ok();
  if (n > Slots(t)) return Status::Invalid("AllocSlots: " + std::to_string(n) + " slots asked, tier has " + std::to_string(Slots(t)));
  const uint32_t free = Slots(t) - UsedLocked(t);
  if (free < n) EvictCleanLocked(t, n - free);
  if (Slots(t) - UsedLocked(t) < n) {
    want_free_[t] = std::max(want_free_[t], n);
    MaintainLocked();
    KickLocked();
    return Status::Retry(std::string(TierName(target)) + " tier full (pinned or being demoted)");
  }
  want_free_[t] = 0;
  for (uint32_t i = 0; i < n; ++i) {
    auto s = PoolAlloc(t);
    slots_[t][*s] = SlotInfo{SlotState::kAlloc, nullptr, contract_id};
    out->push_back({target, *s});
  }
  if (OverHighLocked(t)) KickLocked();
  return Status::Ok();
}

Status TierManagerImpl::Commit(uint64_t contract_id, SlotRef ref, const Key128& key, const Key128& parent) {
  return CommitImpl(contract_id, ref, key, parent, false);
}

Status TierManagerImpl::CommitImpl(uint64_t contract_id, SlotRef ref, const Key128& key, const Key128& parent,
                                   bool from_remote) {
  if ((ref.tier != Tier::kHbm && ref.tier != Tier::kHost) || !has_tier(ref.tier)) {
    return Status::Invalid("Commit: bad tier");
  }
  const int t = Idx(ref.tier);
  std::lock_guard<std::mutex> l(mu_);
  if (ref.slot >= slots_[t].size() || slots_[t][ref.slot].state != SlotState::kAlloc) {
    return Status::Invalid("Commit: slot " + std::to_string(ref.slot) + " is not an allocated, uncommitted slot");
  }
  SlotInfo& si = slots_[t][ref.slot];
  if (si.contract != contract_id) return Status::Invalid("Commit: slot was allocated for another contract");
  auto cit = contracts_.find(contract_id);
  if (cit == contracts_.end()) return Status::NotFound("Commit: unknown contract");
  const BlockId id{contract_id, key};
  Block* b = FindLocked(id);
  if (b && (b->slot[t] >= 0 || b->promo[t])) {
    si.state = SlotState::kDup;  // equal bytes already cached here: keep the old block
    return Status::Ok();
  }
  if (!b) {
    auto nb = std::make_unique<Block>();
    nb->id = id;
    nb->parent = parent;
    nb->bytes = cit->second.block_bytes();
    b = nb.get();
    blocks_.insert(std::move(nb));
  }
  b->uses++;
  b->slot[t] = static_cast<int32_t>(ref.slot);
  if (b->pins[t]++ == 0) ++pinned_[t];
  si = SlotInfo{SlotState::kBlock, b, 0};
  policy_[t]->Insert(id, BlockId{contract_id, b->parent});
  if (from_remote) b->remote = true;  // never written back
  if (t == kS && opts_.remote.write == remote::RemoteWrite::kWriteThrough) QueueRemoteWriteLocked(b);
  if (OverHighLocked(t)) KickLocked();
  return Status::Ok();
}

Status TierManagerImpl::Unpin(SlotRef ref) {
  if (ref.tier != Tier::kHbm && ref.tier != Tier::kHost) return Status::Invalid("Unpin: bad tier");
  const int t = Idx(ref.tier);
  std::lock_guard<std::mutex> l(mu_);
  if (ref.slot >= slots_[t].size()) return Status::Invalid("Unpin: slot out of range");
  SlotInfo& si = slots_[t][ref.slot];
  if (si.state == SlotState::kDup) {
    PoolFree(t, ref.slot);
    return Status::Ok();
  }
  if (si.state != SlotState::kBlock || si.block->pins[t] == 0) {
    return Status::Invalid("Unpin: slot " + std::to_string(ref.slot) + " holds no pinned block");
  }
  if (--si.block->pins[t] == 0) --pinned_[t];
  if (OverHighLocked(t)) KickLocked();
  return Status::Ok();
}

Status TierManagerImpl::FreeSlot(SlotRef ref) {
  if (ref.tier != Tier::kHbm && ref.tier != Tier::kHost) return Status::Invalid("FreeSlot: bad tier");
  const int t = Idx(ref.tier);
  std::lock_guard<std::mutex> l(mu_);
  if (ref.slot >= slots_[t].size() || slots_[t][ref.slot].state != SlotState::kAlloc) {
    return Status::Invalid("FreeSlot: slot " + std::to_string(ref.slot) + " is not allocated-uncommitted");
  }
  PoolFree(t, ref.slot);
  return Status::Ok();
}

bool TierManagerImpl::StartPromotionLocked(Block* b, int t, Waiter w) {
  if (b->promo[t]) {  // merge with the promotion already in flight
    b->promo[t]->waiters.push_back(std::move(w));
    return true;
  }
  if (b->slot[t] >= 0) {  // already there (e.g. a chained wait)
    w(true);
    return true;
  }
  if (t == kS) {
    if (!b->nvme && !(b->slot[kH] >= 0 && !b->busy[kH])) return false;  // no source
    auto p = std::make_shared<Promotion>();
    p->waiters.push_back(std::move(w));
    b->promo[kS] = p;
    LaunchLocked(b, kS);
    return true;
  }
  // t == kH: from host, or after a host promotion.
  auto p = std::make_shared<Promotion>();
  p->waiters.push_back(std::move(w));
  b->promo[kH] = p;
  if (b->slot[kS] >= 0 && !b->promo[kS]) {
    LaunchLocked(b, kH);
    return true;
  }
  const bool ok = StartPromotionLocked(b, kS, [this, b](bool ok) {
    if (ok) LaunchLocked(b, kH);
    else FinishPromotionLocked(b, kH, false);
  });
  if (!ok) {
    b->promo[kH].reset();
    return false;
  }
  return true;
}

// Reserves the target slot of b's promotion into t and queues the copy. Without a free
// slot it forces one eviction; when that (or an earlier one) is a demotion still in
// flight, the promotion waits for it (space_wait_) instead of failing: an acquire is only
// cut short when the tier is full of pinned blocks.
void TierManagerImpl::LaunchLocked(Block* b, int t) {
  auto s = ReserveLocked(t, b);
  if (!s && demoting_[t] == 0) {
    auto v = policy_[t]->Victim([&](const BlockId& id) {
      Block* x = FindLocked(id);
      return x && x != b && EvictableLocked(t, *x);
    });
    uint32_t pending = 0;
    if (v) EvictOneLocked(t, FindLocked(*v), &pending);
    s = ReserveLocked(t, b);
  }
  if (!s) {
    if (demoting_[t] > 0) {
      space_wait_[t].push_back(b);
      KickLocked();
    } else {
      FinishPromotionLocked(b, t, false);
    }
    return;
  }
  b->promo[t]->slot = static_cast<int>(*s);
  if (t == kH) {
    if (b->slot[kS] < 0) {  // the host copy went away meanwhile
      FinishPromotionLocked(b, kH, false);
      return;
    }
    b->io_pins[kS]++;
    copies_.push_back({b, static_cast<int>(*s), true, false});
  } else if (b->nvme) {
    if (b->io_pins[kN]++ == 0) ++pinned_[kN];
    reads_.push_back(b);
  } else if (b->slot[kH] >= 0 && !b->busy[kH]) {
    b->io_pins[kH]++;
    copies_.push_back({b, static_cast<int>(*s), false, false});
  } else {
    FinishPromotionLocked(b, kS, false);
    return;
  }
  KickLocked();
}

void TierManagerImpl::RetrySpaceWaitersLocked(int t) {
  auto waiting = std::exchange(space_wait_[t], {});
  for (Block* b : waiting) {
    if (b->promo[t]) LaunchLocked(b, t);
  }
}

void TierManagerImpl::FinishPromotionLocked(Block* b, int t, bool ok) {
  auto p = std::move(b->promo[t]);
  b->promo[t].reset();
  if (!p) return;
  if (ok) {
    b->slot[t] = p->slot;
    slots_[t][p->slot] = SlotInfo{SlotState::kBlock, b, 0};
    policy_[t]->Insert(b->id, BlockId{b->id.contract, b->parent});
    c_[t].promotions_in++;
  } else if (p->slot >= 0 && slots_[t][p->slot].state == SlotState::kLoading) {
    PoolFree(t, static_cast<uint32_t>(p->slot));
  }
  b->holds++;  // a waiter may finish a chained promotion of b, which must not erase it
  for (auto& w : p->waiters) w(ok);
  b->holds--;
  MaybeEraseLocked(b);
}

void TierManagerImpl::FinishAcquireLocked(const std::shared_ptr<AcquireCtx>& ctx, std::function<void()>* now) {
  size_t n = 0;
  while (n < ctx->ok.size() && ctx->ok[n]) ++n;
  const int t = Idx(ctx->target);
  for (size_t i = n; i < ctx->ok.size(); ++i) {  // past the first loss: not part of the answer
    if (ctx->ok[i]) {
      if (--ctx->blocks[i]->pins[t] == 0) --pinned_[t];
      MaybeEraseLocked(ctx->blocks[i]);
    }
  }
  if (n < ctx->ok.size()) c_[kN].misses += ctx->ok.size() - n;
  if (TraceCopies() && ctx->ok.size() >= 64) {
    spdlog::info("acquire {} blocks into {} ({} promoted): prefix found in {:.0f} us, first copies sent at {:.0f} us, "
                 "set-up done at {:.0f} us, answered after {:.0f} us",
                 ctx->ok.size(), TierName(ctx->target), ctx->promoted, ctx->found_us, ctx->first_send_us, ctx->setup_us,
                 std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ctx->t0).count());
  }
  std::vector<SlotRef> out(ctx->slots.begin(), ctx->slots.begin() + static_cast<long>(n));
  auto done = std::move(ctx->done);
  auto answer = [done = std::move(done), out = std::move(out)]() mutable { done(Status::Ok(), std::move(out)); };
  if (now != nullptr) {
    *now = std::move(answer);
    return;
  }
  deferred_.push_back(std::move(answer));
  KickLocked();
}

void TierManagerImpl::Acquire(uint64_t contract_id, std::span<const Key128> keys, Tier target, AcquireDone done) {
  if (remote_ && (target == Tier::kHbm || target == Tier::kHost) && has_tier(target)) {
    bool go_remote = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      go_remote = contracts_.count(contract_id) && LocalPrefixLocked(contract_id, keys) < keys.size();
    }
    if (go_remote) {  // the remote thread fetches the rest, then runs the local acquire
      std::lock_guard<std::mutex> l(rmu_);
      rfetch_.push_back(RemoteFetch{contract_id, std::vector<Key128>(keys.begin(), keys.end()), target, std::move(done)});
      rcv_.notify_all();
      return;
    }
  }
  AcquireLocal(contract_id, keys, target, std::move(done));
}

void TierManagerImpl::AcquireLocal(uint64_t contract_id, std::span<const Key128> keys, Tier target,
                                   AcquireDone done) {
  std::unique_lock<std::mutex> l(mu_);
  if ((target != Tier::kHbm && target != Tier::kHost) || !has_tier(target)) {
    deferred_.push_back([done = std::move(done), target] {
      done(Status::Unsupported(std::string("Acquire into ") + TierName(target) + ": no such tier here"), {});
    });
    KickLocked();
    return;
  }
  auto ctx = std::make_shared<AcquireCtx>();
  if (TraceCopies()) ctx->t0 = std::chrono::steady_clock::now();
  ctx->done = std::move(done);
  ctx->target = target;
  const int t = Idx(target);
  if (contracts_.count(contract_id)) {
    for (const Key128& k : keys) {
      Block* b = FindLocked({contract_id, k});
      if (!b || !CachedLocked(*b)) break;
      ctx->blocks.push_back(b);
    }
  }
  const size_t n = ctx->blocks.size();
  if (TraceCopies()) ctx->found_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ctx->t0).count();
  // Making room for one block's promotion must not evict or erase another of this prefix.
  // A block named twice (keys may repeat) is held twice.
  for (Block* b : ctx->blocks) b->holds++;
  ctx->slots.resize(n);
  ctx->ok.assign(n, false);
  ctx->pending = n + 1;  // +1 released below, so that instant completions cannot finish early
  // Settles block i of the acquire, under mu_: pinned in the target tier, or lost. Called
  // directly for a block already there, and as the waiter of a promotion.
  auto settle = [this, t](const std::shared_ptr<AcquireCtx>& c, size_t i, bool ok) {
    Block* b = c->blocks[i];
    if (ok && b->slot[t] >= 0) {
      if (b->pins[t]++ == 0) ++pinned_[t];
      policy_[t]->Touch(b->id);
      c->slots[i].tier = c->target;
      c->slots[i].slot = static_cast<uint32_t>(b->slot[t]);
      c->ok[i] = true;
    }
    if (--c->pending == 0) FinishAcquireLocked(c);
  };
  std::vector<uint32_t> todo;  // indices of the blocks to promote
  bool from_host = true;       // every one of them has a host copy to copy from
  for (size_t i = 0; i < n; ++i) {
    Block* b = ctx->blocks[i];
    b->uses++;
    const int found = b->slot[kH] >= 0 ? kH : b->slot[kS] >= 0 ? kS : kN;
    c_[found].hits++;
    ctx->slots[i].from = found == kH ? Tier::kHbm : found == kS ? Tier::kHost : Tier::kNvme;
    if (b->slot[t] >= 0) {
      settle(ctx, i, true);
    } else {
      todo.push_back(static_cast<uint32_t>(i));
      from_host = from_host && b->slot[kS] >= 0 && !b->promo[kH];
    }
  }
  ctx->promoted = todo.size();
  // A host -> HBM restore with room for all of it starts its promotions in host-slot order:
  // the HBM slots are reserved in that order, RunCopies hands them out sorted, and blocks
  // whose host slots are neighbours (a prefix demoted together) land in neighbouring HBM
  // slots, so each group of copies coalesces into a few long DMA copies (0.97 of one big
  // cudaMemcpy) instead of one copy per 144 KiB block. Without room for all, key order:
  // the blocks that miss out are then at the end of the prefix, not inside it.
  if (t == kH && from_host && todo.size() > 1 && hbm_->free_count() >= todo.size()) {
    std::stable_sort(todo.begin(), todo.end(),
                     [&](uint32_t a, uint32_t b) { return ctx->blocks[a]->slot[kS] < ctx->blocks[b]->slot[kS]; });
  }
  // A long restore: this thread sends the copies queued so far itself, first after
  // kInlineFirst blocks, then every kInlineCopies, instead of queueing all of them for the
  // mover after the whole set-up (2,048 blocks: ~0.7 ms under the lock before the first
  // byte moved). The blocks are held and ctx->pending cannot reach zero before the loop
  // ends, so the lock may be let go in between.
  size_t next_send = kInlineFirst;
  for (size_t k = 0; k < todo.size(); ++k) {
    Block* b = ctx->blocks[todo[k]];
    const size_t i = todo[k];
    if (b->slot[t] >= 0) {  // arrived while the lock was let go
      settle(ctx, i, true);
    } else if (!StartPromotionLocked(b, t, [settle, ctx, i](bool ok) { settle(ctx, i, ok); })) {
      settle(ctx, i, false);
    }
    if (k + 1 >= next_send && copies_.size() >= kInlineFirst) {
      if (TraceCopies() && ctx->first_send_us < 0) {
        ctx->first_send_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ctx->t0).count();
      }
      SendCopiesInlineLocked(l);
      next_send = k + 1 + kInlineCopies;
    }
  }
  c_[kN].misses += keys.size() - n;
  if (TraceCopies()) {
    ctx->setup_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ctx->t0).count();
  }
  // Every block already in `target` (or a miss at once): the answer is complete here, and
  // the caller gets it on its own thread instead of after a round trip through the mover
  // (a wake-up and a context switch: most of a 1,000-block host acquire's 120 us).
  std::function<void()> now;
  if (--ctx->pending == 0) FinishAcquireLocked(ctx, &now);
  ReleaseHoldsLocked(ctx->blocks);
  if (ctx->promoted >= kInlineFirst && !copies_.empty()) SendCopiesInlineLocked(l);
  l.unlock();
  if (now) now();
}

void TierManagerImpl::SendCopiesInlineLocked(std::unique_lock<std::mutex>& l) {
  auto batch = std::exchange(copies_, {});
  ++inline_copies_;  // DrainMover waits for it: the batch is neither queued nor in flight yet
  l.unlock();
  RunCopies(std::move(batch));
  l.lock();
  if (--inline_copies_ == 0 && !HasWorkLocked() && copies_in_flight_ == 0) idle_cv_.notify_all();
}

void TierManagerImpl::Prefetch(uint64_t contract_id, std::span<const Key128> keys, Tier target) {
  if ((target != Tier::kHbm && target != Tier::kHost) || !has_tier(target)) return;
  if (remote_) {  // past the local prefix: an acquire on the remote thread, unpinned when done
    bool go_remote = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      go_remote = contracts_.count(contract_id) && LocalPrefixLocked(contract_id, keys) < keys.size();
    }
    if (go_remote) {
      std::lock_guard<std::mutex> l(rmu_);
      rfetch_.push_back(RemoteFetch{contract_id, std::vector<Key128>(keys.begin(), keys.end()), target,
                                    [this](Status, std::vector<SlotRef> slots) {
                                      for (const SlotRef& s : slots) (void)Unpin(s);
                                    }});
      rcv_.notify_all();
      return;
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  if (!contracts_.count(contract_id)) return;
  const int t = Idx(target);
  std::vector<Block*> prefix;
  for (const Key128& k : keys) {
    Block* b = FindLocked({contract_id, k});
    if (!b || !CachedLocked(*b)) break;
    b->holds++;
    prefix.push_back(b);
  }
  for (Block* b : prefix) {
    if (b->slot[t] < 0) (void)StartPromotionLocked(b, t, [](bool) {});
  }
  ReleaseHoldsLocked(prefix);
}

Status TierManagerImpl::Evict(uint64_t contract_id, const Key128& key) {
  std::lock_guard<std::mutex> l(mu_);
  Block* b = FindLocked({contract_id, key});
  if (!b || !CachedLocked(*b)) return Status::NotFound("Evict: block not cached");
  if (b->pins[0] || b->pins[1] || b->io_pins[0] || b->io_pins[1] || b->io_pins[2] || b->busy[0] ||
      b->busy[1] || b->promo[0] || b->promo[1]) {
    return Status::Rejected("Evict: block is pinned or being moved");
  }
  for (int t : {kH, kS}) {
    if (b->slot[t] >= 0) DropCopyLocked(t, b, false);
  }
  if (b->nvme) DropCopyLocked(kN, b, false);
  MaybeEraseLocked(b);
  return Status::Ok();
}

// ---- the mover --------------------------------------------------------------------------

void TierManagerImpl::MoverLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || HasWorkLocked(); });
    if (stop_ && !HasWorkLocked()) break;
    busy_step_ = true;
    work_ = false;
    for (const auto& m : std::exchange(copy_done_, {})) ApplyCopyDone(m);
    MaintainLocked();
    std::promise<Status>* fr = std::exchange(flush_req_, nullptr);
    auto copies = std::exchange(copies_, {});
    auto writes = std::exchange(writes_, {});
    std::vector<Block*> reads;
    const size_t per_batch = std::max<size_t>(opts_.mover_batch, (size_t{32} << 20) / std::max<uint64_t>(1, opts_.slot_bytes));
    const size_t nr = std::min<size_t>(reads_.size(), per_batch);
    reads.assign(reads_.begin(), reads_.begin() + static_cast<long>(nr));
    reads_.erase(reads_.begin(), reads_.begin() + static_cast<long>(nr));
    if (!reads_.empty()) work_ = true;
    auto deferred = std::exchange(deferred_, {});
    l.unlock();
    for (auto& f : deferred) f();
    if (!copies.empty()) RunCopies(std::move(copies));
    if (!writes.empty()) RunWrites(std::move(writes));
    if (!reads.empty()) RunReads(std::move(reads));
    if (fr) fr->set_value(DoFlush(flush_to_));
    l.lock();
    busy_step_ = false;
    if (!HasWorkLocked() && copies_in_flight_ == 0) idle_cv_.notify_all();
  }
}

void TierManagerImpl::Drain() {
  // Remote work, then the mover, then remote work again (the mover's demotions queue
  // remote writes; remote fetches end in local acquires).
  if (remote_ && std::this_thread::get_id() != rreader_.get_id() && std::this_thread::get_id() != rwriter_.get_id() &&
      std::this_thread::get_id() != mover_.get_id()) {
    {
      std::unique_lock<std::mutex> rl(rmu_);
      ridle_cv_.wait(rl, [&] { return rfetch_.empty() && rwrite_.empty() && rbusy_ == 0; });
    }
    DrainMover();
    std::unique_lock<std::mutex> rl(rmu_);
    ridle_cv_.wait(rl, [&] { return rfetch_.empty() && rwrite_.empty() && rbusy_ == 0; });
  }
  DrainMover();
}

void TierManagerImpl::DrainMover() {
  std::unique_lock<std::mutex> l(mu_);
  if (std::this_thread::get_id() == mover_.get_id()) return;
  idle_cv_.wait(l, [&] { return !HasWorkLocked() && copies_in_flight_ == 0 && !busy_step_ && inline_copies_ == 0; });
}

void TierManagerImpl::RunReads(std::vector<Block*> batch) {
  std::vector<NvmeRead> rd(batch.size());
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      const int s = batch[i]->promo[kS]->slot;
      rd[i].id = batch[i]->id;
      rd[i].dst = host_->slot_ptr(static_cast<uint32_t>(s));
      rd[i].dst_capacity = host_->slot_bytes();
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  // Each block is finished as soon as it is read and verified, while the rest of the batch
  // is still in flight: its waiters are pinned, and the host -> HBM copies it unblocks go
  // out in groups of kReadCopyGroup (NVMe -> host -> HBM pipelines per few blocks, not per
  // batch; a copy launch per block would cost the mover more than the copy).
  constexpr size_t kReadCopyGroup = 8;
  std::vector<CopyJob> pending_copies;
  (void)nvme_->ReadBatch(rd, [&](size_t i) {
    {
      std::lock_guard<std::mutex> l(mu_);
      Block* b = batch[i];
      if (--b->io_pins[kN] == 0) --pinned_[kN];
      const bool ok = rd[i].result.ok();
      if (ok) {
        bytes += RoundUp4K(rd[i].len);
      } else if (rd[i].result.IsCorrupt() || rd[i].result.IsNotFound()) {
        // The store drops the record (and counts it): the block is gone from NVMe.
        policy_[kN]->Remove(b->id);
        b->nvme = false;
      }
      FinishPromotionLocked(b, kS, ok);
      for (auto& c : std::exchange(copies_, {})) pending_copies.push_back(c);
    }
    if (pending_copies.size() >= kReadCopyGroup) RunCopies(std::exchange(pending_copies, {}));
  });
  if (!pending_copies.empty()) RunCopies(std::move(pending_copies));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> l(mu_);
  c_[kN].bytes_read += bytes;
  if (secs > 0 && bytes > (16u << 20)) c_[kN].read_gbps = bytes / secs / 1e9;
  KickLocked();
}

void TierManagerImpl::RunWrites(std::vector<std::pair<Block*, bool>> batch) {
  std::vector<NvmeWrite> wr;
  {
    std::lock_guard<std::mutex> l(mu_);
    // Make room on NVMe first: drop its coldest unpinned records.
    const uint32_t free = nvme_->free_records();
    if (free < batch.size()) {
      for (uint32_t k = 0; k < batch.size() - free; ++k) {
        auto v = policy_[kN]->Victim([&](const BlockId& id) {
          Block* b = FindLocked(id);
          return b && EvictableLocked(kN, *b);
        });
        if (!v) break;
        EvictOneLocked(kN, FindLocked(*v), nullptr);
      }
    }
    wr.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      Block* b = batch[i].first;
      wr[i].id = b->id;
      wr[i].parent = b->parent;
      wr[i].payload = host_->slot_ptr(static_cast<uint32_t>(b->slot[kS]));
      wr[i].len = b->bytes;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  (void)nvme_->WriteBatch(wr);
  KVTIER_TEST_POINT("TierManager::Demote:AfterNvmeWrite");  // durable, host copy not yet dropped
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<std::mutex> l(mu_);
  uint64_t bytes = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    Block* b = batch[i].first;
    b->busy[kS] = false;
    if (batch[i].second) --demoting_[kS];
    if (wr[i].result.ok()) {
      bytes += RoundUp4K(b->bytes) + kIoAlign;
      if (!b->nvme) {
        b->nvme = true;
        policy_[kN]->Insert(b->id, BlockId{b->id.contract, b->parent});
      }
      c_[kS].demotions_out++;
    } else {
      budget_used_ -= std::min<uint64_t>(budget_used_, RoundUp4K(b->bytes) + kIoAlign);
    }
    // An eviction frees the host copy now (kept while a client pinned it meanwhile).
    if (batch[i].second && b->pins[kS] == 0 && b->io_pins[kS] == 0 && b->slot[kS] >= 0) {
      DropCopyLocked(kS, b, b->nvme);
    } else if (b->slot[kS] >= 0 && !policy_[kS]->Contains(b->id)) {
      policy_[kS]->Insert(b->id, BlockId{b->id.contract, b->parent});  // pinned meanwhile: stays
    }
    MaybeEraseLocked(b);
  }
  c_[kN].bytes_written += bytes;
  if (secs > 0 && bytes > (16u << 20)) c_[kN].write_gbps = bytes / secs / 1e9;
  RetrySpaceWaitersLocked(kS);
  KickLocked();
}

void TierManagerImpl::RunCopies(std::vector<CopyJob> batch) {
  // One HBM copy batch per direction, one completion each (HbmPool::CopyBatch says why).
  std::vector<CopyJob> jobs[2];  // [0] host -> HBM, [1] HBM -> host
  std::vector<HbmPool::CopyItem> items[2];
  {
    std::lock_guard<std::mutex> l(mu_);
    // Promotions into HBM: hand the batch's reserved HBM slots out again in the order of
    // the blocks' host slots, so that neighbouring host slots land in neighbouring HBM
    // slots and HbmPool coalesces their copies (the slots were reserved in key order, from
    // a free list that eviction order has shuffled). Nothing but the promotion knows a
    // reserved slot yet: its SlotInfo and promo[kH]->slot are rewritten together.
    std::vector<CopyJob*> up;
    bool plain = true;  // every promotion as LaunchLocked left it (else leave the batch as is)
    for (CopyJob& j : batch) {
      if (!j.to_hbm) continue;
      up.push_back(&j);
      const SlotInfo& si = slots_[kH][static_cast<size_t>(j.dst_slot)];
      plain = plain && j.b->promo[kH] && j.b->promo[kH]->slot == j.dst_slot && j.b->slot[kS] >= 0 &&
              si.state == SlotState::kLoading && si.block == j.b;
    }
    if (plain && up.size() > 1) {
      std::vector<int> dst;
      for (CopyJob* j : up) dst.push_back(j->dst_slot);
      std::sort(dst.begin(), dst.end());
      std::sort(up.begin(), up.end(), [](const CopyJob* a, const CopyJob* b) { return a->b->slot[kS] < b->b->slot[kS]; });
      for (size_t k = 0; k < up.size(); ++k) {
        up[k]->dst_slot = dst[k];
        up[k]->b->promo[kH]->slot = dst[k];
        slots_[kH][static_cast<size_t>(dst[k])] = SlotInfo{SlotState::kLoading, up[k]->b, 0};
      }
    }
    for (const CopyJob& j : batch) {
      const int d = j.to_hbm ? 0 : 1;
      const auto hs = static_cast<uint32_t>(j.to_hbm ? j.b->slot[kS] : j.dst_slot);
      const auto ds = static_cast<uint32_t>(j.to_hbm ? j.dst_slot : j.b->slot[kH]);
      jobs[d].push_back(j);
      items[d].push_back({ds, host_->slot_ptr(hs), j.b->bytes});
      ++copies_in_flight_;
    }
  }
  // Copies go out in groups of kCopyGroup blocks, each with its own completion: the mover
  // finishes the promotions of one group (slot tables, policy, waiters) while the next
  // groups are still on the wire, instead of after the whole batch.
  constexpr size_t kCopyGroup = 128;
  for (int d = 0; d < 2; ++d) {
    // In HBM slot order, so that a group holds neighbouring slots and its copies coalesce
    // (HbmPool::CoalesceCopies works within one CopyBatch).
    std::vector<size_t> ord(jobs[d].size());
    for (size_t i = 0; i < ord.size(); ++i) ord[i] = i;
    std::sort(ord.begin(), ord.end(), [&](size_t a, size_t b) { return items[d][a].slot < items[d][b].slot; });
    std::vector<CopyJob> js;
    std::vector<HbmPool::CopyItem> is;
    for (size_t i : ord) {
      js.push_back(jobs[d][i]);
      is.push_back(items[d][i]);
    }
    jobs[d] = std::move(js);
    items[d] = std::move(is);
  }
  for (int d = 0; d < 2; ++d) {
    for (size_t g = 0; g < jobs[d].size(); g += kCopyGroup) {
      const size_t e = std::min(jobs[d].size(), g + kCopyGroup);
      auto group = std::make_shared<std::vector<CopyJob>>(jobs[d].begin() + static_cast<long>(g),
                                                          jobs[d].begin() + static_cast<long>(e));
      std::vector<HbmPool::CopyItem> part(items[d].begin() + static_cast<long>(g),
                                          items[d].begin() + static_cast<long>(e));
      auto cb = [this, group](Status s) {
        std::lock_guard<std::mutex> l(mu_);
        for (const CopyJob& j : *group) {
          copy_done_.push_back({j.b, j.dst_slot, j.to_hbm, j.demote, s});
          --copies_in_flight_;
        }
        KickLocked();
      };
      Status st = hbm_->CopyBatch(part, d == 0, cb);
      if (!st.ok()) cb(st);
    }
  }
}

void TierManagerImpl::ApplyCopyDone(const CopyDoneMsg& m) {
  Block* b = m.b;
  const bool ok = m.st.ok();
  if (!ok) spdlog::warn("tiers: host<->HBM copy failed: {}", m.st.ToString());
  if (m.to_hbm) {
    b->io_pins[kS]--;
    if (ok) c_[kH].bytes_written += b->bytes;
    FinishPromotionLocked(b, kH, ok);
    return;
  }
  b->io_pins[kH]--;
  if (m.demote) {
    b->busy[kH] = false;
    --demoting_[kH];
    if (ok) {
      b->slot[kS] = m.dst_slot;
      slots_[kS][m.dst_slot] = SlotInfo{SlotState::kBlock, b, 0};
      policy_[kS]->Insert(b->id, BlockId{b->id.contract, b->parent});
      c_[kH].demotions_out++;
      if (opts_.remote.write == remote::RemoteWrite::kWriteThrough) QueueRemoteWriteLocked(b);
    } else {
      PoolFree(kS, static_cast<uint32_t>(m.dst_slot));
    }
    if (b->pins[kH] == 0 && b->slot[kH] >= 0) {
      DropCopyLocked(kH, b, ok);
    } else if (b->slot[kH] >= 0 && !policy_[kH]->Contains(b->id)) {
      policy_[kH]->Insert(b->id, BlockId{b->id.contract, b->parent});  // pinned meanwhile: stays
    }
    MaybeEraseLocked(b);
    RetrySpaceWaitersLocked(kH);
  } else {
    FinishPromotionLocked(b, kS, ok);  // HBM -> host promotion (host-only client)
  }
}

// ---- operator actions -----------------------------------------------------------------

Status TierManagerImpl::Flush(Tier to) {
  if (std::this_thread::get_id() == mover_.get_id()) {
    return Status::Invalid("Flush from a TierManager callback would deadlock");
  }
  if (to != Tier::kHost && to != Tier::kNvme) return Status::Invalid("flush: target must be host or nvme");
  std::promise<Status> p;
  auto f = p.get_future();
  {
    std::lock_guard<std::mutex> l(mu_);
    while (flush_req_ != nullptr) {  // one flush at a time
      mu_.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      mu_.lock();
    }
    flush_req_ = &p;
    flush_to_ = to;
    KickLocked();
  }
  Status s = f.get();
  Drain();
  return s;
}

Status TierManagerImpl::DoFlush(Tier to) {
  Status first;
  // HBM: blocks without a copy below go to host first (synchronous copies: operator path).
  if (hbm_) {
    std::vector<std::pair<Block*, uint32_t>> todo;
    {
      std::lock_guard<std::mutex> l(mu_);
      // Collected first: making room in host (below) may erase other blocks from the map.
      std::vector<Block*> in_hbm;
      for (const auto& up : blocks_) {
        if (EvictableLocked(kH, *up)) in_hbm.push_back(up.get());
      }
      for (Block* b : in_hbm) {
        if (b->slot[kH] < 0 || !EvictableLocked(kH, *b)) continue;
        if (b->slot[kS] >= 0 || b->promo[kS]) {
          DropCopyLocked(kH, b, true);
          continue;
        }
        auto s = ReserveLocked(kS, b);
        if (!s) {
          if (first.ok()) first = Status::Rejected("flush: host tier full");
          continue;
        }
        b->busy[kH] = true;
        todo.emplace_back(b, *s);
      }
    }
    for (auto& [b, s] : todo) {
      Status cs = hbm_->CopyToHostSync(static_cast<uint32_t>(b->slot[kH]), host_->slot_ptr(s), b->bytes);
      std::lock_guard<std::mutex> l(mu_);
      b->busy[kH] = false;
      if (cs.ok()) {
        b->slot[kS] = static_cast<int32_t>(s);
        slots_[kS][s] = SlotInfo{SlotState::kBlock, b, 0};
        policy_[kS]->Insert(b->id, BlockId{b->id.contract, b->parent});
        if (b->pins[kH] == 0) DropCopyLocked(kH, b, true);
      } else {
        PoolFree(kS, s);
        if (first.ok()) first = cs;
      }
    }
  }
  if (to == Tier::kHost) return first;
  if (!nvme_) return first.ok() ? Status::Unsupported("flush: no NVMe tier") : first;
  std::vector<std::pair<Block*, bool>> writes;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& up : blocks_) {
      Block* b = up.get();
      if (!EvictableLocked(kS, *b)) continue;
      QueueRemoteWriteLocked(b);
      if (b->nvme) {
        DropCopyLocked(kS, b, true);
        continue;
      }
      if (!AdmitLocked(b, /*force=*/true)) {
        if (first.ok()) first = Status::Rejected("flush: daily NVMe write budget exhausted");
        continue;
      }
      policy_[kS]->Remove(b->id);
      ++demoting_[kS];
      b->busy[kS] = true;
      writes.emplace_back(b, true);
    }
  }
  for (size_t i = 0; i < writes.size(); i += 256) {
    std::vector<std::pair<Block*, bool>> chunk(writes.begin() + static_cast<long>(i),
                                              writes.begin() + static_cast<long>(std::min(writes.size(), i + 256)));
    RunWrites(std::move(chunk));
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      Block* b = (it++)->get();
      MaybeEraseLocked(b);
    }
  }
  return first;
}

Status TierManagerImpl::Reconfigure(const TierManagerOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  if (o.slot_bytes != opts_.slot_bytes || o.hbm.capacity_bytes != opts_.hbm.capacity_bytes ||
      o.host.capacity_bytes != opts_.host.capacity_bytes ||
      o.nvme.tier.capacity_bytes != opts_.nvme.tier.capacity_bytes || o.nvme.dir != opts_.nvme.dir ||
      o.cuda_device != opts_.cuda_device || o.nvme.queue_depth != opts_.nvme.queue_depth) {
    return Status::Invalid("Reconfigure: sizes, folders, device and queue depth cannot change at run time");
  }
  if (o.remote.nodes != opts_.remote.nodes || o.remote.connect_timeout_ms != opts_.remote.connect_timeout_ms ||
      o.remote.command_timeout_ms != opts_.remote.command_timeout_ms || o.remote.pool_size != opts_.remote.pool_size) {
    return Status::Invalid("Reconfigure: the remote tier's nodes, timeouts and pool cannot change at run time");
  }
  std::lock_guard<std::mutex> l(mu_);
  const PolicyKind old[3] = {opts_.hbm.policy, opts_.host.policy, opts_.nvme.tier.policy};
  const PolicyKind now[3] = {o.hbm.policy, o.host.policy, o.nvme.tier.policy};
  opts_ = o;
  for (int t : {kH, kS, kN}) {
    if (old[t] == now[t]) continue;
    policy_[t] = MakePolicy(now[t], Slots(t));
    for (const auto& b : blocks_) {
      const bool in = t == kN ? b->nvme : b->slot[t] >= 0;
      if (in) policy_[t]->Insert(b->id, BlockId{b->id.contract, b->parent});
    }
  }
  KickLocked();
  return Status::Ok();
}

std::vector<TierStats> TierManagerImpl::Stats() const {
  std::vector<TierStats> out;
  std::lock_guard<std::mutex> l(mu_);
  for (int t : {kH, kS, kN}) {
    TierStats s;
    s.tier = TierOf(t);
    s.present = has_tier(s.tier);
    const Counters& c = c_[t];
    s.slots_total = Slots(t);
    s.slots_used = s.present ? UsedLocked(t) : 0;
    const uint64_t unit = t == kN && nvme_ ? nvme_->record_bytes() : opts_.slot_bytes;
    s.capacity_bytes = s.slots_total * unit;
    s.used_bytes = s.slots_used * unit;
    s.blocks = policy_[t] ? policy_[t]->size() : 0;
    s.pinned = pinned_[t];  // kept as pins change: no scan of the block index
    s.hits = c.hits;
    s.misses = c.misses;
    s.promotions_in = c.promotions_in;
    s.demotions_out = c.demotions_out;
    s.bytes_read = c.bytes_read;
    s.bytes_written = c.bytes_written;
    s.evictions_demoted = c.evictions_demoted;
    s.evictions_dropped = c.evictions_dropped;
    s.admission_rejects = c.admission_rejects;
    s.read_gbps = c.read_gbps;
    s.write_gbps = c.write_gbps;
    if (t == kN && nvme_) s.checksum_failures = nvme_->Stats().checksum_failures;
    out.push_back(s);
  }
  if (remote_) {
    const remote::RemoteStats rs = remote_->stats();
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
    s.promotions_in = remote_promotions_;
    s.demotions_out = rs.writes;
    s.write_errors = rs.write_errors + rwrite_dropped_;
    out.push_back(s);
  }
  return out;
}

// ---- operator views and actions ----------------------------------------------------------

namespace {
BlockInfo InfoOf(const Block& b) {
  BlockInfo i;
  i.contract_id = b.id.contract;
  i.key = b.id.key;
  i.parent = b.parent;
  i.bytes = b.bytes;
  i.hbm_slot = b.slot[kH];
  i.host_slot = b.slot[kS];
  i.in_nvme = b.nvme;
  i.pins_hbm = b.pins[kH];
  i.pins_host = b.pins[kS];
  i.uses = b.uses;
  return i;
}
bool InTier(const Block& b, Tier t) {
  switch (t) {
    case Tier::kHbm: return b.slot[kH] >= 0;
    case Tier::kHost: return b.slot[kS] >= 0;
    case Tier::kNvme: return b.nvme;
    default: return b.slot[kH] >= 0 || b.slot[kS] >= 0 || b.nvme;
  }
}
}  // namespace

std::vector<ContractInfo> TierManagerImpl::Contracts() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<ContractInfo> out;
  for (const auto& [id, c] : contracts_) {
    ContractInfo ci;
    ci.id = id;
    ci.contract = c;
    ci.block_bytes = c.block_bytes();
    // Counted by the tiers' policies as blocks enter and leave: no scan of the index.
    for (int t : {kH, kS, kN}) ci.blocks[t] = policy_[t] ? policy_[t]->Count(id) : 0;
    out.push_back(std::move(ci));
  }
  std::sort(out.begin(), out.end(), [](const ContractInfo& a, const ContractInfo& b) { return a.id < b.id; });
  return out;
}

Status TierManagerImpl::ListBlocks(uint64_t contract_id, Tier tier, uint64_t offset, uint32_t limit,
                                   std::vector<BlockInfo>* out, uint64_t* total) const {
  if (tier != Tier::kHbm && tier != Tier::kHost && tier != Tier::kNvme && tier != Tier::kNone) {
    return Status::Invalid("ListBlocks: tier filter must be hbm, host, nvme or none");
  }
  out->clear();
  uint64_t n = 0;
  std::lock_guard<std::mutex> l(mu_);
  if (contract_id != 0 && contracts_.count(contract_id) == 0) {
    return Status::NotFound("contract " + ContractIdHex(contract_id) + " is not registered");
  }
  for (const auto& b : blocks_) {
    if (contract_id != 0 && b->id.contract != contract_id) continue;
    if (!InTier(*b, tier)) continue;
    if (n >= offset && out->size() < limit) out->push_back(InfoOf(*b));
    ++n;
  }
  *total = n;
  return Status::Ok();
}

StatusOr<BlockInfo> TierManagerImpl::InspectBlock(uint64_t contract_id, const Key128& key) const {
  BlockInfo info;
  {
    std::lock_guard<std::mutex> l(mu_);
    const Block* found = nullptr;
    if (contract_id != 0) {
      auto it = blocks_.find(BlockId{contract_id, key});
      if (it != blocks_.end()) found = it->get();
    } else {
      for (const auto& b : blocks_) {
        if (b->id.key == key && InTier(*b, Tier::kNone)) {
          found = b.get();
          break;
        }
      }
    }
    if (found == nullptr || !InTier(*found, Tier::kNone)) {
      return Status::NotFound("block " + key.ToHex() + " is not cached");
    }
    info = InfoOf(*found);
  }
  if (info.in_nvme && nvme_) {
    if (auto e = nvme_->Find({info.contract_id, info.key})) {
      info.nvme_record = e->record;
      info.nvme_hits = e->hits;
      info.payload_xxh3 = e->payload_xxh3;
      info.header_xxh3 = e->header_xxh3;
      info.nvme_verified = e->verified;
    }
  }
  return info;
}

Status TierManagerImpl::VerifyNvme(uint64_t offset, uint32_t limit, VerifyReport* report) {
  *report = VerifyReport{};
  if (limit == 0) return Status::Invalid("VerifyNvme: limit 0");
  if (!nvme_) return Status::Ok();  // nothing to verify
  std::vector<NvmeEntry> ents = nvme_->Entries();
  std::sort(ents.begin(), ents.end(), [](const NvmeEntry& a, const NvmeEntry& b) { return a.record < b.record; });
  report->total = ents.size();
  if (offset >= ents.size()) return Status::Ok();
  const size_t end = static_cast<size_t>(std::min<uint64_t>(ents.size(), offset + limit));
  const uint64_t cap = (opts_.slot_bytes + 4095) / 4096 * 4096;
  constexpr size_t kBatch = 16;
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> buf(static_cast<uint8_t*>(std::aligned_alloc(4096, cap * kBatch)));
  if (!buf) return Status::Rejected("VerifyNvme: out of memory");
  for (size_t i = offset; i < end; i += kBatch) {
    const size_t n = std::min(kBatch, end - i);
    std::vector<NvmeRead> rd;
    std::vector<Block*> held;
    {
      // Pin each block's NVMe copy (as a read for promotion does) so that it is not
      // evicted and its record reused while it is being read.
      std::lock_guard<std::mutex> l(mu_);
      for (size_t j = 0; j < n; ++j) {
        Block* b = FindLocked(ents[i + j].id);
        if (b == nullptr || !b->nvme) {
          ++report->missing;
          continue;
        }
        if (b->io_pins[kN]++ == 0) ++pinned_[kN];
        NvmeRead r;
        r.id = b->id;
        r.dst = buf.get() + rd.size() * cap;
        r.dst_capacity = cap;
        rd.push_back(r);
        held.push_back(b);
      }
    }
    if (!rd.empty()) (void)nvme_->ReadBatch(rd);
    std::lock_guard<std::mutex> l(mu_);
    for (size_t j = 0; j < rd.size(); ++j) {
      Block* b = held[j];
      if (--b->io_pins[kN] == 0) --pinned_[kN];
      ++report->checked;
      const Status& r = rd[j].result;
      if (r.ok()) {
        ++report->ok;
      } else if (r.IsCorrupt() || r.IsNotFound()) {
        // The store dropped the record (and counted a corrupt one): gone from NVMe.
        ++(r.IsCorrupt() ? report->corrupt : report->missing);
        if (b->nvme) {
          policy_[kN]->Remove(b->id);
          b->nvme = false;
        }
        MaybeEraseLocked(b);
      } else {
        ++report->io_errors;
      }
    }
  }
  return Status::Ok();
}

Status TierManagerImpl::EvictContract(uint64_t contract_id, uint64_t* evicted, uint64_t* skipped) {
  uint64_t ev = 0, sk = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (contracts_.count(contract_id) == 0) {
      return Status::NotFound("contract " + ContractIdHex(contract_id) + " is not registered");
    }
    std::vector<Block*> victims;
    for (const auto& b : blocks_) {
      if (b->id.contract == contract_id && CachedLocked(*b)) victims.push_back(b.get());
    }
    for (Block* b : victims) {
      if (b->pins[0] || b->pins[1] || b->io_pins[0] || b->io_pins[1] || b->io_pins[2] || b->busy[0] ||
          b->busy[1] || b->promo[0] || b->promo[1] || b->holds) {
        ++sk;
        continue;
      }
      for (int t : {kH, kS}) {
        if (b->slot[t] >= 0) DropCopyLocked(t, b, false);
      }
      if (b->nvme) DropCopyLocked(kN, b, false);
      MaybeEraseLocked(b);
      ++ev;
    }
  }
  if (evicted) *evicted = ev;
  if (skipped) *skipped = sk;
  return Status::Ok();
}


// ---- the remote tier (docs/remote.md) ----------------------------------------------------

// Copies the host copy of b into the write queue (the slot may be reused once b leaves
// host, so the bytes are taken now, under mu_). Once per block; dropped and counted when
// the queue is full.
void TierManagerImpl::QueueRemoteWriteLocked(Block* b) {
  if (!remote_ || opts_.remote.write == remote::RemoteWrite::kOff || b->remote || b->slot[kS] < 0) return;
  b->remote = true;
  std::lock_guard<std::mutex> l(rmu_);
  if (rwrite_bytes_ + b->bytes > opts_.remote.write_queue_bytes) {
    ++rwrite_dropped_;
    return;
  }
  const uint8_t* p = host_->slot_ptr(static_cast<uint32_t>(b->slot[kS]));
  rwrite_.push_back(RemoteWriteJob{b->id.contract, b->id.key, b->parent, std::vector<uint8_t>(p, p + b->bytes)});
  rwrite_bytes_ += b->bytes;
  rcv_.notify_all();
}

void TierManagerImpl::RemoteWriterLoop() {
  std::unique_lock<std::mutex> l(rmu_);
  while (true) {
    rcv_.wait(l, [&] { return rstop_ || !rwrite_.empty(); });
    if (rwrite_.empty()) break;  // stopping and nothing left
    std::vector<RemoteWriteJob> batch;
    while (!rwrite_.empty() && batch.size() < opts_.remote.batch) {
      rwrite_bytes_ -= rwrite_.front().payload.size();
      batch.push_back(std::move(rwrite_.front()));
      rwrite_.pop_front();
    }
    ++rbusy_;
    l.unlock();
    std::vector<remote::PutItem> items;
    for (const auto& j : batch) items.push_back({j.contract, j.key, j.parent, j.payload});
    const size_t ok = remote_->PutBatch(items);
    if (ok < items.size()) spdlog::debug("remote tier: {} of {} writes failed", items.size() - ok, items.size());
    l.lock();
    --rbusy_;
    if (rfetch_.empty() && rwrite_.empty() && rbusy_ == 0) ridle_cv_.notify_all();
  }
}

void TierManagerImpl::RemoteReaderLoop() {
  std::unique_lock<std::mutex> l(rmu_);
  while (true) {
    rcv_.wait(l, [&] { return rstop_ || !rfetch_.empty(); });
    if (rfetch_.empty()) break;
    RemoteFetch job = std::move(rfetch_.front());
    rfetch_.pop_front();
    ++rbusy_;
    l.unlock();
    const size_t fetched_from = rstop_ ? job.keys.size() : FetchRemote(job);
    // Blocks the fetch staged into host came from the remote tier: say so (unless they
    // have moved on since, e.g. into HBM for another acquire).
    AcquireLocal(job.contract, job.keys, job.target,
                 [done = std::move(job.done), fetched_from](Status s, std::vector<SlotRef> slots) {
                   for (size_t i = fetched_from; i < slots.size(); ++i) {
                     if (slots[i].from == Tier::kHost) slots[i].from = Tier::kRemote;
                   }
                   done(std::move(s), std::move(slots));
                 });
    l.lock();
    --rbusy_;
    if (rfetch_.empty() && rwrite_.empty() && rbusy_ == 0) ridle_cv_.notify_all();
  }
}

// Fetches the keys past the local prefix, in pipelined batches, each verified straight
// into a host slot and committed there (unpinned: the local acquire that follows pins
// it). Stops at the first block the remote tier does not hand back intact.
size_t TierManagerImpl::FetchRemote(RemoteFetch& job) {
  size_t next = 0;
  uint64_t block = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = contracts_.find(job.contract);
    if (it == contracts_.end()) return job.keys.size();
    block = it->second.block_bytes();
    next = LocalPrefixLocked(job.contract, job.keys);
  }
  const size_t first = next;
  while (next < job.keys.size()) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(opts_.remote.batch, job.keys.size() - next));
    std::vector<SlotRef> slots;
    if (!AllocSlots(job.contract, n, Tier::kHost, &slots).ok()) {
      slots.clear();
      if (!AllocSlots(job.contract, 1, Tier::kHost, &slots).ok()) return first;  // host full of pinned blocks
    }
    std::vector<remote::GetItem> items(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      items[i].contract_id = job.contract;
      items[i].key = job.keys[next + i];
      items[i].out = std::span<uint8_t>(host_->slot_ptr(slots[i].slot), block);
    }
    remote_->GetBatch(items);
    size_t good = 0;
    while (good < items.size() && items[good].status.ok()) ++good;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i >= good) {
        (void)FreeSlot(slots[i]);
        continue;
      }
      const Key128& key = items[i].key;
      if (CommitImpl(job.contract, slots[i], key, items[i].parent, true).ok()) {
        (void)Unpin(slots[i]);
        std::lock_guard<std::mutex> l(mu_);
        ++remote_promotions_;
      } else {
        (void)FreeSlot(slots[i]);
      }
    }
    if (good < items.size()) return first;
    next += good;
  }
  return first;
}

}  // namespace kvtier::tiers
