// TierManagerImpl: the storage engine behind TierManager (tier_manager.h).
//
// One class, its methods split over files by data flow (as RocksDB splits DBImpl over
// db_impl_*.cc), on top of classes that own one concern each:
//
//   tier_manager.cc            open, contracts, lookup, alloc / commit / unpin, settings, stats
//   tier_manager_promotion.cc  acquire and prefetch: promotions into HBM or host
//   tier_manager_eviction.cc   eviction, demotion decisions, watermarks, operator evictions
//   tier_manager_mover.cc      the mover thread: NVMe reads and writes, host <-> HBM copies, flush
//   tier_manager_views.cc      operator views (contracts, blocks, inspect, verify)
//   tier_manager_remote.cc     the engine's side of the remote tier (StagingHost, write-back)
//
//   block.h            Block, the block index, MayGo (the one "may this block go" rule)
//   tier_state.h       TierState: settings, arena, slot table, policy, counters per tier
//   nvme_admission.h   NvmeAdmission: which demotions NVMe takes, and the write budget
//   remote_stage.h     RemoteStage: the remote tier's fetch and write-back threads
//
// Locking: one mutex (mu_, an IndexMutex: it spins briefly before sleeping) guards the block index, the tier states, the admission and
// the mover's queues. No I/O or DMA runs under it: the mover thread takes the queued work
// out under the lock, runs the NVMe batches and launches the copies without it, and
// applies the results under it again. User callbacks (AcquireDone) are queued in deferred_
// and run by the mover with no lock held, so they may call back into the TierManager; an
// acquire that completes inside Acquire (nothing to move) runs its callback on the
// caller's thread after mu_ is released, which is just as safe. The remote stage has its
// own mutex, taken after mu_ (QueueRemoteWriteLocked), never before it.
#pragma once

#include <absl/container/btree_set.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/log_limit.h"
#include "common/spin_mutex.h"
#include "tiers/block.h"
#include "tiers/hbm/hbm_pool.h"
#include "tiers/host/host_pool.h"
#include "tiers/nvme/nvme_store.h"
#include "tiers/nvme_admission.h"
#include "tiers/remote_stage.h"
#include "tiers/tier_manager.h"
#include "tiers/tier_state.h"

namespace kvtier::tiers {

// The index lock (mu_): spins up to a few microseconds before it sleeps (common/spin_mutex.h).
using IndexMutex = SpinThenBlockMutex;

// One acquire in progress (tier_manager_promotion.cc).
struct AcquireCtx {
  TierManager::AcquireDone done;
  Tier target = Tier::kNone;
  std::vector<Block*> blocks;
  std::vector<SlotRef> slots;  // slots[i].from is set when block i is found
  std::vector<bool> ok;
  size_t pending = 0;
  // TierManagerOptions::trace_copies: when the acquire came in, and how long its set-up took.
  std::chrono::steady_clock::time_point t0{};
  double setup_us = 0;
  double found_us = 0, first_send_us = -1;  // prefix found and held; first copies sent
  size_t promoted = 0;
};

struct CopyJob {  // host <-> HBM
  Block* b;
  int dst_slot;
  bool to_hbm;  // H2D (promotion) or D2H
  bool demote;  // D2H as eviction (drop the HBM copy after)
};
struct CopyDoneMsg {
  Block* b;
  int dst_slot;
  bool to_hbm, demote;
  Status st;
};

// TierManagerOptions::trace_copies of the last Open or Reconfigure in the process (a log
// switch): acquires of 64 blocks or more log their timeline (set-up under the lock,
// answer); HbmPool logs each copy batch (HbmPoolOptions::trace_copies).
bool TraceCopies();

class TierManagerImpl final : public TierManager, private StagingHost {
 public:
  explicit TierManagerImpl(const TierManagerOptions& o);
  ~TierManagerImpl() override;
  Status Init();

  uint64_t slot_bytes() const override { return slot_bytes_; }
  bool has_tier(Tier t) const override {
    return (t == Tier::kHbm && hbm_) || (t == Tier::kHost && host_) || (t == Tier::kNvme && nvme_) ||
           (t == Tier::kRemote && remote_);
  }
  int host_arena_fd() const override { return host_->fd(); }
  HostPart host_part(uint32_t group) const override {
    const int p = PartOfGroup(group);
    return p < 0 ? HostPart{} : HostPart{host_->part_fd(p), host_->part_offset(p), host_->part_bytes(p)};
  }
  bool InHostPart(uint32_t slot, uint32_t group) const override {
    const int p = PartOfGroup(group);
    return p >= 0 && host_->part_bytes(p) > 0 && host_->PartOfSlot(slot) == p;
  }
  uint64_t host_arena_bytes() const override { return host_->arena_bytes(); }
  uint8_t* host_slot_ptr(uint32_t slot) const override {
    return host_ && slot < host_->id_space() ? host_->slot_ptr(slot) : nullptr;
  }
  uint64_t block_bytes(uint64_t contract_id) const override;
  HostGeometry host_geometry() const override {
    std::lock_guard<std::mutex> l(geometry_mu_);
    return host_geometry_;
  }
  HostGeometry hbm_geometry() const override {
    std::lock_guard<std::mutex> l(geometry_mu_);
    return hbm_geometry_;
  }
  bool classes_at_registration() const override { return classes_at_registration_; }
  uint64_t ContractSlotBytes(uint64_t contract_id, Tier t) const override;
  int HostSlotClass(uint32_t slot) const override;
  SlotFit Fit(const ScaleContract& c) const override;
  SlotFit FitOf(uint64_t contract_id) const override;
  Status CheckRegistrable(const ScaleContract& c) const;
  // Classes made at registration: the host class and the NVMe record class of c's block
  // (existing ones, or new ones); Unsupported past kMaxArenaClasses. Nothing otherwise.
  Status MakeClassesLocked(const ScaleContract& c);
  uint8_t* hbm_base() const override { return hbm_ ? hbm_->base() : nullptr; }
  Status hbm_ipc_handle(uint8_t out[64]) const override {
    if (!hbm_) return Status::Unsupported("no HBM tier");
    return hbm_->IpcHandle(out);
  }
  Status RegisterContract(const ScaleContract& c) override;
  Status RegisterContractAs(const ScaleContract& c, uint64_t id, uint32_t group,
                            const std::string& remote_ns = "") override;
  bool HasContract(uint64_t id) const override {
    std::lock_guard<IndexMutex> l(mu_);
    return contracts_.count(id) != 0;
  }
  bool ForgetContractIfUnused(uint64_t id) override;
  LookupResult Lookup(uint64_t contract_id, std::span<const Key128> keys) override;
  size_t LookupInto(uint64_t contract_id, std::span<const Key128> keys, Tier* tiers_out,
                    double* est_seconds_to_hbm) override;
  void Acquire(uint64_t contract_id, std::span<const Key128> keys, Tier target, AcquireDone done) override;
  Status AllocSlots(uint64_t contract_id, uint32_t n, Tier target, std::vector<SlotRef>* out) override;
  Status Commit(uint64_t contract_id, SlotRef slot, const Key128& key, const Key128& parent,
                const Committer& by, CommitOutcome* outcome) override;
  Status Unpin(SlotRef slot) override;
  Status FreeSlot(SlotRef slot) override;
  Status UnpinAll(std::span<const SlotRef> slots, size_t* failed) override;
  Status FreeSlots(std::span<const SlotRef> slots, size_t* failed) override;
  ContractView View(uint64_t contract_id) const override;
  void Prefetch(uint64_t contract_id, std::span<const Key128> keys, Tier target) override;
  Status Evict(uint64_t contract_id, const Key128& key) override;
  Status Flush(Tier to) override;
  Status Reconfigure(const TierManagerOptions& opts) override;
  std::vector<TierStats> Stats() const override;
  std::vector<GroupStats> GroupStatsAll() const override;
  uint64_t ClientBudgetRejects() const override {
    std::lock_guard<IndexMutex> l(mu_);
    return client_budget_->rejects();
  }
  void Drain() override;
  std::vector<ContractInfo> Contracts() const override;
  std::shared_ptr<const std::vector<uint64_t>> ContractIds() const override;
  std::vector<ContractInfo> ContractInfos(std::span<const uint64_t> ids) const override;
  Status ListBlocks(uint64_t contract_id, Tier tier, uint64_t offset, uint32_t limit,
                    std::vector<BlockInfo>* out, uint64_t* total) const override;
  StatusOr<BlockInfo> InspectBlock(uint64_t contract_id, const Key128& key) const override;
  Status VerifyNvme(uint64_t offset, uint32_t limit, VerifyReport* report) override;
  Status EvictContract(uint64_t contract_id, uint64_t* evicted, uint64_t* skipped) override;

 private:
  // ---- all *Locked methods run with mu_ held ----
  // Unpin and FreeSlot of one slot (UnpinAll and FreeSlots take many a hold). *kick is
  // set when the unpinned block's tier is over its high watermark: the caller kicks the
  // mover once, after its slots.
  Status UnpinLocked(SlotRef ref, bool* kick);
  Status FreeSlotLocked(SlotRef ref);
  TierState& T(int t) { return tiers_[t]; }
  const TierState& T(int t) const { return tiers_[t]; }
  Block* FindLocked(const BlockId& id) {
    auto it = blocks_.find(id);
    return it == blocks_.end() ? nullptr : it->get();
  }
  size_t LocalPrefixLocked(uint64_t contract_id, std::span<const Key128> keys) {
    size_t n = 0;
    for (const Key128& k : keys) {
      Block* b = FindLocked({contract_id, k});
      if (!b || !b->Cached()) break;
      ++n;
    }
    return n;
  }

  // Every insertion into and erasure from the block index goes through these: they keep
  // order_ and blocks_gen_ with it.
  void InsertBlockLocked(std::unique_ptr<Block> b) {
    order_.insert(b->id);
    ++blocks_gen_;
    ++indexed_[b->id.contract];
    blocks_.insert(std::move(b));
  }
  // `id` by value: callers pass the block's own id, which the erase below destroys.
  void EraseBlockLocked(BlockId id) {
    order_.erase(id);
    ++blocks_gen_;
    if (blocks_.erase(id) != 0) {
      auto it = indexed_.find(id.contract);
      if (it != indexed_.end() && --it->second == 0) indexed_.erase(it);
    }
  }
  // tier_manager_views.cc: the index's ids in order_'s order, a snapshot kept until a
  // block comes or goes, copied out of order_ a few hundred ids per hold of mu_.
  std::shared_ptr<const std::vector<BlockId>> BlockIdsSnapshot() const;

  // tier_manager.cc: the internal alloc / commit that the public calls and the remote
  // stage share. CommitLocked returns the block now cached under the key (the new one,
  // or the one already there: then the slot becomes a duplicate, freed by Unpin), or
  // nullptr with *err set. With `outcome` (a client's commit) a key already cached is
  // compared with the slot's bytes and on_conflict applies; without it (the remote
  // stage) the cached block stays.
  Status AllocLocked(uint64_t contract_id, uint32_t n, int t, std::vector<uint32_t>* out);
  Block* CommitLocked(uint64_t contract_id, int t, uint32_t slot, const Key128& key, const Key128& parent,
                      bool pin, bool from_remote, Status* err, CommitOutcome* outcome = nullptr);
  // Compares host slot `slot` (bytes of b) with b's cached bytes: its host copy, else its
  // NVMe record's payload checksum. kUnchecked when neither exists (HBM only).
  CommitOutcome CompareLocked(const Block& b, uint32_t slot) const;

  // tier_manager_eviction.cc
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
  // Drops every copy of a block that MayGo(kAllTiers) and erases it.
  void DropBlockLocked(Block* b);
  // Drops each disputed block (Block::disputed) that may go now (a pass of the mover);
  // the others wait. Unpin drops a disputed block at its last pin itself.
  void DropDisputedLocked();
  // Frees up to `need` slots in tier t by dropping victims that need no I/O (a copy exists
  // below, or the tier drops on eviction). Returns how many were freed.
  // cls: the slot class to free slots of (-1 or a tier of one class: any).
  uint32_t EvictCleanLocked(int t, uint32_t need, int64_t for_group = kNoGroup, int cls = -1);
  std::optional<uint32_t> ReserveLocked(int t, Block* loading_for);
  void EvictOneLocked(int t, Block* b, uint32_t* pending_out);
  // The policy's next victim in tier t that MayGo, other than `except`, that the quotas
  // let go to make room for quota group `for_group` (kNoGroup: the watermarks); cls >= 0:
  // a victim of that slot class only.
  static constexpr int64_t kNoGroup = -1;
  Block* VictimLocked(int t, const Block* except = nullptr, int64_t for_group = kNoGroup, int cls = -1);
  // Quotas (TierManagerOptions::groups): a contract's group, a group's share of tier t in
  // bytes of the tier's slabs (and, for the operator views, in slots of its smallest
  // class), and whether the group's blocks, each weighed by the bytes of its slot
  // (CountingPolicy), pass its share. Bytes, so that a group of large blocks is over its
  // share at the same fill of the tier as a group of small ones.
  bool quotas() const { return !opts_.groups.empty(); }
  uint32_t GroupOfLocked(uint64_t contract) const {
    auto it = group_of_.find(contract);
    return it == group_of_.end() ? 0 : it->second;
  }
  int64_t GroupOfBlockLocked(const Block* b) const {
    return quotas() && b ? static_cast<int64_t>(GroupOfLocked(b->id.contract)) : kNoGroup;
  }
  uint64_t QuotaSlots(int t, uint32_t g) const {
    return g < opts_.groups.size() ? static_cast<uint64_t>(opts_.groups[g].share[t] * T(t).total()) : 0;
  }
  uint64_t QuotaBytes(int t, uint32_t g) const {
    return g < opts_.groups.size()
               ? static_cast<uint64_t>(opts_.groups[g].share[t] * static_cast<double>(T(t).arena_bytes()))
               : 0;
  }
  bool OverShareLocked(int t, uint32_t g) const { return T(t).policy->GroupBytes(g) > QuotaBytes(t, g); }
  // Host parts (TierManagerOptions::host_parts): group -> its part (-1: none, the common
  // pool only; fixed at Init), the part an alloc of tier t for group g takes from, and
  // whether a block's slot in tier t, once freed, serves an alloc for group g (its part
  // or the common pool; any slot for kNoGroup or without parts).
  int PartOfGroup(int64_t g) const {
    return g >= 0 && static_cast<size_t>(g) < part_of_group_.size() ? part_of_group_[static_cast<size_t>(g)] : -1;
  }
  int PartForLocked(int t, int64_t g) const { return t == kS ? PartOfGroup(g) : -1; }
  bool FreesForLocked(int t, const Block& b, int64_t for_group) const {
    if (t != kS || part_of_group_.empty() || for_group == kNoGroup || b.slot[kS] < 0) return true;
    const int q = host_->PartOfSlot(static_cast<uint32_t>(b.slot[kS]));
    return q == host_->num_parts() || q == PartOfGroup(for_group);
  }
  bool SlabFreesForLocked(int t, uint32_t slab, int64_t for_group) const {
    if (t != kS || part_of_group_.empty() || for_group == kNoGroup) return true;
    const int q = host_->PartOfSlab(slab);
    return q == host_->num_parts() || q == PartOfGroup(for_group);
  }
  // The victim predicate's quota part, in the pass (eviction.cc VictimLocked) that takes
  // what the quotas prefer (`first`) or anything they allow.
  bool QuotaLetsGoLocked(int t, uint64_t contract, int64_t for_group, bool first) const;
  // Whether NVMe takes block b (its write charged to the global budget and to the part of
  // the client that committed it). *why (may be null) names the refusal.
  bool AdmitLocked(Block* b, bool force, std::string* why = nullptr);
  // The bytes one client may write per window (ClientWriteBudget; 0 = no limit).
  static uint64_t ClientBudgetBytes(const NvmeOptions& o) {
    return static_cast<uint64_t>(static_cast<double>(o.daily_write_budget_bytes) * o.daily_write_budget_per_client);
  }
  void MaintainLocked();
  // Slab moves between the slot classes of tier t (HBM, host or NVMe, tiers/slab_allocator.h):
  // whether every block of a slab may go now, for quota group `for_group` (kNoGroup: the
  // watermarks), without taking a block of another group within its share; evicting the
  // blocks of a slab (returns the demotions begun); and the starvation rule, which moves
  // one slab to class `cls` when it applies (true: a move began or finished; the class may
  // have room now).
  bool SlabMovableLocked(int t, uint32_t slab, int64_t for_group) const;
  // The block in slot `slot` of tier t (NVMe: record `slot`, the block its index entry
  // names), or null; and the slot (NVMe: record) of b's copy in tier t, or -1.
  Block* BlockInSlotLocked(int t, uint32_t slot) const;
  int64_t SlotOfLocked(int t, const Block& b) const;
  uint32_t EvictSlabLocked(int t, uint32_t slab);
  // `need`: the slots the caller is short of.
  bool TakeSlabLocked(int t, int cls, int64_t for_group, uint32_t need);

  // tier_manager_promotion.cc. StartPromotionLocked returns false when the promotion
  // could not even start.
  bool StartPromotionLocked(Block* b, int t, Waiter w);
  void LaunchLocked(Block* b, int t);
  void RetrySpaceWaitersLocked(int t);
  void FinishPromotionLocked(Block* b, int t, bool ok);
  // Queues ctx's answer for the mover to deliver, or, with `now` (an acquire that finished
  // inside Acquire: nothing had to move), hands it to the caller to run after unlocking.
  void FinishAcquireLocked(const std::shared_ptr<AcquireCtx>& ctx, std::function<void()>* now = nullptr);
  void AcquireLocal(uint64_t contract_id, std::span<const Key128> keys, Tier target, AcquireDone done);
  // Queues a fetch of the keys past the local prefix when a remote tier may have them;
  // false when the local acquire can run at once.
  bool MaybeFetchRemote(uint64_t contract_id, std::span<const Key128> keys, Tier target, AcquireDone& done);

  // tier_manager_remote.cc
  void QueueRemoteWriteLocked(Block* b);
  bool LocalPrefix(uint64_t contract, std::span<const Key128> keys, uint64_t* block_bytes, size_t* prefix,
                   std::string* remote_ns) override;
  std::vector<Slot> ReserveStaging(uint64_t contract, uint32_t n) override;
  size_t CommitStaging(uint64_t contract, std::span<const Slot> slots, std::span<const remote::GetItem> items,
                       size_t good, std::vector<Block*>* held) override;
  void AcquireStaged(RemoteFetch job, std::vector<Block*> held, size_t fetched_from) override;

  // tier_manager_mover.cc
  void KickLocked() {
    work_ = true;
    cv_.notify_all();
  }
  void MoverLoop();
  void DrainMover();
  bool HasWorkLocked() const {
    return work_ || !reads_.empty() || !writes_.empty() || !copies_.empty() || !deferred_.empty() ||
           !copy_done_.empty() || flush_req_ != nullptr;
  }
  void RunReads(std::vector<Block*> batch);
  void RunWrites(std::vector<std::pair<Block*, bool>> batch);
  void RunCopies(std::vector<CopyJob> batch);
  void SendCopiesInlineLocked(std::unique_lock<IndexMutex>& l);
  void ApplyCopyDone(const CopyDoneMsg& m);
  Status DoFlush(Tier to);
  // The check of a copy out of HBM: Corrupt when the `bytes` at `host` (the copy of HBM
  // slot `hbm_slot`) do not hash to the value taken when the block entered HBM, or when
  // none was taken. Reads no TierManager state: runs without mu_.
  Status CheckLeftHbm(uint32_t hbm_slot, const void* host, uint64_t bytes) const;
  // A copy out of HBM that failed CheckLeftHbm: counted in the HBM tier's
  // checksum_failures and logged (rate-limited) with the client that committed it.
  void ReportChangedLocked(const Block* b, uint32_t hbm_slot, const Status& why);

  TierManagerOptions opts_;
  // opts_.slot_bytes, which never changes: read without the lock (attach, registrations,
  // verify) while Reconfigure writes opts_ on another thread.
  const uint64_t slot_bytes_;
  // opts_.classes_at_registration, fixed at start (Reconfigure refuses a change): read
  // here, never through opts_, which a reload rewrites while registrations run.
  const bool classes_at_registration_;
  // Set by Init; classes made at registration are appended (MakeClassesLocked) under
  // geometry_mu_ too, which readers outside mu_ take (host_geometry(), hbm_geometry()).
  mutable std::mutex geometry_mu_;
  HostGeometry host_geometry_;
  HostGeometry hbm_geometry_;
  std::unique_ptr<HbmPool> hbm_;
  std::unique_ptr<HostPool> host_;
  std::unique_ptr<NvmeStore> nvme_;
  std::unique_ptr<RemoteStage> remote_;

  mutable IndexMutex mu_;
  std::condition_variable_any cv_, idle_cv_;
  // Registered contracts, immutable once registered: a listing copies the pointer under the
  // lock and the contract outside it.
  std::unordered_map<uint64_t, std::shared_ptr<const ScaleContract>> contracts_;
  std::atomic<uint64_t> contracts_gen_{0};  // bumped (under mu_) when a contract comes or goes
  mutable std::mutex ids_mu_;                // protects ids_snap_, ids_gen_
  mutable std::shared_ptr<const std::vector<uint64_t>> ids_snap_;  // sorted; ContractIds()
  mutable uint64_t ids_gen_ = 0;            // contracts_gen_ that ids_snap_ reflects
  GroupMap group_of_;  // contract -> quota group (RegisterContractAs); with quotas only
  std::vector<int> part_of_group_;  // with host parts: group -> host part (-1: none); fixed at Init
  // contract -> its remote namespace (RegisterContractAs); contracts without one are absent.
  std::unordered_map<uint64_t, std::string> remote_ns_;
  std::string RemoteNsLocked(uint64_t contract) const {
    auto it = remote_ns_.find(contract);
    return it == remote_ns_.end() ? std::string() : it->second;
  }
  std::vector<std::array<uint64_t, 3>> group_evictions_;  // [group][tier]
  BlockIndex blocks_;
  // The ids of blocks_ in (contract, key) order, for the listings: a page walks a snapshot
  // of them (BlockIdsSnapshot) a few hundred at a time instead of blocks_ under mu_ for
  // its length. blocks_gen_ is bumped whenever a block comes or goes.
  struct BlockIdLess {
    bool operator()(const BlockId& a, const BlockId& b) const {
      return a.contract != b.contract ? a.contract < b.contract : a.key < b.key;
    }
  };
  absl::btree_set<BlockId, BlockIdLess> order_;
  uint64_t blocks_gen_ = 0;
  // Blocks of each contract in the index, in a tier or on their way between two (a
  // demotion takes a block out of one tier's policy before the next tier's takes it in):
  // a contract with any is not forgotten, so its blocks keep their quota group.
  std::unordered_map<uint64_t, uint64_t> indexed_;
  mutable std::mutex order_mu_;  // taken before mu_, never under it: order_snap_, order_gen_
  mutable std::shared_ptr<const std::vector<BlockId>> order_snap_;
  mutable uint64_t order_gen_ = 0;  // blocks_gen_ that order_snap_ reflects
  TierState tiers_[3];  // indexed by kH, kS, kN
  std::unique_ptr<NvmeAdmission> admission_;
  // Each client's part of the write budget (AdmitLocked), and its refusals' log line.
  std::unique_ptr<ClientWriteBudget> client_budget_;
  LogLimit client_budget_log_;
  // Blocks lost on the way down (an eviction whose NVMe write failed): counted in the host
  // tier's evictions_dropped, logged at most once per interval.
  LogLimit drop_log_;
  // Blocks found changed on their way out of HBM (ReportChangedLocked), logged at most
  // once per interval.
  LogLimit changed_log_;
  // Per HBM slot: the client that committed the block in it (0: promoted, or none).
  std::vector<uint64_t> hbm_client_;
  // Mover queues.
  std::vector<Block*> reads_;                    // NVMe -> host promotions (slot in promo[kS])
  std::vector<std::pair<Block*, bool>> writes_;  // host -> NVMe (bool: eviction)
  std::vector<CopyJob> copies_;
  std::vector<BlockId> disputed_;  // disputed blocks, swept by MaintainLocked (gone ones too)
  std::vector<std::function<void()>> deferred_;  // user callbacks, run without mu_
  std::vector<CopyDoneMsg> copy_done_;           // from CUDA host callbacks
  uint32_t copies_in_flight_ = 0;
  uint32_t inline_copies_ = 0;  // copy batches an acquiring thread is sending (SendCopiesInlineLocked)
  static constexpr size_t kInlineFirst = 64, kInlineCopies = 256;
  bool work_ = false, stop_ = false, busy_step_ = false;
  std::promise<Status>* flush_req_ = nullptr;
  Tier flush_to_ = Tier::kNvme;  // with flush_req_
  std::thread mover_;
};

}  // namespace kvtier::tiers
