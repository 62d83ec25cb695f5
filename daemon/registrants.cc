// The daemon's book of registered contracts (Daemon::Impl, daemon/server_impl.h): the
// attached clients that registered each, the contracts each uid keeps
// (daemon.max_contracts_per_client), the contracts registered again from contracts.kvc at
// start, and the sweep that forgets a contract no client registered once its blocks are
// gone.
#include <algorithm>

#include <spdlog/spdlog.h>

#include "daemon/server_impl.h"

namespace kvtier::daemon {

void Daemon::Impl::RestoreContracts(const std::vector<StoredContract>& known) {
  const AccessPolicy& ap = tenants_->access();
  size_t restored = 0;
  for (const auto& sc : known) {
    const ScaleContract& ct = sc.contract;
    uint32_t owner = kDefaultTenant;
    uint64_t internal = ct.Id();
    if (sc.ns == "shared") {
      owner = kSharedOwner;
      internal = SharedContractId(ct.Id());
    } else if (!sc.ns.empty()) {
      for (uint32_t t = 1; t < ap.tenant_count(); ++t) {
        if (ap.tenant_name(t) == sc.ns) owner = t;
      }
      if (owner == kDefaultTenant) {
        spdlog::warn("contract {} ({}) of tenant \"{}\" in {} not registered again: no [[tenants]] table has that "
                     "name (the record is kept)",
                     ContractIdHex(ct.Id()), ct.model_id, sc.ns, contracts_->path());
        continue;
      }
      internal = NamespacedContractId(ap.tenant_namespace(owner), ct.Id());
    }
    Status rs = owner == kDefaultTenant
                    ? tm_->RegisterContract(ct)
                    : tm_->RegisterContractAs(ct, internal, ap.tenants_configured() ? tenants_->group_of(owner) : 0,
                                              sc.ns);
    if (!rs.ok()) {
      spdlog::warn("contract {} ({}) from {} not registered again: {}", ContractIdHex(ct.Id()), ct.model_id,
                   contracts_->path(), rs.ToString());
      continue;
    }
    if (owner != kDefaultTenant) tenants_->owners().Add(internal, {owner, owner == kSharedOwner ? internal : ct.Id()});
    {
      // No client registered it yet: the sweep forgets it once no block of it is cached.
      std::lock_guard<std::mutex> l(registrants_mu_);
      Registrants& r = idle_[internal];
      r.contract = ct.Id();
      r.ns = sc.ns;
    }
    ++restored;
  }
  if (restored > 0) spdlog::info("{} contracts registered again from {}", restored, contracts_->path());
}

void Daemon::Impl::ContractRegistered(const ScaleContract& ct, uint64_t internal, uint32_t owner) {
  const std::string ns = tenants_->NamespaceName(owner);
  {
    std::lock_guard<std::mutex> l(registrants_mu_);
    Registrants& r = registrants_[internal];
    ++r.count;
    idle_.erase(internal);
    r.contract = ct.Id();
    r.ns = ns;
    // Its last registrant may have detached between the registration and this count (and
    // ContractsReleased dropped its owner entry: the session's was added before).
    if (owner != kDefaultTenant) tenants_->owners().Add(internal, {owner, owner == kSharedOwner ? internal : ct.Id()});
    if (!tm_->HasContract(internal)) {
      const AccessPolicy& ap = tenants_->access();
      (void)(owner == kDefaultTenant && internal == ct.Id()
                 ? tm_->RegisterContract(ct)
                 : tm_->RegisterContractAs(ct, internal, ap.tenants_configured() ? tenants_->group_of(owner) : 0,
                                           ns));
    }
  }
  if (contracts_) {
    Status s = contracts_->Add(ct, ns);
    if (!s.ok()) {
      static LogLimit store_log;
      uint64_t held = 0;
      if (store_log.Allow(&held)) {
        spdlog::warn("contract {} is registered but not kept for restarts: {} ({} more such lines held back)",
                     ContractIdHex(ct.Id()), s.ToString(), held);
      }
    }
  }
}

void Daemon::Impl::ContractsReleased(const std::vector<uint64_t>& ids) {
  // Under registrants_mu_ to the end: a registration of a contract forgotten here either
  // counts before the forgetting (and nothing is forgotten) or registers it again and
  // adds it back to the file after it was removed.
  std::lock_guard<std::mutex> l(registrants_mu_);
  std::map<std::string, std::vector<uint64_t>> forgotten;  // namespace -> contract ids
  for (const uint64_t id : ids) {
    auto it = registrants_.find(id);
    if (it == registrants_.end() || --it->second.count > 0) continue;
    const Registrants r = it->second;
    registrants_.erase(it);
    // A block of it is cached: the sweep forgets it once they are gone.
    if (!ForgetLocked(id, r, &forgotten)) idle_[id] = r;
  }
  RemoveFromStore(forgotten);
}

bool Daemon::Impl::ForgetLocked(uint64_t internal, const Registrants& r,
                                std::map<std::string, std::vector<uint64_t>>* forgotten) {
  if (!tm_->ForgetContractIfUnused(internal)) return false;
  // Its owner entry goes with it (a tenant admin's listings walk the owners' contracts);
  // a registration racing this one adds it back in ContractRegistered, under this lock.
  tenants_->owners().Remove(internal);
  DropKeptLocked(internal);
  (*forgotten)[r.ns].push_back(r.contract);
  return true;
}

void Daemon::Impl::DropKeptLocked(uint64_t internal) {
  auto it = keepers_.find(internal);
  if (it == keepers_.end()) return;
  for (const uint32_t uid : it->second) {
    auto k = kept_by_uid_.find(uid);
    if (k == kept_by_uid_.end()) continue;
    k->second.erase(internal);
    if (k->second.empty()) kept_by_uid_.erase(k);
  }
  keepers_.erase(it);
}

Status Daemon::Impl::AdmitContract(uint32_t uid, uint64_t internal) {
  const uint32_t cap = opts_.config.daemon.max_contracts_per_client;
  std::lock_guard<std::mutex> l(registrants_mu_);
  auto& kept = kept_by_uid_[uid];
  if (kept.count(internal)) return Status::Ok();
  if (kept.size() >= cap) {
    return Status::Rejected("uid " + std::to_string(uid) + " keeps " + std::to_string(kept.size()) +
                            " contracts registered, daemon.max_contracts_per_client (" + std::to_string(cap) +
                            "), counted across its attaches: a contract counts until the daemon forgets it (no "
                            "client of it attached and no block of it cached)");
  }
  kept.insert(internal);
  keepers_[internal].push_back(uid);
  return Status::Ok();
}

void Daemon::Impl::RemoveFromStore(const std::map<std::string, std::vector<uint64_t>>& forgotten) {
  if (!contracts_) return;
  for (const auto& [ns, cids] : forgotten) {
    if (Status s = contracts_->Remove(ns, cids); !s.ok()) {
      static LogLimit remove_log;
      uint64_t held = 0;
      if (remove_log.Allow(&held)) {
        spdlog::warn("{} forgotten contracts stay in {} (a restart registers them again): {}{}", cids.size(),
                     contracts_->path(), s.ToString(), HeldBack(held, "such lines"));
      }
    }
  }
}

void Daemon::Impl::ArmSweep() {
  sweep_timer_->expires_after(std::chrono::milliseconds(opts_.config.daemon.contract_sweep_ms));
  sweep_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec || shutting_down_) return;
    if (!sweeping_.exchange(true)) {
      asio::post(admin_, [this] {
        Sweep();
        sweeping_.store(false);
      });
    }
    ArmSweep();
  });
}

void Daemon::Impl::Sweep() {
  // In batches, the lock released between them: registrations and detaches wait for one
  // batch at most, as a listing's bystanders do.
  constexpr size_t kBatch = 256;
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> l(registrants_mu_);
    ids.reserve(idle_.size() + keepers_.size());
    for (const auto& [id, r] : idle_) ids.push_back(id);
    // Counted at admission, never registered (the registration failed after it): not kept.
    for (const auto& [id, uids] : keepers_) {
      if (!idle_.count(id)) ids.push_back(id);
    }
  }
  size_t forgot = 0;
  for (size_t at = 0; at < ids.size(); at += kBatch) {
    std::map<std::string, std::vector<uint64_t>> forgotten;
    std::lock_guard<std::mutex> l(registrants_mu_);
    for (size_t i = at; i < std::min(ids.size(), at + kBatch); ++i) {
      const uint64_t id = ids[i];
      if (registrants_.count(id)) continue;  // registered again meanwhile
      auto it = idle_.find(id);
      if (it == idle_.end()) {
        if (!tm_->HasContract(id)) DropKeptLocked(id);
        continue;
      }
      if (ForgetLocked(id, it->second, &forgotten)) {
        idle_.erase(it);
        ++forgot;
      }
    }
    RemoveFromStore(forgotten);
  }
  if (forgot > 0) {
    static LogLimit sweep_log(std::chrono::seconds(60));
    if (uint64_t held = 0; sweep_log.Allow(&held)) {
      spdlog::info("sweep: forgot {} contracts no client registered whose blocks are gone{}", forgot,
                   HeldBack(held, "sweep lines"));
    }
  }
}

}  // namespace kvtier::daemon
