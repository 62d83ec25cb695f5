// Session: the acquire flow (kvt_acquire, kvt_acquire_async). A request's keys go to
// TierManager::Acquire, in steps of kAcquireLockChunk keys past that many; the pinned
// slots come back on the TierManager's threads (or inline) and become one acquire lease.
// With private reads, host blocks are copied into the client's staging area first.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <span>

#include <spdlog/spdlog.h>

#include "common/log_limit.h"
#include "daemon/session.h"
#include "daemon/session_util.h"
#include "formats/ring_wait.h"
#include "testing/test_point.h"

namespace kvtier::daemon {

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

std::vector<tiers::SlotRef> Session::UniqueSlots(const std::vector<tiers::SlotRef>& slots) {
  std::vector<uint64_t> keys;
  keys.reserve(slots.size());
  for (const auto& s : slots) keys.push_back(SlotKey(s));
  std::sort(keys.begin(), keys.end());
  std::vector<tiers::SlotRef> out, extra;
  out.reserve(slots.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const tiers::SlotRef ref{static_cast<tiers::Tier>(keys[i] >> 32), static_cast<uint32_t>(keys[i])};
    // A key named again: its extra pin goes at once.
    (i > 0 && keys[i] == keys[i - 1] ? extra : out).push_back(ref);
  }
  if (!extra.empty()) (void)tm_->UnpinAll(extra);
  return out;
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

void Session::HandleAcquire(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                            Done done) {
  wire::CompletionEntry c;
  c.tag = req.tag;
  c.op = req.op;
  auto fail = [&](const Status& s) {
    SetError(&c, s, out, req.out_len);
    done(c);
  };
  tiers::ContractView view;  // the one read of the contract this request makes
  auto cid = ContractOf(req.contract_id, &view);
  Status s = cid.status();
  if (s.ok()) s = CheckTarget(req.tier);
  if (!s.ok()) return fail(s);
  if (Status b = BeginAcquire(); !b.ok()) return fail(b);
  if (req.count > kAcquireLockChunk) {
    // A big acquire holds the index lock one step at a time.
    return AcquireInSteps(req, *cid, view, CopyArray<Key128>(in.data(), req.count), kAcquireLockChunk,
                          /*async=*/false, out, std::move(done));
  }
  auto keys = std::make_shared<std::vector<Key128>>(CopyArray<Key128>(in.data(), req.count));
  auto self = shared_from_this();
  const uint32_t max_out = req.count;
  const uint64_t contract_id = *cid;
  // Private reads: the block size each copy takes (from the view).
  const uint64_t copy_bytes = private_reads() && req.tier == wire::kTierHost ? view.block_bytes : 0;
  const uint64_t copy_slot = copy_bytes > 0 ? StagingSlotBytes(view) : 0;
  tm_->Acquire(contract_id, *keys, static_cast<tiers::Tier>(req.tier),
               [self, keys, c, out, max_out, contract_id, view, copy_bytes, copy_slot, out_len = req.out_len,
                done = std::move(done)](Status st, std::vector<tiers::SlotRef> slots) mutable {
                 if (slots.size() > max_out) {  // never more than asked; return extras
                   (void)self->tm_->UnpinAll(std::span<const tiers::SlotRef>(slots).subspan(max_out));
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
                     return self->AddLease(std::move(lease), view);  // on failure it returns the copies too
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
  tiers::ContractView view;
  auto cid = ContractOf(req.contract_id, &view);
  Status s = cid.status();
  if (s.ok()) s = CheckTarget(req.tier);
  if (s.ok() && h.reserved != 0) s = Status::Invalid("acquire_async header reserved field must be 0");
  if (!s.ok()) return fail(s);
  if (Status b = BeginAcquire(/*async=*/true); !b.ok()) return fail(b);
  const size_t chunk = std::min<size_t>(h.chunk_blocks == 0 ? wire::kDefaultAcquireChunk : h.chunk_blocks,
                                        kAcquireLockChunk);
  AcquireInSteps(req, *cid, view, CopyArray<Key128>(in.data() + sizeof h, req.count), chunk, /*async=*/true, out,
                 std::move(done));
}

// As the leading steps finish, their slots land in the slots' place and, async,
// AcquireProgress.ready grows (a release store after the slots). A step that comes back
// short ends the prefix: the steps after it are unpinned. The last callback makes one
// lease of the prefix and completes as the blocking acquire does.
void Session::AcquireInSteps(const wire::RequestEntry& req, uint64_t contract_id, const tiers::ContractView& view,
                             std::vector<Key128> keys, size_t chunk, bool async, uint8_t* out, Done done) {
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
    // The prefix's slots, each once (the lease's), and the set that finds a slot named
    // again as its step folds in: its extra pin goes then, so that no sort of the whole
    // prefix runs at the end (about 0.5 ms for 16,384 slots, the core not given up).
    std::vector<tiers::SlotRef> unique;
    SlotSet seen;
    Status first_error;
    uint64_t copy_bytes = 0;                       // private reads: bytes of each copy (0: none)
    uint64_t copy_slot = 0;                        // and of its staging slot
    Copies copy;                                   // arena slot -> staging slot of its copy
    tiers::ContractView view;                      // the request's one read of its contract
  };
  auto st = std::make_shared<Steps>();
  st->keys = std::move(keys);
  st->chunk = std::max<size_t>(chunk, 1);
  const size_t chunks = (st->keys.size() + st->chunk - 1) / st->chunk;
  st->got.resize(chunks);
  st->arrived.assign(chunks, 0);
  st->status.resize(chunks);
  st->remaining = chunks;
  st->view = view;
  st->copy_bytes = private_reads() && req.tier == wire::kTierHost ? view.block_bytes : 0;
  st->copy_slot = st->copy_bytes > 0 ? StagingSlotBytes(view) : 0;
  auto self = shared_from_this();
  auto* progress = async ? reinterpret_cast<wire::AcquireProgress*>(out) : nullptr;
  uint8_t* slots_out = out + head;
  if (progress) {
    std::atomic_ref<uint32_t>(progress->ready).store(0, std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(progress->done).store(0, std::memory_order_release);
  }
  auto shared_done = std::make_shared<Done>(std::move(done));
  // One step a call, claimed in turn: from the ring thread on the bulk thread, and on this
  // thread too once it takes over from a bulk thread that gets too little CPU
  // (daemon/bulk_runner.h); on the socket path all in place. Steps may finish in any
  // order; their callbacks fold them into the prefix in order.
  std::atomic<size_t> next{0};
  RunSteps(st->keys.size(), /*bulk=*/OnRingThread(), [&]() -> bool {
    const size_t k = next.fetch_add(1, std::memory_order_relaxed);
    if (k >= chunks) return false;
    if (k > 0) YieldBetweenSteps();
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
                  (st->seen.Insert(SlotKey(ref)) ? st->unique : unpin).push_back(ref);
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
          if (!unpin.empty()) (void)self->tm_->UnpinAll(unpin);
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
            lease.slots = std::move(st->unique);
            lease.staged = StagedOf(lease.slots, st->copy);
            const size_t n_slots = st->prefix.size();
            auto id = self->AddLease(std::move(lease), st->view);
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
    return true;
  });
}

}  // namespace kvtier::daemon
