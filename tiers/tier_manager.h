// TierManager: the three tiers (HBM, pinned host, NVMe), the block index over them, the
// pins that keep leased blocks in place, eviction, admission and the mover.
//
// This is the interface the daemon (daemon/) drives; it knows nothing about clients,
// sockets or rings. The daemon keeps leases (which client pinned what) and calls Pin /
// Unpin / FreeSlot here; the TierManager guarantees that a pinned block is never evicted
// and a pinned slot is never reused.
//
// Identity: a block is (contract_id, key). Slots: the HBM and host tiers hold slot size
// classes (tiers.slot_classes; the largest is slot_bytes(), fixed at open from the
// config) in slabs, and a contract's blocks take the smallest class that holds them; one
// whose block does not fit slot_bytes() is refused at registration. NVMe records are
// 4096 + a class's bytes, in slabs of nvme.slab_bytes (tiers/nvme/nvme_store.h). HBM and host slot ids are offsets in units of the tier's granule
// (offset = slot * granule): HBM ids are what the decode kernels take as block-table
// entries (their pool stride is the granule), host ids index the memfd arena
// (HostPool::slot_offset; docs/tiers.md, "Slot arenas").
//
// Threading: every public method is thread-safe. Methods that may wait on I/O or DMA
// complete through a callback that runs on a TierManager worker thread; they never
// block the caller. Everything else returns quickly (no I/O under the caller's thread).
// Exception: an Acquire with nothing to move (every block of the prefix already in the
// target tier, or no hit) runs its callback on the caller's thread before returning, with
// no TierManager lock held; a caller must not hold a lock there that its callback takes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/contract.h"
#include "formats/keys.h"
#include "formats/status.h"
#include "formats/tier_stats_fields.h"
#include "tiers/hbm/hbm_pool.h"
#include "tiers/policy/policy_options.h"
#include "tiers/remote/remote_options.h"
#include "tiers/slab_allocator.h"
#include "tiers/types.h"

namespace kvtier::tiers {

struct TierOptions {
  uint64_t capacity_bytes = 0;   // 0 = tier disabled. Rounded down to whole slots. Default: 0
  PolicyKind policy = PolicyKind::kLru;  // Default: lru (docs/tiers.md compares them)
  PolicyOptions policy_options;          // the policy's knobs. Default: see policy_options.h
  double high_watermark = 0.95;  // start evicting above this fill. Default: 0.95
  double low_watermark = 0.85;   // evict down to this fill. Default: 0.85
  OnEvict on_evict = OnEvict::kDemote;  // demote to the next tier or drop. Default: demote

  // Invalid unless 0 < low_watermark <= high_watermark <= 1.
  Status Validate(const char* tier_name) const;
};

struct NvmeOptions {
  TierOptions tier;                 // on_evict is always drop for the last tier
  std::string dir;                  // folder holding data files and the RocksDB index
  Admission admission = Admission::kAlways;  // Default: always
  uint64_t daily_write_budget_bytes = 0;     // 0 = unlimited. Default: 0
  // Share of daily_write_budget_bytes the blocks one writer committed may spend, in
  // (0, 1] (Committer::uid: kvtierd charges the committing process's user); no limit per
  // writer while the budget is unlimited. Default: 0.5
  double daily_write_budget_per_client = 0.5;
  uint32_t queue_depth = 64;        // io_uring depth. Default: 64
  bool verify_on_restart = true;    // verify every block before first serve. Default: true
  // With several slot classes, the record slabs (NvmeStoreOptions::slab_bytes): a 4 KiB
  // multiple that holds a record of the largest class. A tier smaller than a slab keeps one
  // record class of slot_bytes. Default: kDefaultSlabBytes (64 MiB)
  uint64_t slab_bytes = kDefaultSlabBytes;
};

// Who commits a block (TierManager::Commit).
struct Committer {
  // Named in the log line if its HBM block is found changed when it leaves HBM (0: none).
  uint64_t client = 0;
  // Charged for the block's NVMe write (NvmeOptions::daily_write_budget_per_client): the
  // user id of the committing process, as the kernel reports it (-1: none, no part of
  // its own). A user, not an attach: a client that detaches and attaches again, or forks,
  // keeps what it spent.
  int64_t uid = -1;
};

// tiers.on_conflict: what a commit of an already cached key with different bytes does.
enum class OnConflict : uint8_t {
  kKeepFirst,     // the cached block stays; the new bytes are discarded
  kReplace,       // the new bytes replace the cached block (unless it is pinned or moving)
  kDropDisputed,  // both go: the new bytes discarded, the cached block evicted (if pinned or
                  // moving: served no more, and dropped once its pins and moves end)
};

// What one commit did with its bytes (TierManager::Commit's *outcome).
enum class CommitOutcome : uint8_t {
  kStored,     // the key was not cached: the block holds the committed bytes
  kSame,       // already cached with equal bytes: the cached block stays
  kDifferent,  // already cached with other bytes: OnConflict decided, and the committed
               // bytes were not stored (keep-first, drop-disputed, replace of a pinned block)
  kUnchecked,  // already cached where no bytes are compared (its only copy in HBM, or an
               // HBM commit): handled as before comparisons existed
  kReplaced,   // already cached with other bytes, and replace stored the committed bytes
  kDisputed,   // drop-disputed found other bytes under this key before, and the disputed
               // block is still pinned or moving: nothing is served under the key and these
               // bytes are not stored; a commit after the block goes is stored
};

// One quota group (the daemon's tenants, docs/security.md): share[t] of tier t's bytes
// (t = hbm, host, nvme; the bytes of the tier's slabs), in [0, 1], is what the blocks of
// other groups cannot push this group's blocks below. A block weighs the bytes of the
// slot (NVMe: record) its class takes, so a share means the same fill of the tier
// whatever the sizes of the group's blocks. Eviction for a group over its share takes its
// own blocks first; eviction for anyone else (another group's alloc or promotion, the watermarks) takes
// only blocks of groups over their share, or the requester's own. Group 0 (contracts
// registered without a group) never has a share.
struct GroupShare {
  double share[3] = {0, 0, 0};
};

struct TierManagerOptions {
  uint64_t slot_bytes = 1474560;  // one block; 4 KiB multiple. Default: 80x8x128x16 NVFP4
  // The host tier's slot size classes (tiers/slab_allocator.h), sharing the host tier's
  // slabs of slab_bytes by demand. Empty: one class of slot_bytes in one slab (the arena of
  // equal slots). When given, the largest is slot_bytes (the slot of HBM and NVMe).
  // Default: empty
  std::vector<uint64_t> slot_classes;
  uint64_t slab_bytes = kDefaultSlabBytes;  // with slot_classes: a 4 KiB multiple >= slot_bytes. Default: 64 MiB
  // Slot classes made at registration (docs/tiers.md "Classes made at registration"):
  // slot_bytes is the largest block a contract may have (kDefaultMaxBlockBytes, 64 MiB, is
  // the usual limit); a registration makes the host class of its block rounded up to the
  // host granule (AutoGranule of the host capacity) in slabs of AutoSlabBytes, and the
  // NVMe record class of its block (records sized by their blocks, in slabs of
  // AutoSlabBytes(nvme capacity, slot_bytes + 4096)), and the HBM class of its block
  // rounded up to the HBM granule (AutoGranule of the HBM capacity, in slabs of
  // AutoSlabBytes of it). slot_classes must be empty and slab_bytes / nvme.slab_bytes are
  // not used. Default: false
  bool classes_at_registration = false;
  TierOptions hbm;                // needs CUDA and a GPU; ignored (tier absent) otherwise
  int cuda_device = 0;            // Default: 0
  // How the HBM tier copies host -> HBM and over how many streams (HbmPoolOptions::copy,
  // ::streams). Default: kAuto, 1
  HbmCopy hbm_copy = HbmCopy::kAuto;
  int hbm_copy_streams = 1;
  // Log the timeline of every acquire of 64 blocks or more and of every HBM copy batch.
  // Default: false
  bool trace_copies = false;
  TierOptions host;               // required (>= 1 slot): NVMe reads land in host slots
  NvmeOptions nvme;
  // Batching of the mover: NVMe reads per io_uring batch, at least mover_batch blocks and
  // at least 32 MiB of slots (small blocks need more reads in flight to keep the disk
  // busy; the copies to HBM start per block as reads complete). Default: 64
  uint32_t mover_batch = 64;
  // Bandwidths used for LookupResult::est_seconds_to_hbm until measured. Default: 50, 2
  double host_to_hbm_gbps = 50.0;
  double nvme_read_gbps = 2.0;
  // The remote tier (a Redis Cluster shared by a fleet, docs/remote.md), below NVMe.
  // Disabled while remote.nodes is empty. Default: disabled
  remote::RemoteOptions remote;
  // Seed of the block index's hash (tiers/block_index.h). 0 (the default): a random one per
  // TierManager, so that no client can pick keys that collide in the index of another
  // daemon. Tests set it to build keys that collide on purpose.
  uint64_t index_seed = 0;
  // Quota groups, indexed by group id (entry 0 is group 0's and must be all zero). Empty:
  // no quotas, eviction follows the policies alone. Fixed at open. Default: empty
  std::vector<GroupShare> groups;
  // With groups: each group with a host share owns a part of the host tier of that share
  // (HostPool parts, a memfd each: a client of the group maps its part, docs/security.md
  // "Memory isolation"); its host slots come from its part first, then from the common
  // pool (the rest of the tier), and an eviction for it takes only blocks whose slots it
  // can use (in its part or the common pool). The share becomes memory no other group
  // uses. false: one arena shared by every group. Default: false
  bool host_parts = false;
  // A commit of a cached key with other bytes (tiers.on_conflict). Default: keep-first
  OnConflict on_conflict = OnConflict::kKeepFirst;

  Status Validate() const;
};

// One quota group's figures per local tier (hbm, host, nvme).
struct GroupStats {
  uint64_t blocks[3] = {0, 0, 0};     // blocks of the group the tier holds
  // Its share in slots (records on NVMe) of the tier's smallest class: how many blocks of
  // that class it protects. Blocks of a larger class count for more (quota_bytes).
  uint64_t quota[3] = {0, 0, 0};
  uint64_t evictions[3] = {0, 0, 0};  // copies of its blocks evicted from the tier
  // What the quotas weigh: the bytes of the slots (records) its blocks take, and its share
  // of the tier's bytes. Over its share when bytes > quota_bytes.
  uint64_t bytes[3] = {0, 0, 0};
  uint64_t quota_bytes[3] = {0, 0, 0};
};

// Where a contract's blocks go in the host tier: its slot class, that class's slot size,
// and block bytes / slot bytes.
// Where the slots of the host (or HBM) tier are: slot s at arena offset s * granule;
// classes smallest first (one: slot_bytes).
struct HostGeometry {
  uint64_t granule = 0;
  uint64_t slab_bytes = 0;
  uint64_t arena_bytes = 0;
  uint32_t num_slabs = 0;
  std::vector<uint64_t> classes;   // slot bytes of each class
  std::vector<uint32_t> per_slab;  // slots of each class in a slab
  std::vector<uint32_t> most;      // the most slots of each class (every slab of it)
};

// A part of the host arena (TierManagerOptions::host_parts): its memfd (sealed: it maps
// read-only), and where it lies in the arena. bytes 0: the group has no part.
struct HostPart {
  int fd = -1;
  uint64_t offset = 0, bytes = 0;
};

struct SlotFit {
  int cls = -1;
  uint64_t slot_bytes = 0;
  double fill = 0.0;
};

// What a request needs to know about one contract, read in one hold of the index lock
// (TierManager::View), so that a request asks once rather than once per fact (whether it
// is registered, its block size, its slot in each tier, its host fit).
struct ContractView {
  bool registered = false;   // false: every other field is zero
  uint64_t block_bytes = 0;  // bytes of one block
  // The bytes of the slot its blocks take in HBM and host: their class in each tier
  // (ContractSlotBytes); 0 for a tier absent.
  uint64_t hbm_slot_bytes = 0;
  uint64_t host_slot_bytes = 0;
  SlotFit fit;  // its host slot class and fill (FitOf)
};

// Per-block answer of a lookup, in key order, up to the first miss.
struct LookupResult {
  size_t hit_blocks = 0;            // length of the longest cached prefix
  std::vector<Tier> tiers;          // tiers[i] for i < hit_blocks
  double est_seconds_to_hbm = 0.0;  // from measured tier bandwidths (0 if all in HBM)
};

// One pinned block, as Acquire/Alloc return it.
struct SlotRef {
  Tier tier = Tier::kNone;
  uint32_t slot = 0;
  // Acquire: where the block was when the acquire found it (the fastest tier holding it,
  // kRemote for a block the acquire fetched from the remote tier). kNone elsewhere.
  Tier from = Tier::kNone;
};

// One tier's statistics. The counters are the field list of the record the daemon sends
// and the C ABI hands out (formats/tier_stats_fields.h: what each one means);
// daemon/stats_record.h converts. The remote tier's corrupt values are counted in
// checksum_failures; its errors and write_errors are node down/slow (IoError) answers and
// writes dropped or failed.
struct TierStats {
  Tier tier = Tier::kNone;
  bool present = false;
#define KVTIER_TIER_STATS_MEMBER_(type, name) type name = 0;
  KVTIER_TIER_STATS_FIELDS(KVTIER_TIER_STATS_MEMBER_)
#undef KVTIER_TIER_STATS_MEMBER_
  // Slabs moved from one slot class to another (tiers/slab_allocator.h); 0 for a tier of
  // one class.
  uint64_t slab_moves = 0;
};

// Operator views (kvtierctl): one registered contract and what it holds per tier.
struct ContractInfo {
  uint64_t id = 0;
  ScaleContract contract;
  uint64_t block_bytes = 0;
  uint64_t blocks[3] = {0, 0, 0};  // cached copies per tier: hbm, host, nvme
};

// One indexed block. The NVMe fields are filled by InspectBlock only (they need a lookup
// in the NVMe index); ListBlocks leaves them zero.
struct BlockInfo {
  uint64_t contract_id = 0;
  Key128 key, parent;
  uint64_t bytes = 0;
  int32_t hbm_slot = -1, host_slot = -1;
  bool in_nvme = false;
  uint32_t pins_hbm = 0, pins_host = 0;
  uint32_t uses = 0;
  bool nvme_verified = false;
  uint32_t nvme_record = 0, nvme_hits = 0;  // nvme_record: its byte offset in the store / 4096
  uint64_t payload_xxh3 = 0, header_xxh3 = 0;
};

// Outcome of one VerifyNvme page.
struct VerifyReport {
  uint64_t total = 0;      // NVMe records indexed
  uint64_t checked = 0;    // records read in this page
  uint64_t ok = 0, corrupt = 0, missing = 0, io_errors = 0;
};

class TierManager {
 public:
  virtual ~TierManager() = default;

  // Opens the tiers. An existing NVMe folder is a warm restart: its index is loaded and
  // each block is verified against its checksum before it is first served.
  static StatusOr<std::unique_ptr<TierManager>> Open(const TierManagerOptions& opts);

  virtual uint64_t slot_bytes() const = 0;
  virtual bool has_tier(Tier t) const = 0;
  // memfd of the host arena (size host_arena_bytes()), for SCM_RIGHTS to clients. Sealed
  // against writes: it maps read-only everywhere but in this process. -1 with host parts.
  virtual int host_arena_fd() const = 0;
  // With host parts (TierManagerOptions::host_parts): the part of quota group `group`
  // (bytes 0 when it has none), and whether host slot `slot` lies in it. Without: none.
  virtual HostPart host_part(uint32_t group) const { (void)group; return {}; }
  virtual bool InHostPart(uint32_t slot, uint32_t group) const { (void)slot; (void)group; return false; }
  virtual uint64_t host_arena_bytes() const = 0;
  // This process's writable address of host slot `slot` (nullptr without a host tier or
  // for a slot out of range). For the daemon's own copies into a slot it allocated (the
  // commit of a client's staged block) and for in-process users (tests, benchmarks).
  virtual uint8_t* host_slot_ptr(uint32_t slot) const { (void)slot; return nullptr; }
  // Bytes of one block of a registered contract; 0 for a contract not registered.
  virtual uint64_t block_bytes(uint64_t contract_id) const { (void)contract_id; return 0; }
  // Where the host arena's slots are (granule and slot classes): a copy, taken under a
  // lock, since registrations add classes (TierManagerOptions::classes_at_registration);
  // the granule, slabs and arena are fixed at open, classes only ever appended.
  virtual HostGeometry host_geometry() const = 0;
  // The HBM tier's (empty without one): the host's classes when its arena holds a slab of
  // them, else one class of slot_bytes; its own classes when they are made at registration.
  virtual HostGeometry hbm_geometry() const = 0;
  // Whether the tiers make a slot class per contract as it registers
  // (TierManagerOptions::classes_at_registration).
  virtual bool classes_at_registration() const { return false; }
  // The bytes of the slot a registered contract's blocks take in tier `t` (kHbm or kHost:
  // its class there, which may have another index in each tier); 0 for a contract not
  // registered, or a tier absent.
  virtual uint64_t ContractSlotBytes(uint64_t contract_id, Tier t) const {
    (void)contract_id, (void)t;
    return 0;
  }
  // The slot class of a taken host slot; -1 for an id that is not one.
  virtual int HostSlotClass(uint32_t slot) const = 0;
  // The host slot class a contract's blocks take and how full its slots are (cls -1:
  // none holds them; RegisterContract refuses it).
  virtual SlotFit Fit(const ScaleContract& c) const = 0;
  // Fit() of a registered contract (cls -1 for one not registered).
  virtual SlotFit FitOf(uint64_t contract_id) const = 0;
  // Device pointer of the HBM arena in this process (slot s at + s * slot_bytes()), for
  // in-process users (tests, benchmarks); nullptr without an HBM tier. Clients use the
  // IPC handle instead.
  virtual uint8_t* hbm_base() const { return nullptr; }
  // CUDA IPC handle of the HBM arena (64 bytes). Unsupported without an HBM tier.
  virtual Status hbm_ipc_handle(uint8_t out[64]) const = 0;

  // Refuses (Unsupported) a contract whose block does not fit a slot. Idempotent.
  virtual Status RegisterContract(const ScaleContract& c) = 0;
  // The same under an id of the caller's (a namespace's: the daemon derives one per
  // tenant, so that two tenants' blocks of one contract are two blocks), counted in quota
  // group `group` (< TierManagerOptions::groups.size(), or 0). Every other call names the
  // contract by this id. `remote_ns` ("" = none) is the namespace of the contract's keys
  // in the remote tier (remote::PutItem::ns: <key_prefix><remote_ns>:{...}, docs/remote.md),
  // so that a namespace's blocks are keys of its own in the cluster. Invalid for id 0, a
  // group out of range, a namespace the remote tier cannot take (remote::CheckKeyPart), or
  // an id already registered in another group or remote namespace.
  virtual Status RegisterContractAs(const ScaleContract& c, uint64_t id, uint32_t group,
                                    const std::string& remote_ns = "") {
    (void)c, (void)id, (void)group, (void)remote_ns;
    return Status::Unsupported("RegisterContractAs");
  }
  virtual bool HasContract(uint64_t contract_id) const = 0;
  // Everything ContractView holds about a contract, in one hold of the index lock
  // (registered false for one not registered).
  virtual ContractView View(uint64_t contract_id) const {
    ContractView v;
    v.registered = HasContract(contract_id);
    if (!v.registered) return v;
    v.block_bytes = block_bytes(contract_id);
    v.hbm_slot_bytes = ContractSlotBytes(contract_id, Tier::kHbm);
    v.host_slot_bytes = ContractSlotBytes(contract_id, Tier::kHost);
    v.fit = FitOf(contract_id);
    return v;
  }
  // Forgets a registered contract that no tier holds a block of (its registration's
  // memory freed); true when it did. A later registration brings it back.
  virtual bool ForgetContractIfUnused(uint64_t contract_id) {
    (void)contract_id;
    return false;
  }

  // Longest cached prefix of `keys` and where each block lives. No local I/O; with a
  // remote tier, the keys past the local prefix are asked of it (one pipelined EXISTS
  // batch, bounded by its command timeout) and reported as Tier::kRemote.
  virtual LookupResult Lookup(uint64_t contract_id, std::span<const Key128> keys) = 0;
  // The same lookup without allocating: writes tiers_out[i] for i < the returned hit
  // count (tiers_out has room for keys.size()); entries past it are left as they were.
  virtual size_t LookupInto(uint64_t contract_id, std::span<const Key128> keys, Tier* tiers_out,
                            double* est_seconds_to_hbm) = 0;

  // Promotes the longest cached prefix of `keys` into `target` (kHbm, or kHost for
  // clients without a GPU) and pins each block there. `done` gets the pinned slots of the
  // prefix (possibly shorter than keys: a block lost on the way ends the prefix).
  // Concurrent acquires of the same block share one promotion. With a remote tier, the
  // keys past the local prefix are first fetched from it (verified, then committed to
  // host) on the remote thread; a remote miss, error or corrupt value ends the prefix.
  // When nothing has to move (and nothing is fetched), `done` runs inline, before Acquire
  // returns (see Threading above).
  using AcquireDone = std::function<void(Status, std::vector<SlotRef>)>;
  virtual void Acquire(uint64_t contract_id, std::span<const Key128> keys, Tier target,
                       AcquireDone done) = 0;

  // Reserves n free slots in `target` (evicting if needed), pinned and invisible until
  // committed. Retry when the tier is full of pinned blocks.
  virtual Status AllocSlots(uint64_t contract_id, uint32_t n, Tier target,
                            std::vector<SlotRef>* out) = 0;
  // Makes an allocated slot's bytes visible as (contract, key). The block stays pinned
  // until Unpin. A key already cached is compared with the slot's bytes (a host commit:
  // against the host copy, else the NVMe record's payload checksum): equal keeps the old
  // block and frees the slot at Unpin; different follows on_conflict. *outcome (may be
  // null) says which. An HBM block is hashed on the GPU at commit (hbm/block_hash.h);
  // `by` says who commits (the first committer of a block is its writer).
  virtual Status Commit(uint64_t contract_id, SlotRef slot, const Key128& key, const Key128& parent,
                        const Committer& by = {}, CommitOutcome* outcome = nullptr) = 0;
  // Drops one pin on a committed block / frees an allocated but uncommitted slot.
  virtual Status Unpin(SlotRef slot) = 0;
  virtual Status FreeSlot(SlotRef slot) = 0;
  // Unpin (FreeSlots: FreeSlot) of every slot of `slots`, the index lock taken once per
  // kReleaseStep slots rather than once per slot, and let go between steps so that a
  // lease of 16,384 blocks keeps no lookup waiting longer than one step. Every slot is
  // tried; returns the first failure and counts the failures in *failed (may be null).
  static constexpr size_t kReleaseStep = 256;
  virtual Status UnpinAll(std::span<const SlotRef> slots, size_t* failed = nullptr) = 0;
  virtual Status FreeSlots(std::span<const SlotRef> slots, size_t* failed = nullptr) = 0;

  // Starts promotion of the cached prefix of keys into target; returns at once. With a
  // remote tier, keys past the local prefix are fetched from it as by Acquire.
  virtual void Prefetch(uint64_t contract_id, std::span<const Key128> keys, Tier target) = 0;

  // Operator actions.
  virtual Status Evict(uint64_t contract_id, const Key128& key) = 0;
  // Demotes every unpinned block of HBM and host to NVMe (bypassing admission, within the
  // write budget) and returns when done. With to = Tier::kHost only HBM is emptied (its
  // blocks go to host; host and NVMe are left as they are). An operator action: it blocks
  // its caller, and must not be called from a completion callback (Invalid if it is).
  // Invalid for to = Tier::kHbm.
  virtual Status Flush(Tier to = Tier::kNvme) = 0;
  // Applies new eviction/admission settings (sizes and folders cannot change).
  virtual Status Reconfigure(const TierManagerOptions& opts) = 0;

  virtual std::vector<TierStats> Stats() const = 0;
  // Per quota group (TierManagerOptions::groups); empty without groups.
  virtual std::vector<GroupStats> GroupStatsAll() const { return {}; }
  // Demotions to NVMe refused because the committing user had spent its share of the
  // daily write budget (NvmeOptions::daily_write_budget_per_client); also counted in the
  // NVMe tier's admission_rejects.
  virtual uint64_t ClientBudgetRejects() const { return 0; }

  // ---- Operator views and actions (kvtierctl). Additive: the defaults say Unsupported.
  // Every registered contract with its block size and cached blocks per tier.
  virtual std::vector<ContractInfo> Contracts() const { return {}; }
  // The registered contracts' ids in id order, for paging: a snapshot kept until a
  // registration comes or goes, so that a listing holds the index lock only to copy the
  // ids once after a change, never for a page's length.
  virtual std::shared_ptr<const std::vector<uint64_t>> ContractIds() const {
    return std::make_shared<const std::vector<uint64_t>>();
  }
  // ContractInfo of each of `ids` still registered (the others are left out), the lock
  // taken for a few entries at a time.
  virtual std::vector<ContractInfo> ContractInfos(std::span<const uint64_t> ids) const {
    (void)ids;
    return {};
  }
  // A page of the block index: blocks of `contract_id` (0 = all) with a copy in `tier`
  // (kNone = any), skipping `offset` matches, at most `limit`. *total gets the number of
  // matches. The order is (contract, key). A page walks a snapshot of the index's ids
  // (kept until a block comes or goes) and takes the index lock for a few hundred of them
  // at a time, never for the page's or the index's length.
  virtual Status ListBlocks(uint64_t contract_id, Tier tier, uint64_t offset, uint32_t limit,
                            std::vector<BlockInfo>* out, uint64_t* total) const {
    (void)contract_id, (void)tier, (void)offset, (void)limit, (void)out, (void)total;
    return Status::Unsupported("ListBlocks");
  }
  // One block, with its NVMe record's checksums. contract_id 0 = the first contract (by
  // id) holding the key: one find per registered contract, the lock taken for a few dozen
  // at a time. NotFound when no cached block has the key.
  virtual StatusOr<BlockInfo> InspectBlock(uint64_t contract_id, const Key128& key) const {
    (void)contract_id, (void)key;
    return Status::Unsupported("InspectBlock");
  }
  // Re-reads NVMe records [offset, offset + limit) (record order) and checks their
  // checksums; a corrupt record is dropped (as on a read) and counted. Blocks its caller
  // on I/O (an operator action, like Flush); never call it from a completion callback.
  virtual Status VerifyNvme(uint64_t offset, uint32_t limit, VerifyReport* report) {
    (void)offset, (void)limit, (void)report;
    return Status::Unsupported("VerifyNvme");
  }
  // Evicts every unpinned block of a contract from every tier. *evicted / *skipped (either
  // may be null) get the blocks evicted and the pinned or moving blocks left in place.
  virtual Status EvictContract(uint64_t contract_id, uint64_t* evicted, uint64_t* skipped) {
    (void)contract_id, (void)evicted, (void)skipped;
    return Status::Unsupported("EvictContract");
  }

  // Waits until the mover has nothing queued or in flight (every promotion, demotion and
  // pending callback finished). For tests, benchmarks and orderly shutdown.
  virtual void Drain() {}
};

}  // namespace kvtier::tiers
