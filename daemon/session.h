// One attached client: its ring region, its request-loop thread and its leases.
//
// A Session is created by the control server when a client attaches and lives until the
// client's socket closes (exit or crash), the client misbehaves past the limit, or the
// daemon shuts down. Then Close() stops the request loop and releases every lease: each
// acquired or committed block gets one Unpin, each allocated but uncommitted slot a
// FreeSlot. Nothing a client does can reach another client's leases: lease ids are looked
// up only in the session's own table.
//
// Threads:
//   - the ring thread (one per session) reads the request ring, validates and executes;
//   - the control server's thread executes socket-path requests (same Execute());
//   - TierManager worker threads run Acquire callbacks, which publish completions.
// `mu_` protects the lease table and `closed_`; `cmp_mu_` serialises completion-ring
// producers (the ring is single-producer on the wire; the daemon's several producers take
// this lock). Callbacks hold a shared_ptr to the Session, so the ring mapping outlives
// every write into it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "daemon/access.h"
#include "daemon/bulk_runner.h"
#include "daemon/metrics.h"
#include "daemon/staging.h"
#include "formats/contract.h"
#include "formats/wire.h"
#include "tiers/tier_manager.h"

namespace kvtier::daemon {

struct SessionLimits {
  uint32_t ring_entries = 256;            // per ring
  uint64_t ring_data_bytes = 4u << 20;    // data area
  uint32_t max_keys = 65536;              // per request
  uint32_t max_leases = 65536;            // open leases
  double max_tier_share = 0.75;           // of each tier's bytes, held in slots under this client's leases
  uint32_t max_contracts = 1024;          // contracts this client registered
  uint32_t max_bad_requests = 16;         // corrupt requests (broken frames) before disconnect
  uint32_t bad_request_decay_ms = 10000;  // one strike forgiven per interval
  uint32_t spin_us = 50;                  // busy-poll before sleeping
  uint32_t max_spinning = 1;              // ring threads busy-polling at once, every client together
  // Nice value above the daemon's of the thread that runs this client's big acquires and
  // releases (daemon/bulk_runner.h), [0, 19]; 0: the ring thread runs them.
  int bulk_nice = 10;
  uint32_t max_async_acquires = 8;        // asynchronous acquires in flight
  uint32_t protocol_version = wire::kProtocolVersion;  // negotiated at attach (ring header)
  // Host slots the client may hold under alloc leases at once: the slots of its staging
  // area (daemon/staging.h; with classes made per contract, a cap on the slots of an area
  // of staging_bytes). 0: no staging area, and the host tier takes no alloc or
  // acquire from this client (a client of protocol < 5 maps the arena writable, which
  // the sealed arena refuses).
  uint32_t staging_slots = 0;
  // With classes made per contract (TierManager::classes_at_registration): the staging
  // area's bytes (its slots each as long as their contract's host slot), and staging_slots
  // the most it holds at once. Default: 0
  uint64_t staging_bytes = 0;
  // The daemon's total of staging memory every client's area charges (null: none).
  std::shared_ptr<StagingBudget> staging_budget;
  // The client maps no host arena ([[tenants]] are configured: the arena holds every
  // tenant's blocks): a host acquire copies each block outside the client's part
  // (SetHostPart) into a staging slot of the lease, and the client reads the copy. Needs
  // a staging area.
  bool private_reads = false;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Done = std::function<void(const wire::CompletionEntry&)>;
  // Called (once) when the session decides the client must go (a ring it cannot read,
  // too many corrupt requests); the control server sends `why` to the client
  // (ControlType::kGoodbye) and closes the socket, which ends in Close().
  using KickFn = std::function<void(const std::string& why)>;
  // Re-reads the daemon's config (kvtierctl config reload); *summary gets what changed.
  using ReloadFn = std::function<Status(std::string* summary)>;
  // Called after this client's first registration of a contract went through (the daemon
  // keeps it for restarts, and counts the clients that registered it): the contract, the
  // TierManager's id of it and its owner (a tenant, or kSharedOwner).
  using RegisteredFn = std::function<void(const ScaleContract& contract, uint64_t internal, uint32_t owner)>;

  // Creates the ring region (a sealed memfd) and maps it. Does not start the thread.
  static StatusOr<std::shared_ptr<Session>> Create(uint64_t client_id, const std::string& name,
                                                   uint32_t pid, bool has_gpu,
                                                   tiers::TierManager* tm, Metrics* metrics,
                                                   const SessionLimits& limits, KickFn kick,
                                                   ReloadFn reload = nullptr, RegisteredFn registered = nullptr);
  ~Session();

  // Who attached (the connection's peer credentials), its tenant, and the daemon's
  // tenants (policy, contract owners, counters; outlives the session). Before Start.
  // Without it (in-process users) every admin action is allowed and ids are not
  // namespaced.
  void SetPeer(const PeerCred& peer, uint32_t tenant, Tenants* tenants);
  // Judges a registration this client has not made yet (the TierManager's id of the
  // contract) before it goes through: the daemon counts what the client's uid keeps
  // registered across its attaches (daemon.max_contracts_per_client). Before Start;
  // without it only this session's registrations are counted.
  using AdmitContractFn = std::function<Status(uint64_t internal)>;
  void SetContractAdmission(AdmitContractFn admit) { admit_contract_ = std::move(admit); }

  void Start();  // starts the ring thread
  // Stops the ring thread (after it executed what is already in the ring when `drain`),
  // waits for in-flight acquires (up to a few seconds), and releases every lease.
  // Idempotent; safe from any thread but the ring thread.
  void Close(bool drain);

  // Socket path: executes a request whose input arrived inline. `done` gets the
  // completion; `out` (out_len bytes) must stay valid until then.
  void ExecuteSocket(const wire::RequestEntry& req, std::vector<uint8_t> in, uint8_t* out,
                     Done done);

  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  bool has_gpu() const { return has_gpu_; }  // attached with the GPU flag
  int ring_fd() const { return ring_fd_; }
  // The client's staging area (nullptr without one): its memfd goes in the attach reply.
  const StagingArea* staging() const { return staging_.get(); }
  // No host arena for this client: host acquires hand out copies (SessionLimits::private_reads).
  bool private_reads() const { return staging_ && limits_.private_reads; }
  // Private reads: the part of the host arena this client maps (its tenant's, at `offset`
  // of `bytes`: tiers/host/host_pool.h, "Parts"), set at attach before Start. Host
  // acquires of blocks there answer the arena slot (the client reads it in place); only
  // blocks elsewhere (the common pool) are copied.
  void SetHostPart(uint64_t offset, uint64_t bytes) {
    const uint64_t g = tm_->host_geometry().granule;
    part_lo_ = static_cast<uint32_t>(offset / g);
    part_hi_ = static_cast<uint32_t>((offset + bytes) / g);
  }
  uint64_t ring_bytes() const { return hdr_.total_bytes; }
  size_t lease_count() const;
  // The contracts this client registered (each once). Read after Close().
  std::vector<uint64_t> registered_contracts() const;

 private:
  struct Lease {
    bool alloc = false;                    // alloc lease (else acquire)
    uint64_t contract_id = 0;
    std::vector<tiers::SlotRef> slots;
    std::vector<uint8_t> committed;        // alloc leases: per slot, 1 once committed
    std::unordered_map<uint64_t, uint32_t> index;  // (tier<<32|slot the client sees) -> position (alloc)
    // Alloc leases on the host tier: per slot, its staging slot (kNoStaging once the
    // block was copied out at commit, and for HBM slots). Acquire leases of a client with
    // private reads: per host slot, the staging slot holding its copy. slots[] holds the
    // arena slots.
    std::vector<uint32_t> staged;
    // Bytes of the slots it holds in HBM and host (each slot its class's size): what it
    // counts against max_tier_share while it is held.
    uint64_t bytes[2] = {0, 0};
  };
  static constexpr uint32_t kNoStaging = ~uint32_t{0};
  // Keys one hold of the index lock sets up for an acquire (a TierManager acquire of
  // them): about 80 ns a key, so a bystander's lookup waits about 20 us at most behind an
  // acquire of any size (bench/README.md, "bystander"). Acquires of more keys go in steps.
  static constexpr size_t kAcquireLockChunk = 256;

  Session(uint64_t id, std::string name, uint32_t pid, bool has_gpu, tiers::TierManager* tm,
          Metrics* metrics, const SessionLimits& limits, KickFn kick);

  void RingLoop();
  void HandleRingRequest(const wire::RequestEntry& e);
  // Validated request. `in` may point into the client's shared memory: every op copies
  // what it reads out of it exactly once, before using it (no double fetch). Dispatches
  // to one handler per op; `done` gets the completion (later, for an acquire).
  void Execute(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out, Done done);
  // One handler per op: each fills *c and returns the status that Execute turns into the
  // completion's error (with its text in the out region).
  Status HandleRegisterContract(const wire::RequestEntry& req, std::span<const uint8_t> in,
                                wire::CompletionEntry* c);
  Status HandleLookup(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                      wire::CompletionEntry* c);
  // Completes through `done` from a TierManager thread once the blocks are pinned.
  void HandleAcquire(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out, Done done);
  void HandleAcquireAsync(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                          Done done);
  // The acquire in steps of `chunk` keys, one TierManager acquire each, all started at
  // once: the index lock is held for one step's keys at a time, so that a bystander's
  // lookup waits for one step at most (kAcquireLockChunk), not for a whole acquire of
  // 16,384 keys. Async (HandleAcquireAsync): `out` starts with the AcquireProgress the
  // client polls; else the slots start at `out` (HandleAcquire, past kAcquireLockChunk
  // keys). BeginAcquire has counted it.
  void AcquireInSteps(const wire::RequestEntry& req, uint64_t contract_id, const tiers::ContractView& view,
                      std::vector<Key128> keys, size_t chunk, bool async, uint8_t* out, Done done);
  Status HandleAlloc(const wire::RequestEntry& req, uint8_t* out, wire::CompletionEntry* c);
  // What an alloc the tier answered Retry gets: Rejected, with the numbers, when this
  // client's own leases keep the tier full; else Retry (pressure that passes).
  Status AllocRefusal(const wire::RequestEntry& req, const Status& retry, const tiers::ContractView& view) const;
  // c->count says how many items went through, on failure too.
  Status HandleCommit(const wire::RequestEntry& req, std::span<const uint8_t> in, wire::CompletionEntry* c);
  Status HandlePrefetch(const wire::RequestEntry& req, std::span<const uint8_t> in);
  Status HandleStats(const wire::RequestEntry& req, uint8_t* out, wire::CompletionEntry* c);
  // Op::kAdmin (operator requests, daemon/admin.cc): runs the action, fills the completion.
  // Checks the peer's right to the action first (a refusal changes nothing), runs it
  // (RunAdmin) and writes the audit line: peer, what it asked, what it changed.
  Status DoAdmin(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                 wire::CompletionEntry* c);
  // *changed: what the action changed, for the audit line ("" for a read).
  // scoped: a tenant admin's request, kept inside its namespace (ids are its own).
  Status RunAdmin(const wire::RequestEntry& req, const wire::AdminRequest& a, bool scoped, uint8_t* out,
                  wire::CompletionEntry* c, std::string* changed);
  // The TierManager's ids of this tenant's contracts (scoped views), with their public ids.
  std::vector<std::pair<uint64_t, uint64_t>> OwnContracts() const;
  uint64_t PublicId(uint64_t internal_id) const;
  Status CheckContract(uint64_t contract_id) const;
  static Status NotRegistered(uint64_t contract_id);
  // The TierManager's id of the contract a request names (the client's id in this
  // session's namespace, or a shared handle this session registered), checked to be
  // registered and this tenant's (a miss, with the message of an unregistered contract,
  // for anyone else's). With `view`, *view gets what the request needs about the
  // contract (TierManager::View), read once: the request asks the TierManager nothing
  // more about it.
  StatusOr<uint64_t> ContractOf(uint64_t contract_id, tiers::ContractView* view = nullptr) const;
  // Who this client's commits are charged to (its id; its peer's uid, -1 before SetPeer).
  tiers::Committer CommitterOf() const;
  // An acquire may start: the session is open and its lease table has room. Counts it in
  // inflight_ (the callback's end of the acquire takes it off).
  // An asynchronous one also counts against limits_.max_async_acquires (async_inflight_,
  // taken off by its last callback).
  Status BeginAcquire(bool async = false);
  // Bumps an asynchronous acquire's AcquireProgress.events and wakes the client's futex
  // sleep on it (formats/wire.h).
  static void WakeProgress(wire::AcquireProgress* p);
  Status CheckTarget(uint8_t tier) const;
  // Adds a lease; returns its id. Refused (its slots returned) when the lease table is
  // full or when its slots would take this client past its share of a tier.
  // `view`: the lease's contract's (the bytes each of its slots counts).
  StatusOr<uint64_t> AddLease(Lease lease, const tiers::ContractView& view);
  // The slots of an acquire, one per key (a key named twice is pinned twice), as a
  // lease's: each slot once, the extra pins dropped.
  std::vector<tiers::SlotRef> UniqueSlots(const std::vector<tiers::SlotRef>& slots);
  // Refused when `n` more slots of `tier` would take this client past its share.
  Status CheckShareLocked(tiers::Tier tier, uint64_t n, uint64_t slot_bytes) const;
  // The bytes a slot of the viewed contract takes in `tier` (HBM or host): its slot
  // class's size.
  uint64_t SlotBytes(const tiers::ContractView& view, tiers::Tier tier) const;
  // The bytes of a staging slot for a block of the viewed contract: its host slot when
  // classes are made per contract, else slot_bytes (a staging slot of any class).
  uint64_t StagingSlotBytes(const tiers::ContractView& view) const;
  // Gives a lease's slots back to the TierManager (unpins, frees) and its staging slots to
  // the staging area.
  // `bulk`: a big release goes to the bulk thread (only on the ring thread and in Close:
  // see RunSteps); callbacks on TierManager threads and the socket path release in place.
  void ReleaseSlots(const Lease& lease, bool bulk = false);
  // Unpins (or frees) `slots` kAcquireLockChunk at a time, one hold of the index lock
  // each, yielding the core between steps (YieldBetweenSteps); past one step on the bulk
  // thread with `bulk`.
  void ReleaseInSteps(std::span<const tiers::SlotRef> slots, bool free, bool bulk);
  // Logs (rate-limited) a release's failures, if any, with the first.
  void ReleaseFailed(const char* what, size_t failed, size_t n, const Status& first) const;
  // Between two steps of a big request (an acquire or a release of more than
  // kAcquireLockChunk keys) the thread running it gives its core to any other runnable
  // thread: kvtierd pinned to one CPU runs every ring thread there, and a thread busy for
  // milliseconds would otherwise keep a bystander's ring thread off the core for its
  // whole time slice, whatever the index lock allows (bench/README.md, "bystander").
  static void YieldBetweenSteps();
  // Runs `step` until it returns false: a request's steps over `keys` keys, each claiming
  // the next (safe to call from two threads at once). With `bulk` and more than
  // kInlineSteps steps of kAcquireLockChunk keys, the first kInlineSteps run in place and
  // the rest on the bulk thread (bulk_); else all in place. `bulk` only on the ring thread
  // (OnRingThread) and in Close (the closer thread): the control server's io thread never
  // waits for another thread (a socket-path request runs all its steps in place there),
  // and a TierManager thread must never wait for the bulk thread, whose steps may wait
  // for it. A template, so that a request run in place (every small release) builds no
  // std::function.
  template <typename Step>
  void RunSteps(size_t keys, bool bulk, Step&& step) {
    if (bulk && keys > kInlineSteps * kAcquireLockChunk && bulk_.nice() > 0) {
      // The first steps here: a request of a few steps is done before a hand-over to the
      // bulk thread and back (two wake-ups, tens of us) would have paid off.
      for (size_t i = 0; i < kInlineSteps; ++i) {
        if (!step()) return;
      }
      return HandOver(std::ref(step));
    }
    while (step()) {
    }
  }
  // RunSteps' hand-over of the steps left to bulk_, counted in the metrics.
  void HandOver(const std::function<bool()>& step);
  // True on this session's ring thread.
  bool OnRingThread() const;
  // Steps a big request runs on its own thread before the rest go to the bulk thread:
  // 1,024 keys, about 100 us. A request of 1,000 blocks pays no hand-over (two wake-ups,
  // which doubled its time in kvtier-bench client), and a loop of 16,384-block acquires
  // runs 94% of its steps at the bulk thread's priority.
  static constexpr size_t kInlineSteps = 4;
  // The slot of an alloc lease as the client sees it: a staging slot id for the host tier.
  wire::WireSlot ClientSlot(const Lease& lease, size_t i) const;
  // Private reads: the copies one acquire made, (arena slot, staging slot) sorted by
  // arena slot, one per distinct host slot.
  using Copies = std::vector<std::pair<uint32_t, uint32_t>>;
  // Copies the host blocks of `slots` (block_bytes each) that *copies lacks into staging
  // slots and adds them. Not Ok, with nothing more taken, when the staging area has no
  // room (Rejected) or the daemon's staging total is spent (Retry).
  Status CopyToStaging(std::span<const tiers::SlotRef> slots, uint64_t block_bytes, uint64_t slot_bytes,
                       Copies* copies);
  // The staging slot of arena slot `slot` in `copies`, or kNoStaging.
  static uint32_t FindCopy(const Copies& copies, uint32_t slot);
  // The refusal of an acquire of n blocks whose copies find no room (`why`: the area's
  // Rejected, or the total's Retry, which is returned as it is).
  Status StagingFull(size_t n, const Status& why) const;
  // The client's id of an acquired slot: its copy's staging id where one was made.
  uint32_t AcquiredSlotId(const tiers::SlotRef& ref, const Copies& copies) const;
  // The staging slots of `copies`, in the order of the lease's slots (Lease::staged).
  static std::vector<uint32_t> StagedOf(const std::vector<tiers::SlotRef>& slots, const Copies& copies);
  // c->count: items that went through (on failure too); c->cached_*: of those, the keys
  // already cached, by what their bytes were.
  // contract_id: the TierManager's (ContractOf), `view` its view.
  Status DoCommit(const wire::RequestEntry& req, uint64_t contract_id, const tiers::ContractView& view,
                  std::span<const uint8_t> in, wire::CompletionEntry* c);
  // Counts a commit's already-cached keys in the metrics; logs (rate-limited) a conflict.
  void NoteCachedCommits(const wire::CompletionEntry& c, const wire::RequestEntry& req);
  Status DoRelease(uint64_t lease_id);

  void PublishCompletion(const wire::CompletionEntry& c);
  void DrainOverflowLocked();
  // One strike for a corrupt request (decaying; daemon.max_bad_requests); kicks at the limit.
  void CountBad(const std::string& why);

  const uint64_t id_;
  const std::string name_;
  const uint32_t pid_;
  const bool has_gpu_;
  tiers::TierManager* const tm_;
  Metrics* const metrics_;
  const SessionLimits limits_;
  KickFn kick_;
  ReloadFn reload_;
  RegisteredFn registered_;
  AdmitContractFn admit_contract_;
  PeerCred peer_;
  uint32_t tenant_ = kDefaultTenant;
  Tenants* tenants_ = nullptr;  // null: every admin action allowed, ids as given (in-process users)
  bool namespaced_ = false;     // tenants are configured: ids go through ContractOf's checks
  bool operator_ = false;       // the peer is an operator (AccessPolicy::IsOperator)
  uint64_t ns_ = 0;             // the tenant's namespace (0: ids as clients give them)
  TenantCounters* counters_ = nullptr;  // with namespaced_
  mutable std::mutex ns_mu_;    // protects shared_ and resolved_
  std::unordered_set<uint64_t> shared_;               // shared handles this session registered
  mutable std::unordered_map<uint64_t, uint64_t> resolved_;  // ContractOf's answers: public -> internal

  int ring_fd_ = -1;
  uint8_t* base_ = nullptr;
  wire::RingRegionHeader hdr_;
  uint8_t* data_ = nullptr;
  wire::RingView<wire::RequestEntry> req_ring_;
  wire::RingView<wire::CompletionEntry> cmp_ring_;

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> drain_{false};
  std::atomic<bool> kicked_{false};
  uint32_t bad_requests_ = 0;           // strikes (ring thread only)
  std::chrono::steady_clock::time_point last_decay_ = std::chrono::steady_clock::now();

  mutable std::mutex mu_;               // protects leases_, held_, registered_ids_, closed_, inflight_,
                                        // async_inflight_
  std::unordered_map<uint64_t, Lease> leases_;
  // Bytes of the slots under leases (each slot its class's size), hbm / host, and
  // limits_.max_tier_share of each tier's bytes (UINT64_MAX: all of it). Bytes, not slots:
  // a count of slots against a share of the smallest class's would let a client of large
  // blocks hold its whole class.
  uint64_t held_[2] = {0, 0};
  uint64_t share_cap_[2] = {0, 0};
  uint64_t tier_bytes_[2] = {0, 0};     // the bytes of each tier's slabs
  std::unordered_set<uint64_t> registered_ids_;
  bool closed_ = false;
  int inflight_ = 0;                    // acquires waiting for their callback
  uint32_t async_inflight_ = 0;         // of them, asynchronous ones

  std::unique_ptr<StagingArea> staging_;  // the client's writable host slots (or null)
  // Host slot ids [part_lo_, part_hi_) lie in the part this client maps (SetHostPart).
  uint32_t part_lo_ = 0, part_hi_ = 0;
  // Serialises commits and releases of this client (ring thread and socket path): a
  // commit copies staged bytes into arena slots with mu_ released, and no release may
  // free those arena slots meanwhile. Taken before mu_.
  std::mutex commit_mu_;

  std::mutex cmp_mu_;                   // completion-ring producers
  std::deque<wire::CompletionEntry> overflow_;

  std::mutex close_mu_;                 // serialises Close()
  bool close_done_ = false;

  std::atomic<uint64_t> bulk_runs_{0};  // runs handed to bulk_ (the ring thread sees its own)
  // Runs the steps of big acquires and releases past their first kInlineSteps at lower
  // priority; its thread starts at the first such request. Idle once nobody holds the
  // session (each Run's caller is the ring thread, joined first, or holds the session),
  // and declared last, so that it is joined before any member its steps touch goes.
  BulkRunner bulk_;
};

// Global lease ids: unique over the daemon's life, never 0.
uint64_t NextLeaseId();

}  // namespace kvtier::daemon
