#include "daemon/access.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <xxhash.h>

namespace kvtier::daemon {

uint64_t NamespacedContractId(uint64_t ns, uint64_t contract_id) {
  if (ns == 0) return contract_id;
  const uint64_t in[2] = {ns, contract_id};
  const uint64_t h = XXH3_64bits(in, sizeof in);
  return h == 0 ? 1 : h;
}

void ContractOwners::Add(uint64_t internal_id, Owner o) {
  std::lock_guard<std::mutex> l(mu_);
  owners_[internal_id] = o;
}

void ContractOwners::Remove(uint64_t internal_id) {
  std::lock_guard<std::mutex> l(mu_);
  owners_.erase(internal_id);
}

ContractOwners::Owner ContractOwners::Get(uint64_t internal_id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = owners_.find(internal_id);
  return it == owners_.end() ? Owner{kDefaultTenant, internal_id} : it->second;
}

std::vector<std::pair<uint64_t, uint64_t>> ContractOwners::OfTenant(uint32_t tenant) const {
  std::vector<std::pair<uint64_t, uint64_t>> out;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [id, o] : owners_) {
      if (o.tenant == tenant) out.emplace_back(id, o.public_id);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string PeerCred::ToString() const {
  return "uid " + std::to_string(uid) + " gid " + std::to_string(gid) + " pid " + std::to_string(pid);
}

StatusOr<PeerCred> ReadPeerCred(int fd) {
  ucred uc{};
  socklen_t len = sizeof uc;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &uc, &len) != 0 || len != sizeof uc) {
    return Status::IoError(std::string("SO_PEERCRED: ") + std::strerror(errno));
  }
  PeerCred p;
  p.uid = uc.uid;
  p.gid = uc.gid;
  p.pid = static_cast<uint32_t>(uc.pid);
  // Supplementary groups: ERANGE says how much room they need (at most NGROUPS_MAX).
  std::vector<gid_t> g(16);
  for (int tries = 0; tries < 3; ++tries) {
    socklen_t glen = static_cast<socklen_t>(g.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g.data(), &glen) == 0) {
      g.resize(glen / sizeof(gid_t));
      p.groups.assign(g.begin(), g.end());
      break;
    }
    if (errno != ERANGE || glen / sizeof(gid_t) > 65536) break;  // kernel without it: primary gid only
    g.resize(glen / sizeof(gid_t));
  }
  return p;
}

AccessPolicy::AccessPolicy(const config::Config& c, uint32_t daemon_uid, uint32_t daemon_gid)
    : daemon_uid_(daemon_uid), daemon_gid_(daemon_gid), sec_(c.security) {
  tenants_.push_back(Tenant{"default", 0, false, {}, {}});
  for (const auto& t : c.tenants) {
    const std::string seed = "kvtier.tenant." + t.name;
    uint64_t ns = XXH3_64bits(seed.data(), seed.size());
    if (ns == 0) ns = 1;  // 0 is the implicit tenant's
    tenants_.push_back(Tenant{t.name, ns, t.admin, t.uids, t.gids});
  }
}

bool AccessPolicy::HasGroup(const PeerCred& p, const std::vector<uint32_t>& gids) const {
  for (uint32_t g : gids) {
    if (p.gid == g || std::find(p.groups.begin(), p.groups.end(), g) != p.groups.end()) return true;
  }
  return false;
}

int64_t AccessPolicy::TenantOf(const PeerCred& p) const {
  for (size_t i = 1; i < tenants_.size(); ++i) {
    const auto& u = tenants_[i].uids;
    if (std::find(u.begin(), u.end(), p.uid) != u.end()) return static_cast<int64_t>(i);
  }
  for (size_t i = 1; i < tenants_.size(); ++i) {
    if (HasGroup(p, tenants_[i].gids)) return static_cast<int64_t>(i);
  }
  return -1;
}

bool AccessPolicy::IsOperator(const PeerCred& p) const {
  if (p.uid == 0 || p.uid == daemon_uid_) return true;
  const auto& u = sec_.admin_uids;
  return std::find(u.begin(), u.end(), p.uid) != u.end() || HasGroup(p, sec_.admin_gids);
}

Status AccessPolicy::AdmitEngine(const PeerCred& p, uint32_t* tenant) const {
  const int64_t t = TenantOf(p);
  if (t > 0) {
    *tenant = static_cast<uint32_t>(t);
    return Status::Ok();
  }
  if (tenants_configured() && sec_.unmatched == "refuse") {
    return Status::Rejected("permission denied: " + p.ToString() +
                            " is in no [[tenants]] table and security.unmatched is \"refuse\"");
  }
  const auto& u = sec_.attach_uids;
  const bool listed = p.uid == 0 || p.uid == daemon_uid_ || HasGroup(p, {daemon_gid_}) ||
                      std::find(u.begin(), u.end(), p.uid) != u.end() || HasGroup(p, sec_.attach_gids);
  if (!listed) {
    return Status::Rejected("permission denied: " + p.ToString() +
                            " may not attach (security.attach_uids / attach_gids, or a [[tenants]] table)");
  }
  *tenant = kDefaultTenant;
  return Status::Ok();
}

Status AccessPolicy::AdmitAdmin(const PeerCred& p, uint32_t tenant, wire::AdminAction action, bool* scoped) const {
  if (IsOperator(p)) {
    *scoped = false;
    return Status::Ok();
  }
  const char* name = AdminActionName(static_cast<uint16_t>(action));
  if (action == wire::AdminAction::kTenantStats) {  // its own tenant's counters: anyone's
    *scoped = true;
    return Status::Ok();
  }
  const bool in_namespace =
      action == wire::AdminAction::kListContracts || action == wire::AdminAction::kListBlocks ||
      action == wire::AdminAction::kInspect || action == wire::AdminAction::kEvictKey ||
      action == wire::AdminAction::kEvictContract;
  if (tenant != kDefaultTenant && tenant < tenants_.size() && tenants_[tenant].admin) {
    if (in_namespace) {
      *scoped = true;
      return Status::Ok();
    }
    return Status::Rejected(std::string("permission denied: ") + name + " touches every tenant's blocks; " +
                            p.ToString() + " is an admin of tenant \"" + tenants_[tenant].name +
                            "\" only (security.admin_uids / admin_gids)");
  }
  return Status::Rejected(std::string("permission denied: ") + p.ToString() + " may not run admin action " + name +
                          " (security.admin_uids / admin_gids, or [[tenants]] admin = true)");
}

const char* AdminActionName(uint16_t action) {
  switch (static_cast<wire::AdminAction>(action)) {
    case wire::AdminAction::kListContracts: return "contracts";
    case wire::AdminAction::kListBlocks: return "ls";
    case wire::AdminAction::kInspect: return "inspect";
    case wire::AdminAction::kVerifyNvme: return "verify";
    case wire::AdminAction::kEvictKey: return "evict";
    case wire::AdminAction::kEvictContract: return "evict-contract";
    case wire::AdminAction::kFlush: return "flush";
    case wire::AdminAction::kReloadConfig: return "config-reload";
    case wire::AdminAction::kTenantStats: return "tenant-stats";
  }
  return "unknown";
}

}  // namespace kvtier::daemon
