// Session: the commit flow (kvt_commit). Each item of an alloc lease is checked, its
// staged bytes copied into its arena slot without the session's lock, then committed to
// the TierManager in order; the completion counts the keys already cached.
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

Status Session::HandleCommit(const wire::RequestEntry& req, std::span<const uint8_t> in,
                             wire::CompletionEntry* c) {
  tiers::ContractView view;  // the one read of the contract this request makes
  auto cid = ContractOf(req.contract_id, &view);
  if (!cid.ok()) return cid.status();
  Status s = DoCommit(req, *cid, view, in, c);
  if (counters_ != nullptr) counters_->committed.fetch_add(c->count, std::memory_order_relaxed);
  return s;
}

Status Session::DoCommit(const wire::RequestEntry& req, uint64_t contract_id, const tiers::ContractView& view,
                         std::span<const uint8_t> in, wire::CompletionEntry* c) {
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
        block_bytes = view.block_bytes;
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

}  // namespace kvtier::daemon
