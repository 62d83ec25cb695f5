// Who may do what: the peer credentials of a control connection, judged against the
// [security] and [[tenants]] settings (config/config.h).
//
// The kernel records a unix socket peer's uid, gid and pid (SO_PEERCRED) and its
// supplementary groups (SO_PEERGROUPS) when it connects; a client cannot change them
// later. The daemon reads them at accept, before anything of the client is read, and
// every admin request is judged by them again (the policy, not the peer, is what a restart
// can change). Rings and leases are reachable only through an attached connection, so
// every request of a session runs with the credentials of the process that attached.
//
// Rights:
//   - attach (engine): the daemon's uid and group (the default socket mode 0660 lets in
//     no one else), root, security.attach_uids / attach_gids, and the members of every
//     tenant. With security.unmatched = "refuse", a peer that is in
//     no tenant is refused even when the lists above admit it.
//   - operator (every admin action over every tenant): the daemon's uid, root,
//     security.admin_uids / admin_gids.
//   - tenant admin ([[tenants]] admin = true): the admin actions that stay inside the
//     tenant's namespace (list, inspect, contracts, export, evict). Flush, verify and
//     config reload touch every tenant's blocks: operators only.
//
// Tenants: index 0 is the implicit tenant ("default": the clients no [[tenants]] table
// matches, when security.unmatched allows them); 1..N follow the config's order. A peer
// belongs to the first tenant listing its uid, else to the first listing one of its
// groups.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "config/config.h"
#include "formats/status.h"
#include "formats/wire.h"

namespace kvtier::daemon {

struct PeerCred {
  uint32_t uid = 0xffffffffu, gid = 0xffffffffu;
  uint32_t pid = 0;
  std::vector<uint32_t> groups;  // supplementary groups (SO_PEERGROUPS), may be empty
  std::string ToString() const;  // "uid 1000 gid 1000 pid 4242"
};

// SO_PEERCRED and SO_PEERGROUPS of a connected unix socket.
StatusOr<PeerCred> ReadPeerCred(int fd);

inline constexpr uint32_t kDefaultTenant = 0;
// Owner of a contract registered in the shared namespace (ContractOwners).
inline constexpr uint32_t kSharedOwner = 0xffffffffu;

// The TierManager's id of a contract that a client of namespace `ns` names `contract_id`:
// the id itself in namespace 0 (the implicit tenant: ids as clients give them), else
// XXH3-64 of (ns, id), never 0. Two tenants' registrations of one contract are two
// contracts of the TierManager, so their blocks are two sets of blocks.
uint64_t NamespacedContractId(uint64_t ns, uint64_t contract_id);

class AccessPolicy {
 public:
  // daemon_uid, daemon_gid: the uid and gid the daemon runs as (getuid(), getgid()).
  AccessPolicy(const config::Config& c, uint32_t daemon_uid, uint32_t daemon_gid);

  // Whether the peer may attach; *tenant gets its tenant. A refusal says why in one line.
  Status AdmitEngine(const PeerCred& p, uint32_t* tenant) const;
  // Whether the peer may run the admin action, as a member of `tenant`. *scoped is set to
  // true when the action must stay inside the tenant's namespace (a tenant admin), false
  // for an operator.
  Status AdmitAdmin(const PeerCred& p, uint32_t tenant, wire::AdminAction action, bool* scoped) const;
  bool IsOperator(const PeerCred& p) const;

  // Tenants: count (with the implicit one), names, namespace ids (0 for the implicit
  // tenant: its blocks keep the ids clients give them).
  size_t tenant_count() const { return tenants_.size(); }
  bool tenants_configured() const { return tenants_.size() > 1; }
  const std::string& tenant_name(uint32_t t) const { return tenants_[t].name; }
  uint64_t tenant_namespace(uint32_t t) const { return tenants_[t].ns; }

 private:
  struct Tenant {
    std::string name;
    uint64_t ns = 0;
    bool admin = false;
    std::vector<uint32_t> uids, gids;
  };
  bool HasGroup(const PeerCred& p, const std::vector<uint32_t>& gids) const;
  // The tenant listing the peer (uid first, then groups); -1 when none.
  int64_t TenantOf(const PeerCred& p) const;

  uint32_t daemon_uid_, daemon_gid_;
  config::SecurityConfig sec_;
  std::vector<Tenant> tenants_;
};

// Which tenant registered each of the TierManager's contract ids, and the id its clients
// name it by. Filled at registration (Session); read by every request of a tenant's
// client (Session::ContractOf) and by the admin views. Thread-safe.
class ContractOwners {
 public:
  struct Owner {
    uint32_t tenant = kDefaultTenant;  // or kSharedOwner
    uint64_t public_id = 0;            // what the tenant's clients call it
  };
  void Add(uint64_t internal_id, Owner o);
  // Drops the entry of a contract the TierManager forgot (Daemon's ContractsReleased).
  void Remove(uint64_t internal_id);
  // An id never added was registered outside a session (contracts restored at start):
  // the implicit tenant's, under its own id.
  Owner Get(uint64_t internal_id) const;
  // (internal id, public id) of every contract of a tenant, by internal id.
  std::vector<std::pair<uint64_t, uint64_t>> OfTenant(uint32_t tenant) const;

 private:
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Owner> owners_;
};

// Counters of one tenant's clients (AdminTenantStats, /metrics).
struct TenantCounters {
  std::atomic<uint64_t> lookup_keys{0}, lookup_hits{0}, committed{0}, access_denied{0};
};

// What the daemon keeps about tenants: the policy, the contracts' owners, the counters
// (one per tenant, then one for the shared namespace). Lives as long as the daemon.
class Tenants {
 public:
  Tenants(const config::Config& c, uint32_t daemon_uid, uint32_t daemon_gid)
      : access_(c, daemon_uid, daemon_gid), counters_(access_.tenant_count() + 1) {}
  const AccessPolicy& access() const { return access_; }
  ContractOwners& owners() { return owners_; }
  const ContractOwners& owners() const { return owners_; }
  // t: a tenant, or kSharedOwner.
  TenantCounters& counters(uint32_t t) { return counters_[t == kSharedOwner ? counters_.size() - 1 : t]; }
  // Quota group of a tenant in the TierManager (TierManagerOptions::groups): the tenant's
  // index; the shared namespace is the last group. Groups exist only with tenants.
  uint32_t group_of(uint32_t t) const {
    return t == kSharedOwner ? static_cast<uint32_t>(access_.tenant_count()) : t;
  }
  // The name of owner's namespace (a tenant, or kSharedOwner): its tenant's name,
  // "shared" for the shared namespace, "" for the implicit tenant. The remote tier's
  // namespace of its contracts (GetItem::ns, PutItem::ns: keys <key_prefix><ns>:{...},
  // docs/remote.md; given to TierManager::RegisterContractAs) and the namespace
  // contracts.kvc keeps their registrations under.
  std::string NamespaceName(uint32_t owner) const {
    if (owner == kSharedOwner) return "shared";
    return owner == kDefaultTenant ? std::string() : access_.tenant_name(owner);
  }
  // NamespaceName of the owner of a contract of the TierManager.
  std::string RemoteNamespace(uint64_t internal_contract_id) const {
    return NamespaceName(owners_.Get(internal_contract_id).tenant);
  }

 private:
  AccessPolicy access_;
  ContractOwners owners_;
  std::deque<TenantCounters> counters_;
};

// Name of an admin action for refusals and the audit log ("evict", "flush", ...).
const char* AdminActionName(uint16_t action);

}  // namespace kvtier::daemon
