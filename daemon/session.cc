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

uint64_t SlotKey(const tiers::SlotRef& s) {
  return (static_cast<uint64_t>(s.tier) << 32) | s.slot;
}

// Writes an error's text at the start of the out region (when there is room).
void SetError(wire::CompletionEntry* c, const Status& s, uint8_t* out, uint32_t out_len) {
  c->status = static_cast<int32_t>(s.code());
  c->count = 0;
  c->out_bytes = 0;
  const std::string& m = s.message();
  const size_t n = std::min<size_t>({m.size(), out_len, 65535});
  if (out != nullptr && n > 0) {
    std::memcpy(out, m.data(), n);
    c->msg_len = static_cast<uint16_t>(n);
  }
}

template <typename T>
std::vector<T> CopyArray(const uint8_t* src, uint32_t count) {
  std::vector<T> v(count);
  if (count > 0) std::memcpy(v.data(), src, sizeof(T) * count);
  return v;
}

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
      kick_(std::move(kick)) {}

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

bool TakeSpinPlace(uint32_t max) {
  uint32_t n = g_spinning.load(std::memory_order_relaxed);
  while (n < max) {
    if (g_spinning.compare_exchange_weak(n, n + 1, std::memory_order_acquire)) return true;
  }
  return false;
}
}  // namespace

void Session::RingLoop() {
  const auto spin = std::chrono::microseconds(limits_.spin_us);
  auto idle_start = Clock::now();
  uint32_t spins = 0;
  bool spinning = false;  // holds one of the daemon's spin places
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
      // finds every spin place taken sleeps at once.
      if (Clock::now() - idle_start < spin && (spinning || (spinning = TakeSpinPlace(limits_.max_spinning)))) {
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
    // request that ran past the spin window (a restore, a listing page) gives it up.
    wire::RequestEntry e;
    req_ring_.Pop(&e);
    const auto started = Clock::now();
    HandleRingRequest(e);
    if (kicked_.load()) break;
    idle_start = Clock::now();
    if (idle_start - started >= spin) stop_spinning();
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
  if (!tm_->HasContract(contract_id)) {
    return Status::NotFound("contract " + ContractIdHex(contract_id) +
                            " is not registered: register it first (kvtier_register_contract)");
  }
  return Status::Ok();
}

StatusOr<uint64_t> Session::ContractOf(uint64_t contract_id) const {
  if (!namespaced_) {
    KVTIER_RETURN_IF_ERROR(CheckContract(contract_id));
    return contract_id;
  }
  bool shared = false;
  {
    std::lock_guard<std::mutex> l(ns_mu_);
    auto it = resolved_.find(contract_id);
    if (it != resolved_.end()) return it->second;
    shared = shared_.count(contract_id) != 0;
  }
  const uint64_t internal = shared ? contract_id : NamespacedContractId(ns_, contract_id);
  const ContractOwners::Owner o = tenants_->owners().Get(internal);
  const bool mine = shared ? o.tenant == kSharedOwner : o.tenant == tenant_ && o.public_id == contract_id;
  if (!mine && operator_ && tm_->HasContract(contract_id)) {
    // An operator may name any tenant's contract by the TierManager's id (what its
    // listings show), to export or check it.
    std::lock_guard<std::mutex> l(ns_mu_);
    resolved_.emplace(contract_id, contract_id);
    return contract_id;
  }
  if (!mine || !tm_->HasContract(internal)) {
    // Another tenant's contract reads as one never registered: nothing to learn from it.
    return Status::NotFound("contract " + ContractIdHex(contract_id) +
                            " is not registered: register it first (kvtier_register_contract)");
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

Status Session::BeginAcquire(bool async) {
  std::lock_guard<std::mutex> l(mu_);
  if (closed_) return Status::Rejected("client is closing");
  if (leases_.size() >= limits_.max_leases) return Status::Rejected("lease table full: release leases first");
  if (async && async_inflight_ >= limits_.max_async_acquires) {
    return Status::Rejected(std::to_string(async_inflight_) +
                            " asynchronous acquires are in flight on this client, the most it may have "
                            "(daemon.max_async_acquires_per_client): wait for one to finish");
  }
  ++inflight_;
  if (async) ++async_inflight_;
  return Status::Ok();
}

void Session::WakeProgress(wire::AcquireProgress* p) {
  std::atomic_ref<uint32_t>(p->events).fetch_add(1, std::memory_order_release);
  wire::FutexWake(&p->events);
}

StatusOr<uint64_t> Session::AddLease(Lease lease) {
  // The lease's bytes per tier, each slot its class's (asked before mu_: FitOf takes the
  // TierManager's lock).
  const uint64_t weight[2] = {SlotBytes(lease.contract_id, tiers::Tier::kHbm),
                              SlotBytes(lease.contract_id, tiers::Tier::kHost)};
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

uint64_t Session::SlotBytes(uint64_t contract, tiers::Tier tier) const {
  const uint64_t b = tm_->ContractSlotBytes(contract, tier);  // the tier's own class of it
  return b != 0 ? b : tm_->slot_bytes();
}

uint64_t Session::StagingSlotBytes(uint64_t contract) const {
  // Classes fixed at start: every staging slot holds the largest (slot_bytes).
  return tm_->classes_at_registration() ? SlotBytes(contract, tiers::Tier::kHost) : tm_->slot_bytes();
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

std::vector<tiers::SlotRef> Session::UniqueSlots(const std::vector<tiers::SlotRef>& slots) {
  std::vector<uint64_t> keys;
  keys.reserve(slots.size());
  for (const auto& s : slots) keys.push_back(SlotKey(s));
  std::sort(keys.begin(), keys.end());
  std::vector<tiers::SlotRef> out;
  out.reserve(slots.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const tiers::SlotRef ref{static_cast<tiers::Tier>(keys[i] >> 32), static_cast<uint32_t>(keys[i])};
    if (i > 0 && keys[i] == keys[i - 1]) {
      (void)tm_->Unpin(ref);  // a key named again: its extra pin goes at once
      continue;
    }
    out.push_back(ref);
  }
  return out;
}

void Session::ReleaseSlots(const Lease& lease) {
  if (!lease.staged.empty()) staging_->Free(lease.staged);  // kNoStaging entries are skipped
  for (size_t i = 0; i < lease.slots.size(); ++i) {
    const auto& s = lease.slots[i];
    const bool free_slot = lease.alloc && !lease.committed[i];
    Status st = free_slot ? tm_->FreeSlot(s) : tm_->Unpin(s);
    static LogLimit release_log;
    uint64_t held = 0;
    if (!st.ok() && release_log.Allow(&held)) {
      spdlog::warn("client {}: {} of {} slot {} failed: {} ({} more such lines held back)", id_,
                   free_slot ? "FreeSlot" : "Unpin", tiers::TierName(s.tier), s.slot, st.ToString(), held);
    }
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
  ReleaseSlots(lease);
  return Status::Ok();
}

wire::WireSlot Session::ClientSlot(const Lease& lease, size_t i) const {
  wire::WireSlot ws;
  ws.tier = static_cast<uint8_t>(lease.slots[i].tier);
  ws.slot = i < lease.staged.size() && lease.staged[i] != kNoStaging ? staging_->id_of(lease.staged[i])
                                                                      : lease.slots[i].slot;
  return ws;
}

Status Session::StagingFull(size_t n, const Status& why) const {
  if (why.code() == StatusCode::kRetry) return why;  // the daemon's total: passes as others release
  return Status::Rejected("this client's staging area (" + std::to_string(staging_->slots()) +
                          " slots, tiers.host.staging_slots_per_client) has " +
                          std::to_string(staging_->slots() - staging_->used()) + " free for copies of " +
                          std::to_string(n) +
                          " acquired blocks (with [[tenants]] a host acquire reads copies): release leases first");
}

uint32_t Session::FindCopy(const Copies& copies, uint32_t slot) {
  auto it = std::lower_bound(copies.begin(), copies.end(), slot,
                             [](const std::pair<uint32_t, uint32_t>& e, uint32_t s) { return e.first < s; });
  return it != copies.end() && it->first == slot ? it->second : kNoStaging;
}

Status Session::CopyToStaging(std::span<const tiers::SlotRef> slots, uint64_t block_bytes, uint64_t slot_bytes,
                              Copies* copies) {
  std::vector<uint32_t> need;  // arena slots without a copy yet, each once
  need.reserve(slots.size());
  for (const auto& r : slots) {
    if (r.tier != tiers::Tier::kHost || (r.slot >= part_lo_ && r.slot < part_hi_)) continue;  // read in place
    if (FindCopy(*copies, r.slot) == kNoStaging) need.push_back(r.slot);
  }
  std::sort(need.begin(), need.end());
  need.erase(std::unique(need.begin(), need.end()), need.end());
  std::vector<uint32_t> got;
  got.reserve(need.size());
  Status st = staging_->Alloc(static_cast<uint32_t>(need.size()), block_bytes, slot_bytes, &got);
  for (size_t i = 0; st.ok() && i < need.size(); ++i) {
    if (tm_->host_slot_ptr(need[i]) == nullptr) st = Status::Invalid("host slot " + std::to_string(need[i]));
  }
  if (!st.ok()) {
    staging_->Free(got);
    return st;
  }
  // The arena slots are pinned by the acquire: their bytes stay while they are read.
  const auto old = static_cast<ptrdiff_t>(copies->size());
  for (size_t i = 0; i < need.size(); ++i) {
    std::memcpy(staging_->slot_ptr(got[i]), tm_->host_slot_ptr(need[i]), block_bytes);
    copies->emplace_back(need[i], got[i]);
  }
  std::inplace_merge(copies->begin(), copies->begin() + old, copies->end());
  return Status::Ok();
}

uint32_t Session::AcquiredSlotId(const tiers::SlotRef& ref, const Copies& copies) const {
  if (ref.tier != tiers::Tier::kHost) return ref.slot;
  const uint32_t i = FindCopy(copies, ref.slot);
  return i == kNoStaging ? ref.slot : staging_->id_of(i);
}

std::vector<uint32_t> Session::StagedOf(const std::vector<tiers::SlotRef>& slots, const Copies& copies) {
  std::vector<uint32_t> staged;
  if (copies.empty()) return staged;
  staged.assign(slots.size(), kNoStaging);
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].tier == tiers::Tier::kHost) staged[i] = FindCopy(copies, slots[i].slot);
  }
  return staged;
}

Status Session::DoCommit(const wire::RequestEntry& req, uint64_t contract_id, std::span<const uint8_t> in,
                         wire::CompletionEntry* c) {
  c->count = 0;
  uint32_t* committed = &c->count;
  const auto items = CopyArray<wire::CommitItem>(in.data(), req.count);
  // Three steps, so that the copies of staged blocks (up to a slot each) run without mu_,
  // which the TierManager's threads take to add acquire leases: (1) check the items and
  // note where each goes, up to the first bad one; (2) copy each staged block into its
  // arena slot; (3) commit them in order. commit_mu_ keeps this client's releases (and
  // other commits) out until the end, so the arena slots stay this lease's throughout.
  std::lock_guard<std::mutex> cl(commit_mu_);
  struct Step {
    size_t pos;  // position in the lease
    Key128 key, parent;
  };
  std::vector<Step> steps;
  steps.reserve(items.size());
  Status bad;  // the first item that cannot go through (the ones before it do)
  uint64_t block_bytes = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = leases_.find(req.lease_id);
    if (it == leases_.end()) {
      return Status::NotFound("lease " + std::to_string(req.lease_id) + " is not held by this client");
    }
    Lease& lease = it->second;
    if (!lease.alloc) return Status::Invalid("lease " + std::to_string(req.lease_id) + " is not an alloc lease");
    if (lease.contract_id != contract_id) {
      return Status::Invalid("contract " + ContractIdHex(req.contract_id) + " is not the lease's contract " +
                             ContractIdHex(lease.contract_id));
    }
    std::vector<uint8_t> taken(lease.slots.size(), 0);  // a slot named twice in one request
    for (const auto& item : items) {
      if (item.reserved[0] != 0 || item.reserved[1] != 0 || item.reserved[2] != 0) {
        bad = Status::Invalid("commit item reserved bytes must be 0");
        break;
      }
      const tiers::SlotRef ref{static_cast<tiers::Tier>(item.tier), item.slot};
      auto pos = lease.index.find(SlotKey(ref));
      if (pos == lease.index.end()) {
        bad = Status::Invalid("slot " + std::to_string(item.slot) + " (tier " + std::to_string(item.tier) +
                              ") is not in lease " + std::to_string(req.lease_id));
        break;
      }
      if (lease.committed[pos->second] || taken[pos->second]) {
        bad = Status::Invalid("slot " + std::to_string(item.slot) + " is already committed");
        break;
      }
      const Key128 key{item.key.hi, item.key.lo};
      if (key.IsZero()) {
        bad = Status::Invalid("key 0 is not a block key");
        break;
      }
      taken[pos->second] = 1;
      steps.push_back({pos->second, key, Key128{item.parent.hi, item.parent.lo}});
    }
    for (const Step& st : steps) {
      if (st.pos < lease.staged.size() && lease.staged[st.pos] != kNoStaging) {
        block_bytes = tm_->block_bytes(contract_id);
        break;
      }
    }
  }
  // The lease cannot go away meanwhile (commit_mu_); its vectors do not change size.
  Lease* lease = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    lease = &leases_.at(req.lease_id);
  }
  if (block_bytes > 0) {
    for (const Step& st : steps) {
      if (st.pos >= lease->staged.size() || lease->staged[st.pos] == kNoStaging) continue;
      uint8_t* dst = tm_->host_slot_ptr(lease->slots[st.pos].slot);
      if (dst == nullptr) return Status::Invalid("host slot " + std::to_string(lease->slots[st.pos].slot) + " unknown");
      std::memcpy(dst, staging_->slot_ptr(lease->staged[st.pos]), block_bytes);
    }
  }
  for (const Step& st : steps) {
    std::lock_guard<std::mutex> l(mu_);
    tiers::CommitOutcome outcome = tiers::CommitOutcome::kStored;
    Status cs = tm_->Commit(contract_id, lease->slots[st.pos], st.key, st.parent, CommitterOf(), &outcome);
    if (!cs.ok()) {
      NoteCachedCommits(*c, req);
      return cs;
    }
    switch (outcome) {
      case tiers::CommitOutcome::kStored: break;
      case tiers::CommitOutcome::kSame: ++c->cached_same; break;
      case tiers::CommitOutcome::kDifferent: ++c->cached_different; break;
      case tiers::CommitOutcome::kUnchecked: ++c->cached_unchecked; break;
      case tiers::CommitOutcome::kReplaced: ++c->cached_different, ++c->cached_replaced; break;
      case tiers::CommitOutcome::kDisputed: ++c->cached_different, ++c->cached_disputed; break;
    }
    KVTIER_TEST_POINT("Session::Commit:AfterTierCommit");  // visible, not yet acknowledged
    lease->committed[st.pos] = 1;
    if (st.pos < lease->staged.size() && lease->staged[st.pos] != kNoStaging) {
      staging_->Free(lease->staged[st.pos]);  // the client's again (its bytes no longer matter)
      lease->staged[st.pos] = kNoStaging;
    }
    ++*committed;
  }
  NoteCachedCommits(*c, req);
  return bad;
}

void Session::NoteCachedCommits(const wire::CompletionEntry& c, const wire::RequestEntry& req) {
  metrics_->commit_cached_same.fetch_add(c.cached_same, std::memory_order_relaxed);
  metrics_->commit_conflicts.fetch_add(c.cached_different, std::memory_order_relaxed);
  metrics_->commit_cached_unchecked.fetch_add(c.cached_unchecked, std::memory_order_relaxed);
  if (c.cached_different == 0) return;
  static LogLimit conflict_log;  // any client can cause it, at any rate
  uint64_t held = 0;
  if (conflict_log.Allow(&held)) {
    spdlog::warn("client {} ({}, pid {}): {} of {} committed blocks of contract {} were already cached with "
                 "different bytes (tiers.on_conflict decided; {} more such lines not logged)",
                 id_, name_, pid_, c.cached_different, c.count, ContractIdHex(req.contract_id), held);
  }
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
  // (protocol 5) and in the log line.
  const tiers::SlotFit f = tm_->Fit(*ct);
  if (limits_.protocol_version >= 5) {
    c->count = static_cast<uint32_t>(f.cls);
    c->est_seconds = f.fill;
  }
  if (limits_.protocol_version >= 9) {
    // Its slot in each tier, in granules of the tier (each tier's own class of it).
    const uint64_t hg = tm_->has_tier(tiers::Tier::kHost) ? tm_->host_geometry().granule : 0;
    const uint64_t bg = tm_->has_tier(tiers::Tier::kHbm) ? tm_->hbm_geometry().granule : 0;
    c->cached_same = hg ? static_cast<uint32_t>(tm_->ContractSlotBytes(internal, tiers::Tier::kHost) / hg) : 0;
    c->cached_different = bg ? static_cast<uint32_t>(tm_->ContractSlotBytes(internal, tiers::Tier::kHbm) / bg) : 0;
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

void Session::HandleAcquire(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                            Done done) {
  wire::CompletionEntry c;
  c.tag = req.tag;
  c.op = req.op;
  auto fail = [&](const Status& s) {
    SetError(&c, s, out, req.out_len);
    done(c);
  };
  auto cid = ContractOf(req.contract_id);
  Status s = cid.status();
  if (s.ok()) s = CheckTarget(req.tier);
  if (!s.ok()) return fail(s);
  if (Status b = BeginAcquire(); !b.ok()) return fail(b);
  if (req.count > kAcquireLockChunk) {
    // A big acquire holds the index lock one step at a time.
    return AcquireInSteps(req, *cid, CopyArray<Key128>(in.data(), req.count), kAcquireLockChunk, /*async=*/false,
                          out, std::move(done));
  }
  auto keys = std::make_shared<std::vector<Key128>>(CopyArray<Key128>(in.data(), req.count));
  auto self = shared_from_this();
  const uint32_t max_out = req.count;
  const uint64_t contract_id = *cid;
  // Private reads: the block size each copy takes (looked up once, here).
  const uint64_t copy_bytes = private_reads() && req.tier == wire::kTierHost ? tm_->block_bytes(contract_id) : 0;
  const uint64_t copy_slot = copy_bytes > 0 ? StagingSlotBytes(contract_id) : 0;
  tm_->Acquire(contract_id, *keys, static_cast<tiers::Tier>(req.tier),
               [self, keys, c, out, max_out, contract_id, copy_bytes, copy_slot, out_len = req.out_len,
                done = std::move(done)](Status st, std::vector<tiers::SlotRef> slots) mutable {
                 if (slots.size() > max_out) {  // never more than asked; return extras
                   for (size_t i = max_out; i < slots.size(); ++i) (void)self->tm_->Unpin(slots[i]);
                   slots.resize(max_out);
                 }
                 if (slots.empty()) {
                   if (!st.ok()) SetError(&c, st, out, out_len);
                 } else {
                   Lease lease;
                   lease.alloc = false;
                   lease.contract_id = contract_id;
                   lease.slots = self->UniqueSlots(slots);
                   Copies copy;  // arena slot -> staging slot of its copy
                   auto id = [&]() -> StatusOr<uint64_t> {
                     if (copy_bytes > 0) {
                       if (Status cs = self->CopyToStaging(lease.slots, copy_bytes, copy_slot, &copy); !cs.ok()) {
                         const size_t n_slots = lease.slots.size();
                         self->ReleaseSlots(lease);
                         return self->StagingFull(n_slots, cs);
                       }
                     }
                     lease.staged = StagedOf(lease.slots, copy);
                     return self->AddLease(std::move(lease));  // on failure it returns the copies too
                   }();
                   if (!id.ok()) {
                     SetError(&c, id.status(), out, out_len);
                   } else {
                     for (size_t i = 0; i < slots.size(); ++i) {
                       wire::WireSlot ws;
                       ws.tier = static_cast<uint8_t>(slots[i].tier);
                       ws.from_tier = static_cast<uint8_t>(slots[i].from);
                       ws.slot = self->AcquiredSlotId(slots[i], copy);
                       std::memcpy(out + i * sizeof(ws), &ws, sizeof(ws));
                     }
                     c.value = *id;
                     c.count = static_cast<uint32_t>(slots.size());
                     c.out_bytes = static_cast<uint32_t>(slots.size() * sizeof(wire::WireSlot));
                   }
                 }
                 done(c);
                 std::lock_guard<std::mutex> l(self->mu_);
                 --self->inflight_;
               });
}

// The asynchronous acquire: AcquireInSteps with the client's readiness step (never more
// keys a step than kAcquireLockChunk: a step is also one hold of the index lock).
void Session::HandleAcquireAsync(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                                 Done done) {
  wire::CompletionEntry c;
  c.tag = req.tag;
  c.op = req.op;
  auto fail = [&](const Status& s) {
    auto* p = reinterpret_cast<wire::AcquireProgress*>(out);
    std::atomic_ref<uint32_t>(p->done).store(1, std::memory_order_release);
    WakeProgress(p);
    // Error text goes after the AcquireProgress header (the client polls it).
    SetError(&c, s, out + sizeof(wire::AcquireProgress), req.out_len - static_cast<uint32_t>(sizeof(wire::AcquireProgress)));
    done(c);
  };
  wire::AcquireAsyncHeader h;
  std::memcpy(&h, in.data(), sizeof h);
  auto cid = ContractOf(req.contract_id);
  Status s = cid.status();
  if (s.ok()) s = CheckTarget(req.tier);
  if (s.ok() && h.reserved != 0) s = Status::Invalid("acquire_async header reserved field must be 0");
  if (!s.ok()) return fail(s);
  if (Status b = BeginAcquire(/*async=*/true); !b.ok()) return fail(b);
  const size_t chunk = std::min<size_t>(h.chunk_blocks == 0 ? wire::kDefaultAcquireChunk : h.chunk_blocks,
                                        kAcquireLockChunk);
  AcquireInSteps(req, *cid, CopyArray<Key128>(in.data() + sizeof h, req.count), chunk, /*async=*/true, out,
                 std::move(done));
}

// As the leading steps finish, their slots land in the slots' place and, async,
// AcquireProgress.ready grows (a release store after the slots). A step that comes back
// short ends the prefix: the steps after it are unpinned. The last callback makes one
// lease of the prefix and completes as the blocking acquire does.
void Session::AcquireInSteps(const wire::RequestEntry& req, uint64_t contract_id, std::vector<Key128> keys,
                             size_t chunk, bool async, uint8_t* out, Done done) {
  wire::CompletionEntry c;
  c.tag = req.tag;
  c.op = req.op;
  const uint32_t head = async ? static_cast<uint32_t>(sizeof(wire::AcquireProgress)) : 0;
  uint8_t* text = out + head;
  const uint32_t text_len = req.out_len - head;
  struct Steps {
    std::mutex mu;
    std::vector<Key128> keys;
    size_t chunk = 0;
    std::vector<std::vector<tiers::SlotRef>> got;  // by chunk, as its callback left it
    std::vector<uint8_t> arrived;
    std::vector<Status> status;
    size_t next = 0;        // first chunk not yet folded into the prefix
    size_t ready = 0;       // slots of the prefix written to out
    bool ended = false;     // a short chunk ended the prefix
    size_t remaining = 0;   // callbacks still to come
    std::vector<tiers::SlotRef> prefix;
    Status first_error;
    uint64_t copy_bytes = 0;                       // private reads: bytes of each copy (0: none)
    uint64_t copy_slot = 0;                        // and of its staging slot
    Copies copy;                                   // arena slot -> staging slot of its copy
  };
  auto st = std::make_shared<Steps>();
  st->keys = std::move(keys);
  st->chunk = std::max<size_t>(chunk, 1);
  const size_t chunks = (st->keys.size() + st->chunk - 1) / st->chunk;
  st->got.resize(chunks);
  st->arrived.assign(chunks, 0);
  st->status.resize(chunks);
  st->remaining = chunks;
  st->copy_bytes = private_reads() && req.tier == wire::kTierHost ? tm_->block_bytes(contract_id) : 0;
  st->copy_slot = st->copy_bytes > 0 ? StagingSlotBytes(contract_id) : 0;
  auto self = shared_from_this();
  auto* progress = async ? reinterpret_cast<wire::AcquireProgress*>(out) : nullptr;
  uint8_t* slots_out = out + head;
  if (progress) {
    std::atomic_ref<uint32_t>(progress->ready).store(0, std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(progress->done).store(0, std::memory_order_release);
  }
  auto shared_done = std::make_shared<Done>(std::move(done));
  for (size_t k = 0; k < chunks; ++k) {
    const size_t begin = k * st->chunk;
    const size_t n = std::min(st->chunk, st->keys.size() - begin);
    tm_->Acquire(
        contract_id, std::span<const Key128>(st->keys.data() + begin, n), static_cast<tiers::Tier>(req.tier),
        [self, st, k, n, c, async, head, progress, slots_out, text, text_len, contract_id,
         shared_done](Status cs, std::vector<tiers::SlotRef> slots) mutable {
          std::vector<tiers::SlotRef> unpin;
          bool last = false, grew = false;
          {
            std::lock_guard<std::mutex> l(st->mu);
            if (slots.size() > n) {  // never more than asked
              unpin.insert(unpin.end(), slots.begin() + static_cast<ptrdiff_t>(n), slots.end());
              slots.resize(n);
            }
            st->got[k] = std::move(slots);
            st->status[k] = cs;
            st->arrived[k] = 1;
            const size_t before = st->ready;
            while (st->next < st->got.size() && st->arrived[st->next]) {
              auto& g = st->got[st->next];
              // Private reads: a chunk whose copies find no room in the staging area ends
              // the prefix before it.
              if (!st->ended && st->copy_bytes > 0 && !g.empty()) {
                if (Status cs = self->CopyToStaging(g, st->copy_bytes, st->copy_slot, &st->copy); !cs.ok()) {
                  if (st->prefix.empty()) st->first_error = self->StagingFull(g.size(), cs);
                  st->ended = true;
                }
              }
              if (st->ended) {
                unpin.insert(unpin.end(), g.begin(), g.end());
              } else {
                const size_t want = std::min(st->chunk, st->keys.size() - st->next * st->chunk);
                for (const auto& ref : g) {
                  wire::WireSlot ws;
                  ws.tier = static_cast<uint8_t>(ref.tier);
                  ws.from_tier = static_cast<uint8_t>(ref.from);
                  ws.slot = self->AcquiredSlotId(ref, st->copy);
                  std::memcpy(slots_out + st->prefix.size() * sizeof(ws), &ws, sizeof(ws));
                  st->prefix.push_back(ref);
                }
                if (st->prefix.empty() && !st->status[st->next].ok()) st->first_error = st->status[st->next];
                if (g.size() < want) st->ended = true;
              }
              g.clear();
              ++st->next;
            }
            st->ready = st->prefix.size();
            if (progress && st->ready != before) {
              std::atomic_ref<uint32_t>(progress->ready).store(static_cast<uint32_t>(st->ready),
                                                               std::memory_order_release);
              WakeProgress(progress);  // the client's fd turns readable per ready step
            }
            last = --st->remaining == 0;
            grew = st->ready != before;
          }
          for (const auto& ref : unpin) (void)self->tm_->Unpin(ref);
          if (!last) {
            // A ready step published before the end (tests hold it here, with
            // KVTIER_TEST_DELAY_POINT, to see the client wake before the acquire finished).
            if (progress && grew) KVTIER_TEST_POINT("Session::AcquireStep:Ready");
            return;
          }
          if (progress) {
            std::atomic_ref<uint32_t>(progress->done).store(1, std::memory_order_release);
            WakeProgress(progress);
          }
          if (st->prefix.empty()) {
            if (!st->first_error.ok()) SetError(&c, st->first_error, text, text_len);
          } else {
            Lease lease;
            lease.alloc = false;
            lease.contract_id = contract_id;
            lease.slots = self->UniqueSlots(st->prefix);
            lease.staged = StagedOf(lease.slots, st->copy);
            const size_t n_slots = st->prefix.size();
            auto id = self->AddLease(std::move(lease));
            if (!id.ok()) {
              SetError(&c, id.status(), text, text_len);
            } else {
              c.value = *id;
              c.count = static_cast<uint32_t>(n_slots);
              c.out_bytes = static_cast<uint32_t>(head + n_slots * sizeof(wire::WireSlot));
            }
          }
          (*shared_done)(c);
          std::lock_guard<std::mutex> l(self->mu_);
          --self->inflight_;
          if (async) --self->async_inflight_;
        });
  }
}

Status Session::HandleAlloc(const wire::RequestEntry& req, uint8_t* out, wire::CompletionEntry* c) {
  auto cid = ContractOf(req.contract_id);
  if (!cid.ok()) return cid.status();
  KVTIER_RETURN_IF_ERROR(CheckTarget(req.tier));
  const uint64_t slot_bytes = SlotBytes(*cid, static_cast<tiers::Tier>(req.tier));
  {
    // Before the tier makes room: a request past this client's share evicts nothing.
    std::lock_guard<std::mutex> l(mu_);
    KVTIER_RETURN_IF_ERROR(CheckShareLocked(static_cast<tiers::Tier>(req.tier), req.count, slot_bytes));
  }
  // Host slots: first this client's staging slots (its cap), then the arena's.
  std::vector<uint32_t> staged;
  const bool host = req.tier == wire::kTierHost;
  Status staged_st =
      host ? staging_->Alloc(req.count, tm_->block_bytes(*cid), StagingSlotBytes(*cid), &staged) : Status::Ok();
  if (staged_st.code() == StatusCode::kRetry) return AllocRefusal(req, staged_st);  // the daemon's total
  if (!staged_st.ok()) {
    uint64_t total = 0;
    for (const auto& t : tm_->Stats()) total = t.tier == tiers::Tier::kHost ? t.slots_total : total;
    // Past the whole tier, not only the cap: the tier's numbers say more.
    if (staging_->used() + uint64_t{req.count} > total) return AllocRefusal(req, Status::Retry("host tier full"));
    if (tm_->classes_at_registration()) {  // an area of bytes: its own numbers say more
      return Status::Rejected("this client's " + staged_st.message() + ": commit or release leases first");
    }
    return Status::Rejected("this client holds " + std::to_string(staging_->used()) + " of its " +
                            std::to_string(staging_->slots()) +
                            " host slots under alloc leases (tiers.host.staging_slots_per_client) and asks for " +
                            std::to_string(req.count) + ": commit or release leases first");
  }
  auto unstage = [&] {
    for (uint32_t i : staged) staging_->Free(i);
  };
  std::vector<tiers::SlotRef> slots;
  Status as = tm_->AllocSlots(*cid, req.count, static_cast<tiers::Tier>(req.tier), &slots);
  if (!as.ok()) unstage();
  if (as.code() == StatusCode::kRetry) return AllocRefusal(req, as);
  KVTIER_RETURN_IF_ERROR(as);
  if (slots.size() != req.count) {
    Lease tmp;
    tmp.alloc = true;
    tmp.slots = slots;
    tmp.committed.assign(slots.size(), 0);
    ReleaseSlots(tmp);
    unstage();
    return Status::Retry("tier returned " + std::to_string(slots.size()) + " of " +
                         std::to_string(req.count) + " slots");
  }
  Lease lease;
  lease.alloc = true;
  lease.contract_id = *cid;
  lease.slots = slots;
  lease.committed.assign(slots.size(), 0);
  if (host) lease.staged = staged;
  for (uint32_t i = 0; i < slots.size(); ++i) {
    const wire::WireSlot ws = ClientSlot(lease, i);
    lease.index.emplace(SlotKey(tiers::SlotRef{slots[i].tier, ws.slot}), i);
    std::memcpy(out + i * sizeof(ws), &ws, sizeof(ws));
  }
  auto id = AddLease(std::move(lease));  // on failure it returns the slots (staged ones too)
  if (!id.ok()) return id.status();
  c->value = *id;
  c->count = req.count;
  c->out_bytes = static_cast<uint32_t>(slots.size() * sizeof(wire::WireSlot));
  return Status::Ok();
}

Status Session::AllocRefusal(const wire::RequestEntry& req, const Status& retry) const {
  const auto tier = static_cast<tiers::Tier>(req.tier);
  // A host tier of several slot classes: the numbers of the request's class.
  const tiers::HostGeometry geo = tm_->host_geometry();  // a class made after it is not the request's
  int cls = tier == tiers::Tier::kHost && geo.classes.size() > 1 ? tm_->FitOf(req.contract_id).cls : -1;
  if (cls >= 0 && static_cast<size_t>(cls) >= geo.most.size()) cls = -1;
  uint64_t own = 0, own_leases = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [id, lease] : leases_) {
      uint64_t k = 0;
      for (const auto& s : lease.slots) {
        k += s.tier == tier && (cls < 0 || tm_->HostSlotClass(s.slot) == cls) ? 1 : 0;
      }
      own += k;
      own_leases += k > 0 ? 1 : 0;
    }
  }
  uint64_t total = 0;
  for (const auto& t : tm_->Stats()) {
    if (t.tier == tier) total = t.slots_total;
  }
  std::string of_class;
  if (cls >= 0) {
    // The most the class holds, with every slab of the tier.
    total = geo.most[static_cast<size_t>(cls)];
    of_class = " of the request's slot class (" + std::to_string(geo.classes[static_cast<size_t>(cls)]) + " B)";
  }
  const std::string numbers = std::string(tiers::TierName(tier)) + " tier has " + std::to_string(total) +
                              " slots" + of_class + "; this client holds " + std::to_string(own) + " of them in " +
                              std::to_string(own_leases) + " leases and asks for " + std::to_string(req.count);
  // The caller's own pins keep the tier full: waiting cannot help, releasing can.
  if (own + req.count > total) return Status::Rejected(numbers + ": release leases first");
  return Status::Retry(retry.message() + "; " + numbers + ": the pressure passes as blocks are demoted or released");
}

Status Session::HandleCommit(const wire::RequestEntry& req, std::span<const uint8_t> in,
                             wire::CompletionEntry* c) {
  auto cid = ContractOf(req.contract_id);
  if (!cid.ok()) return cid.status();
  Status s = DoCommit(req, *cid, in, c);
  if (counters_ != nullptr) counters_->committed.fetch_add(c->count, std::memory_order_relaxed);
  return s;
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
    ReleaseSlots(lease);
  }
  static LogLimit released_log(std::chrono::seconds(1));
  uint64_t held = 0;
  if (!leases.empty() && released_log.Allow(&held)) {
    spdlog::info("client {} ({}, pid {}): released {} leases ({} slots) at disconnect ({} more such lines held back)",
                 id_, name_, pid_, leases.size(), slots, held);
  }
}

}  // namespace kvtier::daemon
