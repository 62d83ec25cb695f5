// Session: the alloc flow (kvt_alloc). Free slots of a tier, pinned and invisible until
// committed, under an alloc lease; host slots are handed out as staging slots (the arena
// maps read-only in clients). A refusal says whether waiting or releasing helps.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include <spdlog/spdlog.h>

#include "common/log_limit.h"
#include "daemon/session.h"
#include "daemon/session_util.h"
#include "testing/test_point.h"

namespace kvtier::daemon {

wire::WireSlot Session::ClientSlot(const Lease& lease, size_t i) const {
  wire::WireSlot ws;
  ws.tier = static_cast<uint8_t>(lease.slots[i].tier);
  ws.slot = i < lease.staged.size() && lease.staged[i] != kNoStaging ? staging_->id_of(lease.staged[i])
                                                                      : lease.slots[i].slot;
  return ws;
}

Status Session::HandleAlloc(const wire::RequestEntry& req, uint8_t* out, wire::CompletionEntry* c) {
  tiers::ContractView view;  // the one read of the contract this request makes
  auto cid = ContractOf(req.contract_id, &view);
  if (!cid.ok()) return cid.status();
  KVTIER_RETURN_IF_ERROR(CheckTarget(req.tier));
  const uint64_t slot_bytes = SlotBytes(view, static_cast<tiers::Tier>(req.tier));
  {
    // Before the tier makes room: a request past this client's share evicts nothing.
    std::lock_guard<std::mutex> l(mu_);
    KVTIER_RETURN_IF_ERROR(CheckShareLocked(static_cast<tiers::Tier>(req.tier), req.count, slot_bytes));
  }
  // Host slots: first this client's staging slots (its cap), then the arena's.
  std::vector<uint32_t> staged;
  const bool host = req.tier == wire::kTierHost;
  Status staged_st =
      host ? staging_->Alloc(req.count, view.block_bytes, StagingSlotBytes(view), &staged) : Status::Ok();
  if (staged_st.code() == StatusCode::kRetry) return AllocRefusal(req, staged_st, view);  // the daemon's total
  if (!staged_st.ok()) {
    uint64_t total = 0;
    for (const auto& t : tm_->Stats()) total = t.tier == tiers::Tier::kHost ? t.slots_total : total;
    // Past the whole tier, not only the cap: the tier's numbers say more.
    if (staging_->used() + uint64_t{req.count} > total) {
      return AllocRefusal(req, Status::Retry("host tier full"), view);
    }
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
  if (as.code() == StatusCode::kRetry) return AllocRefusal(req, as, view);
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
  auto id = AddLease(std::move(lease), view);  // on failure it returns the slots (staged ones too)
  if (!id.ok()) return id.status();
  c->value = *id;
  c->count = req.count;
  c->out_bytes = static_cast<uint32_t>(slots.size() * sizeof(wire::WireSlot));
  return Status::Ok();
}

Status Session::AllocRefusal(const wire::RequestEntry& req, const Status& retry,
                             const tiers::ContractView& view) const {
  const auto tier = static_cast<tiers::Tier>(req.tier);
  // A host tier of several slot classes: the numbers of the request's class.
  const tiers::HostGeometry geo = tm_->host_geometry();  // a class made after it is not the request's
  int cls = tier == tiers::Tier::kHost && geo.classes.size() > 1 ? view.fit.cls : -1;
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

}  // namespace kvtier::daemon
