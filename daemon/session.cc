// Session (daemon/session.h): creation, the ring loop, the dispatch of requests, contract
// ids, leases and their release, registration, lookup, prefetch, stats and close. The
// acquire, alloc and commit flows are in session_acquire.cc, session_alloc.cc and
// session_commit.cc.
#include "daemon/session.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>

#include <spdlog/spdlog.h>

#include "common/log_limit.h"
#include "daemon/session_util.h"
#include "daemon/stats_record.h"
#include "formats/contract.h"
#include "formats/ring_wait.h"
#include "testing/test_point.h"

namespace kvtier::daemon {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
}

// Lookup replies copy tiers::Tier values into the wire's tier bytes as they are.
static_assert(sizeof(tiers::Tier) == 1);
static_assert(static_cast<uint8_t>(tiers::Tier::kHbm) == wire::kTierHbm &&
              static_cast<uint8_t>(tiers::Tier::kHost) == wire::kTierHost &&
              static_cast<uint8_t>(tiers::Tier::kNvme) == wire::kTierNvme &&
              static_cast<uint8_t>(tiers::Tier::kRemote) == wire::kTierRemote &&
              static_cast<uint8_t>(tiers::Tier::kNone) == wire::kTierNone);

}  // namespace

uint64_t NextLeaseId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

Session::Session(uint64_t id, std::string name, uint32_t pid, bool has_gpu,
                 tiers::TierManager* tm, Metrics* metrics, const SessionLimits& limits,
                 KickFn kick)
    : id_(id),
      name_(std::move(name)),
      pid_(pid),
      has_gpu_(has_gpu),
      tm_(tm),
      metrics_(metrics),
      limits_(limits),
      kick_(std::move(kick)),
      bulk_(limits.bulk_nice) {}

StatusOr<std::shared_ptr<Session>> Session::Create(uint64_t client_id, const std::string& name,
                                                   uint32_t pid, bool has_gpu,
                                                   tiers::TierManager* tm, Metrics* metrics,
                                                   const SessionLimits& limits, KickFn kick,
                                                   ReloadFn reload, RegisteredFn registered) {
  std::shared_ptr<Session> s(
      new Session(client_id, name, pid, has_gpu, tm, metrics, limits, std::move(kick)));
  s->reload_ = std::move(reload);
  s->registered_ = std::move(registered);
  KVTIER_RETURN_IF_ERROR(wire::MakeRingLayout(limits.ring_entries, limits.ring_data_bytes, &s->hdr_));
  s->hdr_.version = limits.protocol_version;
  const std::string memfd_name = "kvtier-ring-" + std::to_string(client_id);
  s->ring_fd_ = ::memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (s->ring_fd_ < 0) return Status::IoError(std::string("memfd_create: ") + std::strerror(errno));
  if (::ftruncate(s->ring_fd_, static_cast<off_t>(s->hdr_.total_bytes)) != 0) {
    return Status::IoError(std::string("ftruncate ring region: ") + std::strerror(errno));
  }
  // Seal the size: a client that could shrink the region would make the daemon's reads
  // of its mapping fault (SIGBUS) and take every other client down with it.
  if (::fcntl(s->ring_fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::IoError(std::string("sealing ring region: ") + std::strerror(errno));
  }
  void* p = ::mmap(nullptr, s->hdr_.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->ring_fd_, 0);
  if (p == MAP_FAILED) return Status::IoError(std::string("mmap ring region: ") + std::strerror(errno));
  s->base_ = static_cast<uint8_t*>(p);
  std::memcpy(s->base_, &s->hdr_, sizeof(s->hdr_));
  s->data_ = s->base_ + s->hdr_.data_offset;
  s->req_ring_ = wire::RequestRing(s->base_, s->hdr_);
  s->cmp_ring_ = wire::CompletionRing(s->base_, s->hdr_);
  for (const tiers::Tier t : {tiers::Tier::kHbm, tiers::Tier::kHost}) {
    const int i = t == tiers::Tier::kHbm ? 0 : 1;
    const uint64_t bytes = !tm->has_tier(t)                ? 0
                           : t == tiers::Tier::kHbm ? tm->hbm_geometry().arena_bytes
                                                    : tm->host_geometry().arena_bytes;
    s->tier_bytes_[i] = bytes;
    // At least one slot of any class, as a share of one slot was.
    s->share_cap_[i] = std::max(tm->slot_bytes(),
                                static_cast<uint64_t>(limits.max_tier_share * static_cast<double>(bytes)));
    // A share of the whole tier is no limit of its own: the tier's size answers.
    if (s->share_cap_[i] >= bytes) s->share_cap_[i] = UINT64_MAX;
  }
  if (limits.staging_slots > 0 && tm->has_tier(tiers::Tier::kHost)) {
    // Staging slot ids follow the arena's: the client maps both in one window, host slot
    // s at s * granule. Slots fixed at start: staging_slots slots of slot_bytes; made per
    // contract: staging_bytes, each slot its contract's host slot (daemon/staging.h).
    const uint64_t granule = tm->host_geometry().granule;
    const uint64_t area = tm->classes_at_registration() ? limits.staging_bytes / granule * granule
                                                        : uint64_t{limits.staging_slots} * tm->slot_bytes();
    if (area / granule > UINT32_MAX) return Status::Invalid("staging area of " + std::to_string(area) + " bytes");
    auto st = StagingArea::Create("kvtier-staging-" + std::to_string(client_id),
                                  static_cast<uint32_t>(area / granule), granule, limits.staging_slots,
                                  static_cast<uint32_t>(tm->host_arena_bytes() / granule), limits.staging_budget);
    if (!st.ok()) return st.status();
    s->staging_ = std::move(st.value());
  }
  return s;
}

Session::~Session() {
  if (thread_.joinable()) {
    stop_ = true;
    if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();
    else thread_.join();
  }
  if (base_ != nullptr) ::munmap(base_, hdr_.total_bytes);
  if (ring_fd_ >= 0) ::close(ring_fd_);
}

void Session::SetPeer(const PeerCred& peer, uint32_t tenant, Tenants* tenants) {
  peer_ = peer;
  tenant_ = tenant;
  tenants_ = tenants;
  namespaced_ = tenants != nullptr && tenants->access().tenants_configured();
  ns_ = namespaced_ ? tenants->access().tenant_namespace(tenant) : 0;
  counters_ = namespaced_ ? &tenants->counters(tenant) : nullptr;
  operator_ = tenants != nullptr && tenants->access().IsOperator(peer);
}

tiers::Committer Session::CommitterOf() const {
  // The NVMe write budget's part is the user's (the kernel's SO_PEERCRED, not the attach):
  // a client cannot renew it by attaching again, forking, or opening more sessions.
  return tiers::Committer{id_, peer_.uid == PeerCred{}.uid ? int64_t{-1} : int64_t{peer_.uid}};
}

void Session::Start() { thread_ = std::thread([this] { RingLoop(); }); }

size_t Session::lease_count() const {
  std::lock_guard<std::mutex> l(mu_);
  return leases_.size();
}

std::vector<uint64_t> Session::registered_contracts() const {
  std::lock_guard<std::mutex> l(mu_);
  return {registered_ids_.begin(), registered_ids_.end()};
}

namespace {
// Ring threads busy-polling now, over every session (daemon.max_spinning_rings).
std::atomic<uint32_t> g_spinning{0};

// The session whose ring thread this is (null elsewhere): only a ring thread hands a big
// request's steps to the bulk thread (Session::OnRingThread).
thread_local const Session* t_ring_session = nullptr;

bool TakeSpinPlace(uint32_t max) {
  uint32_t n = g_spinning.load(std::memory_order_relaxed);
  while (n < max) {
    if (g_spinning.compare_exchange_weak(n, n + 1, std::memory_order_acquire)) return true;
  }
  return false;
}
}  // namespace

bool Session::OnRingThread() const { return t_ring_session == this; }

void Session::RingLoop() {
  t_ring_session = this;
  const auto spin = std::chrono::microseconds(limits_.spin_us);
  auto idle_start = Clock::now();
  uint32_t spins = 0;
  bool spinning = false;  // holds one of the daemon's spin places
  // The last request went to the bulk thread: this thread sleeps at once until a request
  // of another kind, and leaves the spin places to clients asking back to back.
  bool ran_bulk = false;
  auto stop_spinning = [&spinning] {
    if (spinning) g_spinning.fetch_sub(1, std::memory_order_release);
    spinning = false;
  };
  req_ring_.SetConsumerCpu(::sched_getcpu());
  while (true) {
    const bool stopping = stop_.load(std::memory_order_acquire);
    if (stopping && !drain_.load()) break;
    {
      std::lock_guard<std::mutex> l(cmp_mu_);
      if (!overflow_.empty()) DrainOverflowLocked();
    }
    uint32_t n = 0;
    if (!req_ring_.Available(&n)) {
      metrics_->requests_malformed.fetch_add(1, std::memory_order_relaxed);
      if (!kicked_.exchange(true)) {
        metrics_->disconnect_misbehaved.fetch_add(1);
        kick_("request ring indices are corrupt");
      }
      break;
    }
    if (n == 0) {
      if (stopping) break;  // drained
      // Spin, then sleep (formats/ring_wait.h says when the spin yields); a thread that
      // finds every spin place taken, or whose last request went to the bulk thread, sleeps
      // at once.
      if (Clock::now() - idle_start < spin &&
          (spinning || (!ran_bulk && (spinning = TakeSpinPlace(limits_.max_spinning))))) {
        wire::SpinOnce(req_ring_, cmp_ring_, &spins);
        continue;
      }
      stop_spinning();
      wire::SleepUntilPushed(req_ring_, 50'000'000L, [this] { return stop_.load(); });
      idle_start = Clock::now();
      continue;
    }
    // A spinning thread keeps its spin place through a request and spins again after it,
    // so a client asking back to back keeps it; a thread that gave it up for each request
    // would lose it to a trickling session's thread and pay a futex wake per request. A
    // request that ran past the spin window (a restore, a listing page) gives it up. One
    // that went to the bulk thread (thousands of blocks) takes none after it either: a
    // futex wake is noise beside such a request, and a place taken between two of them
    // would be taken from a client that asks back to back (bench/README.md, "bystander").
    wire::RequestEntry e;
    req_ring_.Pop(&e);
    const auto started = Clock::now();
    const uint64_t bulk_before = bulk_runs_.load(std::memory_order_relaxed);
    HandleRingRequest(e);
    if (kicked_.load()) break;
    idle_start = Clock::now();
    ran_bulk = bulk_runs_.load(std::memory_order_relaxed) != bulk_before;
    if (ran_bulk || idle_start - started >= spin) stop_spinning();
  }
  stop_spinning();
}

void Session::CountBad(const std::string& why) {
  // Decay first: one strike forgiven per bad_request_decay_ms since the last forgiveness.
  const auto now = Clock::now();
  const auto decay = std::chrono::milliseconds(std::max<uint32_t>(limits_.bad_request_decay_ms, 1));
  const auto forgiven = static_cast<uint64_t>((now - last_decay_) / decay);
  if (forgiven >= bad_requests_) {
    bad_requests_ = 0;
    last_decay_ = now;
  } else {
    bad_requests_ -= static_cast<uint32_t>(forgiven);
    last_decay_ += forgiven * decay;
  }
  ++bad_requests_;
  static LogLimit bad_log;  // every client together: a line per interval
  uint64_t held = 0;
  if (bad_log.Allow(&held)) {
    spdlog::warn("client {} ({}, pid {}): corrupt request ({} of {}): {} ({} more corrupt-request lines held back)",
                 id_, name_, pid_, bad_requests_, limits_.max_bad_requests, why, held);
  }
  if (bad_requests_ >= limits_.max_bad_requests && !kicked_.exchange(true)) {
    metrics_->disconnect_misbehaved.fetch_add(1);
    // The kick's reason is logged once, by the control server (rate-limited there).
    kick_(std::to_string(bad_requests_) + " corrupt ring requests within the decay window (daemon.max_bad_requests " +
          std::to_string(limits_.max_bad_requests) + "), the last: " + why);
  }
}

void Session::HandleRingRequest(const wire::RequestEntry& e) {
  const uint64_t t0 = NowNs();
  wire::RequestLimits lim;
  lim.data_bytes = hdr_.data_bytes;
  lim.max_keys = limits_.max_keys;
  Status v = wire::ValidateRingRequest(e, lim);
  if (!v.ok()) {
    wire::CompletionEntry c;
    c.tag = e.tag;
    c.op = e.op;
    // Say why in the out region when that region itself is sound.
    const bool out_ok = e.out_len > 0 && e.out_off % 8 == 0 &&
                        uint64_t{e.out_off} + e.out_len <= hdr_.data_bytes;
    // An asynchronous acquire's out region starts with its AcquireProgress: the text
    // goes after it, so that the progress the client polls stays zero.
    const uint32_t skip =
        e.op == static_cast<uint16_t>(wire::Op::kAcquireAsync) && e.out_len >= sizeof(wire::AcquireProgress)
            ? sizeof(wire::AcquireProgress)
            : 0;
    SetError(&c, v, out_ok ? data_ + e.out_off + skip : nullptr, out_ok ? e.out_len - skip : 0);
    metrics_->ObserveRequest(e.op, Transport::kRing, NowNs() - t0, false);
    metrics_->requests_malformed.fetch_add(1, std::memory_order_relaxed);
    PublishCompletion(c);
    // Only a broken frame is a strike; a sound request with a bad argument is a mistake
    // the error completion already answers.
    if (!wire::CheckRingFrame(e, lim).ok()) CountBad(v.message());
    return;
  }
  const uint16_t op = e.op;
  Execute(e, std::span<const uint8_t>(data_ + e.in_off, e.in_len),
          e.out_len ? data_ + e.out_off : nullptr,
          [this, t0, op](const wire::CompletionEntry& c) {
            metrics_->ObserveRequest(op, Transport::kRing, NowNs() - t0, c.status == 0);
            PublishCompletion(c);
          });
}

void Session::ExecuteSocket(const wire::RequestEntry& req, std::vector<uint8_t> in, uint8_t* out,
                            Done done) {
  const uint64_t t0 = NowNs();
  const uint16_t op = req.op;
  Execute(req, in, out,
          [this, t0, op, done = std::move(done)](const wire::CompletionEntry& c) {
            metrics_->ObserveRequest(op, Transport::kSocket, NowNs() - t0, c.status == 0);
            done(c);
          });
}

Status Session::CheckContract(uint64_t contract_id) const {
  if (!tm_->HasContract(contract_id)) return NotRegistered(contract_id);
  return Status::Ok();
}

Status Session::NotRegistered(uint64_t contract_id) {
  return Status::NotFound("contract " + ContractIdHex(contract_id) +
                          " is not registered: register it first (kvtier_register_contract)");
}

StatusOr<uint64_t> Session::ContractOf(uint64_t contract_id, tiers::ContractView* view) const {
  // With `view`, the registration check is the view's: one hold of the index lock for
  // every fact the request needs about its contract.
  auto registered = [&](uint64_t id) {
    if (view == nullptr) return tm_->HasContract(id);
    *view = tm_->View(id);
    return view->registered;
  };
  if (!namespaced_) {
    if (!registered(contract_id)) return NotRegistered(contract_id);
    return contract_id;
  }
  bool shared = false;
  {
    std::lock_guard<std::mutex> l(ns_mu_);
    auto it = resolved_.find(contract_id);
    if (it != resolved_.end()) {
      if (view != nullptr) *view = tm_->View(it->second);
      return it->second;
    }
    shared = shared_.count(contract_id) != 0;
  }
  const uint64_t internal = shared ? contract_id : NamespacedContractId(ns_, contract_id);
  const ContractOwners::Owner o = tenants_->owners().Get(internal);
  const bool mine = shared ? o.tenant == kSharedOwner : o.tenant == tenant_ && o.public_id == contract_id;
  if (!mine && operator_ && registered(contract_id)) {
    // An operator may name any tenant's contract by the TierManager's id (what its
    // listings show), to export or check it.
    std::lock_guard<std::mutex> l(ns_mu_);
    resolved_.emplace(contract_id, contract_id);
    return contract_id;
  }
  if (!mine || !registered(internal)) {
    // Another tenant's contract reads as one never registered: nothing to learn from it.
    return NotRegistered(contract_id);
  }
  std::lock_guard<std::mutex> l(ns_mu_);
  resolved_.emplace(contract_id, internal);
  return internal;
}

std::vector<std::pair<uint64_t, uint64_t>> Session::OwnContracts() const {
  if (!namespaced_) return {};
  return tenants_->owners().OfTenant(tenant_);
}

uint64_t Session::PublicId(uint64_t internal_id) const {
  return namespaced_ ? tenants_->owners().Get(internal_id).public_id : internal_id;
}

Status Session::CheckTarget(uint8_t tier) const {
  if (tier == wire::kTierHbm) {
    if (!has_gpu_) return Status::Invalid("this client attached without a GPU: target host, not hbm");
    if (!tm_->has_tier(tiers::Tier::kHbm)) return Status::Unsupported("the daemon has no HBM tier");
    if (limits_.protocol_version < 7 && tm_->hbm_geometry().classes.size() > 1) {
      return Status::Unsupported("the HBM tier has slots of several sizes, at slot * granule, which this client "
                                 "(protocol " + std::to_string(limits_.protocol_version) +
                                 ") does not know: upgrade libkvtier to protocol 7 to use the HBM tier");
    }
  } else if (!tm_->has_tier(tiers::Tier::kHost)) {
    return Status::Unsupported("the daemon has no host tier");
  } else if (!staging_) {
    return Status::Unsupported("the host arena is read-only to clients and this client (protocol " +
                               std::to_string(limits_.protocol_version) +
                               ") has no staging area: upgrade libkvtier to protocol 5 to use the host tier");
  }
  return Status::Ok();
}

StatusOr<uint64_t> Session::AddLease(Lease lease, const tiers::ContractView& view) {
  // The lease's bytes per tier, each slot its class's (from the request's view).
  const uint64_t weight[2] = {SlotBytes(view, tiers::Tier::kHbm), SlotBytes(view, tiers::Tier::kHost)};
  lease.bytes[0] = lease.bytes[1] = 0;
  for (const auto& sl : lease.slots) {
    const int i = sl.tier == tiers::Tier::kHbm ? 0 : 1;
    lease.bytes[i] += weight[i];
  }
  std::unique_lock<std::mutex> l(mu_);
  if (closed_) {
    l.unlock();
    ReleaseSlots(lease);
    return Status::Rejected("client is closing");
  }
  if (leases_.size() >= limits_.max_leases) {
    l.unlock();
    ReleaseSlots(lease);
    return Status::Rejected("lease table full (" + std::to_string(limits_.max_leases) +
                            "): release leases first");
  }
  for (const tiers::Tier t : {tiers::Tier::kHbm, tiers::Tier::kHost}) {
    const int i = t == tiers::Tier::kHbm ? 0 : 1;
    const uint64_t n = lease.bytes[i] == 0 ? 0 : lease.bytes[i] / weight[i];
    Status cs = CheckShareLocked(t, n, weight[i]);
    if (!cs.ok()) {
      l.unlock();
      ReleaseSlots(lease);
      return cs;
    }
  }
  held_[0] += lease.bytes[0];
  held_[1] += lease.bytes[1];
  const uint64_t id = NextLeaseId();
  metrics_->leases.fetch_add(1);
  metrics_->leased_slots.fetch_add(static_cast<int64_t>(lease.slots.size()));
  leases_.emplace(id, std::move(lease));
  return id;
}

uint64_t Session::SlotBytes(const tiers::ContractView& view, tiers::Tier tier) const {
  // The tier's own class of it.
  const uint64_t b = tier == tiers::Tier::kHbm ? view.hbm_slot_bytes : view.host_slot_bytes;
  return b != 0 ? b : tm_->slot_bytes();
}

uint64_t Session::StagingSlotBytes(const tiers::ContractView& view) const {
  // Classes fixed at start: every staging slot holds the largest (slot_bytes).
  return tm_->classes_at_registration() ? SlotBytes(view, tiers::Tier::kHost) : tm_->slot_bytes();
}

Status Session::CheckShareLocked(tiers::Tier tier, uint64_t n, uint64_t slot_bytes) const {
  const int i = tier == tiers::Tier::kHbm ? 0 : 1;
  if (n == 0 || slot_bytes == 0 || held_[i] + n * slot_bytes <= share_cap_[i]) return Status::Ok();
  return Status::Rejected(std::string("this client holds ") + std::to_string(held_[i]) + " bytes of " +
                          tiers::TierName(tier) + " slots under its leases and asks for " + std::to_string(n) +
                          " more of " + std::to_string(slot_bytes) +
                          " bytes; daemon.max_tier_share_per_client lets one client hold " +
                          std::to_string(share_cap_[i] / slot_bytes) + " of these (" +
                          std::to_string(share_cap_[i]) + " of the tier's " + std::to_string(tier_bytes_[i]) +
                          " bytes): release leases first");
}

void Session::ReleaseSlots(const Lease& lease, bool bulk) {
  if (!lease.staged.empty()) staging_->Free(lease.staged);  // kNoStaging entries are skipped
  // Committed (or acquired) blocks are unpinned, slots never committed freed.
  if (!lease.alloc) return ReleaseInSteps(lease.slots, /*free=*/false, bulk);
  std::vector<tiers::SlotRef> unpin, free;
  for (size_t i = 0; i < lease.slots.size(); ++i) (lease.committed[i] ? unpin : free).push_back(lease.slots[i]);
  ReleaseInSteps(free, /*free=*/true, bulk);
  ReleaseInSteps(unpin, /*free=*/false, bulk);
}

void Session::ReleaseInSteps(std::span<const tiers::SlotRef> slots, bool free, bool bulk) {
  // Steps are claimed one at a time, so that the request's own thread can take over the
  // rest from a bulk thread that gets too little CPU (daemon/bulk_runner.h).
  std::mutex mu;  // first, failed
  Status first;
  size_t failed = 0;
  std::atomic<size_t> next{0};
  RunSteps(slots.size(), bulk, [&] {
    const size_t at = next.fetch_add(kAcquireLockChunk, std::memory_order_relaxed);
    if (at >= slots.size()) return false;
    if (at > 0) YieldBetweenSteps();
    const auto step = slots.subspan(at, std::min(kAcquireLockChunk, slots.size() - at));
    size_t f = 0;
    Status s = free ? tm_->FreeSlots(step, &f) : tm_->UnpinAll(step, &f);
    std::lock_guard<std::mutex> l(mu);
    if (!s.ok() && first.ok()) first = s;
    failed += f;
    return true;
  });
  ReleaseFailed(free ? "FreeSlot" : "Unpin", failed, slots.size(), first);
}

void Session::YieldBetweenSteps() { std::this_thread::yield(); }

void Session::HandOver(const std::function<bool()>& step) {
  metrics_->bulk_requests.fetch_add(1, std::memory_order_relaxed);
  bulk_runs_.fetch_add(1, std::memory_order_relaxed);
  if (bulk_.Run(step)) metrics_->bulk_takeovers.fetch_add(1, std::memory_order_relaxed);
}

void Session::ReleaseFailed(const char* what, size_t failed, size_t n, const Status& first) const {
  if (failed == 0) return;
  static LogLimit release_log;
  uint64_t held = 0;
  if (release_log.Allow(&held)) {
    spdlog::warn("client {}: {} of {} of a lease's {} slots failed, the first: {} ({} more such lines held back)", id_,
                 what, failed, n, first.ToString(), held);
  }
}

Status Session::DoRelease(uint64_t lease_id) {
  if (lease_id == 0) return Status::Ok();  // the lease of a miss: a no-op, like free(NULL)
  std::lock_guard<std::mutex> cl(commit_mu_);  // not under a commit's copy into its slots
  Lease lease;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = leases_.find(lease_id);
    if (it == leases_.end()) {
      return Status::NotFound("lease " + std::to_string(lease_id) + " is not held by this client");
    }
    lease = std::move(it->second);
    leases_.erase(it);
    for (int i : {0, 1}) held_[i] -= std::min(held_[i], lease.bytes[i]);
  }
  metrics_->leases.fetch_sub(1);
  metrics_->leased_slots.fetch_sub(static_cast<int64_t>(lease.slots.size()));
  KVTIER_TEST_POINT("Session::Release:BeforeUnpin");
  ReleaseSlots(lease, /*bulk=*/OnRingThread());
  return Status::Ok();
}

void Session::Execute(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                      Done done) {
  const auto op = static_cast<wire::Op>(req.op);
  if (op == wire::Op::kAcquire) return HandleAcquire(req, in, out, std::move(done));
  if (op == wire::Op::kAcquireAsync) return HandleAcquireAsync(req, in, out, std::move(done));
  wire::CompletionEntry c;
  c.tag = req.tag;
  c.op = req.op;
  Status s;
  switch (op) {
    case wire::Op::kNop: break;
    case wire::Op::kAdmin: s = DoAdmin(req, in, out, &c); break;
    case wire::Op::kRegisterContract: s = HandleRegisterContract(req, in, &c); break;
    case wire::Op::kLookup: s = HandleLookup(req, in, out, &c); break;
    case wire::Op::kAlloc: s = HandleAlloc(req, out, &c); break;
    case wire::Op::kCommit: s = HandleCommit(req, in, &c); break;
    case wire::Op::kRelease: s = DoRelease(req.lease_id); break;
    case wire::Op::kPrefetch: s = HandlePrefetch(req, in); break;
    case wire::Op::kStats: s = HandleStats(req, out, &c); break;
    case wire::Op::kAcquire:
    case wire::Op::kAcquireAsync: break;  // above
    default: s = Status::Invalid("op " + std::to_string(req.op) + " unknown"); break;
  }
  if (!s.ok()) {
    const uint32_t committed = c.count;
    SetError(&c, s, out, req.out_len);
    if (op == wire::Op::kCommit) c.count = committed;  // committed before the failure
  }
  done(c);
}

Status Session::HandleRegisterContract(const wire::RequestEntry& req, std::span<const uint8_t> in,
                                       wire::CompletionEntry* c) {
  const std::vector<uint8_t> bytes(in.begin(), in.end());
  auto ct = ScaleContract::Deserialize(bytes);
  if (!ct.ok()) return ct.status();
  const bool shared = (req.flags & wire::kRequestShared) != 0;
  const uint64_t public_id = shared ? SharedContractId(ct->Id()) : ct->Id();
  // Private: the contract in this tenant's namespace. Shared: one id for every tenant.
  const uint64_t internal = shared ? public_id : NamespacedContractId(ns_, ct->Id());
  {
    std::lock_guard<std::mutex> l(mu_);
    if (registered_ids_.count(internal) == 0 && registered_ids_.size() >= limits_.max_contracts) {
      return Status::Rejected("this client registered " + std::to_string(registered_ids_.size()) +
                              " contracts, daemon.max_contracts_per_client");
    }
  }
  if (admit_contract_) KVTIER_RETURN_IF_ERROR(admit_contract_(internal));
  if (!namespaced_ && !shared) {
    KVTIER_RETURN_IF_ERROR(tm_->RegisterContract(*ct));
  } else {
    const uint32_t owner = shared ? kSharedOwner : tenant_;
    // The namespace's own keys in the remote tier too ("" for the implicit tenant).
    const std::string ns = tenants_ != nullptr ? tenants_->NamespaceName(owner) : (shared ? "shared" : "");
    KVTIER_RETURN_IF_ERROR(
        tm_->RegisterContractAs(*ct, internal, namespaced_ ? tenants_->group_of(owner) : 0, ns));
    if (tenants_ != nullptr) tenants_->owners().Add(internal, {owner, public_id});
    if (shared) {
      std::lock_guard<std::mutex> l(ns_mu_);
      shared_.insert(public_id);
    }
  }
  bool first = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    first = registered_ids_.insert(internal).second;
  }
  // Every namespace's contracts: counted for the daemon to forget at the last registrant's
  // detach, and kept for restarts.
  if (first && registered_) registered_(*ct, internal, shared ? kSharedOwner : tenant_);
  c->value = public_id;
  // Where its blocks go in the host tier: its slot class and fill, in the completion
  // (protocol 5) and in the log line; its slot in each tier (protocol 9). One view.
  const tiers::ContractView view = tm_->View(internal);
  const tiers::SlotFit& f = view.fit;
  if (limits_.protocol_version >= 5) {
    c->count = static_cast<uint32_t>(f.cls);
    c->est_seconds = f.fill;
  }
  if (limits_.protocol_version >= 9) {
    // Its slot in each tier, in granules of the tier (each tier's own class of it).
    const uint64_t hg = tm_->has_tier(tiers::Tier::kHost) ? tm_->host_geometry().granule : 0;
    const uint64_t bg = tm_->has_tier(tiers::Tier::kHbm) ? tm_->hbm_geometry().granule : 0;
    c->cached_same = hg ? static_cast<uint32_t>(view.host_slot_bytes / hg) : 0;
    c->cached_different = bg ? static_cast<uint32_t>(view.hbm_slot_bytes / bg) : 0;
  }
  static LogLimit register_log;  // a client may register (the same contract) at any rate
  uint64_t held = 0;
  if (register_log.Allow(&held)) {
    spdlog::info("client {} ({}): contract {} ({}, L={} H={} D={} T={}){} registered: blocks of {} B in host "
                 "slots of {} B, fill {:.1f}% ({} more registrations not logged)",
                 id_, name_, ContractIdHex(c->value), ct->model_id, ct->geometry.num_layers,
                 ct->geometry.num_kv_heads, ct->geometry.head_dim, ct->geometry.block_tokens,
                 shared ? " in the shared namespace" : "", ct->block_bytes(), f.slot_bytes, 100.0 * f.fill, held);
  }
  return Status::Ok();
}

Status Session::HandleLookup(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                             wire::CompletionEntry* c) {
  auto cid = ContractOf(req.contract_id);
  if (!cid.ok()) return cid.status();
  // Keys and tiers in buffers of this thread that keep their size: no allocation per
  // lookup. The keys are copied out of the request (the ring's data area is the
  // client's to change while we read); out has room for count bytes (validated).
  thread_local std::vector<Key128> keys;
  thread_local std::vector<tiers::Tier> tiers;
  if (keys.size() < req.count) {
    keys.resize(req.count);
    tiers.resize(req.count);
  }
  std::memcpy(keys.data(), in.data(), sizeof(Key128) * req.count);
  double est = 0.0;
  const size_t hit = std::min<size_t>(
      tm_->LookupInto(*cid, std::span<const Key128>(keys.data(), req.count), tiers.data(), &est),
      req.count);
  if (counters_ != nullptr) {
    counters_->lookup_keys.fetch_add(req.count, std::memory_order_relaxed);
    counters_->lookup_hits.fetch_add(hit, std::memory_order_relaxed);
  }
  std::memcpy(out, tiers.data(), hit);
  std::memset(out + hit, wire::kTierNone, req.count - hit);
  c->count = static_cast<uint32_t>(hit);
  c->out_bytes = req.count;
  c->est_seconds = est;
  return Status::Ok();
}

Status Session::HandlePrefetch(const wire::RequestEntry& req, std::span<const uint8_t> in) {
  auto cid = ContractOf(req.contract_id);
  if (!cid.ok()) return cid.status();
  KVTIER_RETURN_IF_ERROR(CheckTarget(req.tier));
  const auto keys = CopyArray<Key128>(in.data(), req.count);
  tm_->Prefetch(*cid, keys, static_cast<tiers::Tier>(req.tier));
  return Status::Ok();
}

Status Session::HandleStats(const wire::RequestEntry& req, uint8_t* out, wire::CompletionEntry* c) {
  auto stats = tm_->Stats();
  if (namespaced_ && !tenants_->access().IsOperator(peer_)) {
    // A tenant's client sees the tiers' sizes and its own blocks, never the counters that
    // every tenant's traffic moves (hits, misses, evictions, ...: they would time others).
    const auto groups = tm_->GroupStatsAll();
    const uint32_t g = tenants_->group_of(tenant_);
    for (auto& t : stats) {
      tiers::TierStats own;
      own.tier = t.tier;
      own.present = t.present;
      own.capacity_bytes = t.capacity_bytes;
      own.slots_total = t.slots_total;
      const int k = static_cast<int>(t.tier);
      if (k >= 0 && k < 3 && g < groups.size()) own.blocks = groups[g].blocks[k];
      t = own;
    }
  }
  uint32_t n = 0;
  for (const auto& t : stats) {
    if (n >= req.count) break;
    wire::WireTierStats w = ToWire(t);
    if (limits_.protocol_version < 7) w.slab_moves = 0;  // reserved (0) before protocol 7
    std::memcpy(out + n * sizeof(w), &w, sizeof(w));
    ++n;
  }
  c->count = n;
  c->out_bytes = n * static_cast<uint32_t>(sizeof(wire::WireTierStats));
  return Status::Ok();
}

void Session::DrainOverflowLocked() {
  while (!overflow_.empty() && cmp_ring_.TryPush(overflow_.front())) overflow_.pop_front();
  if (cmp_ring_.ConsumerSleeping()) wire::FutexWake(cmp_ring_.tail_word());
}

void Session::PublishCompletion(const wire::CompletionEntry& c) {
  std::lock_guard<std::mutex> l(cmp_mu_);
  if (!overflow_.empty() || !cmp_ring_.TryPush(c)) {
    overflow_.push_back(c);
    // A client that never reads its completions while it keeps submitting is broken.
    if (overflow_.size() > 4 * static_cast<size_t>(hdr_.entries) && !kicked_.exchange(true)) {
      metrics_->disconnect_misbehaved.fetch_add(1);
      kick_("completion ring not consumed");
    }
  }
  if (cmp_ring_.ConsumerSleeping()) wire::FutexWake(cmp_ring_.tail_word());
}

void Session::Close(bool drain) {
  std::lock_guard<std::mutex> cl(close_mu_);
  if (close_done_) return;
  close_done_ = true;
  drain_ = drain;
  stop_.store(true, std::memory_order_release);
  wire::FutexWake(req_ring_.tail_word());
  if (thread_.joinable()) {
    if (thread_.get_id() == std::this_thread::get_id()) thread_.detach();
    else thread_.join();
  }
  std::lock_guard<std::mutex> commits(commit_mu_);  // a socket-path commit's copy ends first
  // Acquires in flight finish on TierManager threads; wait for them (bounded) so that
  // their slots are leased (then released below) rather than left pinned.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  std::unordered_map<uint64_t, Lease> leases;
  while (true) {
    std::unique_lock<std::mutex> l(mu_);
    if (inflight_ == 0 || Clock::now() > deadline) {
      static LogLimit inflight_log;
      uint64_t held = 0;
      if (inflight_ != 0 && inflight_log.Allow(&held)) {
        spdlog::warn("client {}: {} acquires still in flight at close; their callbacks will unpin "
                     "({} more such lines held back)", id_, inflight_, held);
      }
      closed_ = true;
      leases.swap(leases_);
      held_[0] = held_[1] = 0;
      break;
    }
    l.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  size_t slots = 0;
  for (auto& [id, lease] : leases) {
    slots += lease.slots.size();
    metrics_->leases.fetch_sub(1);
    metrics_->leased_slots.fetch_sub(static_cast<int64_t>(lease.slots.size()));
    ReleaseSlots(lease, /*bulk=*/true);
  }
  static LogLimit released_log(std::chrono::seconds(1));
  uint64_t held = 0;
  if (!leases.empty() && released_log.Allow(&held)) {
    spdlog::info("client {} ({}, pid {}): released {} leases ({} slots) at disconnect ({} more such lines held back)",
                 id_, name_, pid_, leases.size(), slots, held);
  }
}

}  // namespace kvtier::daemon
