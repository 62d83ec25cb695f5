// Operator requests (Op::kAdmin: kvtierctl's list, inspect, verify, evict, flush and
// config reload), executed for a Session like every other op. Each action copies the
// AdminRequest out of shared memory once, checks it, and writes a page of records into
// the out region, never past its length.
//
// Every admin request is judged by the peer's credentials first (daemon/access.h): a
// refusal is one line to the client, one rate-limited log line and no change. The audit
// line ("audit: ..."): client, peer uid / gid / pid, tenant, the action with its
// arguments, the outcome and what it changed; one per action that changes something,
// one per interval for reads and refusals (with the count held back).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "common/log_limit.h"
#include "daemon/session.h"
#include "formats/contract.h"
#include "testing/test_point.h"

namespace kvtier::daemon {

namespace {
// Admin actions any client may ask for at any rate: their log lines, one per interval.
LogLimit& AdminLog() {
  static LogLimit l(std::chrono::seconds(1));
  return l;
}

wire::AdminBlockInfo ToWire(const tiers::BlockInfo& b) {
  wire::AdminBlockInfo w;
  w.contract_id = b.contract_id;
  w.key = {b.key.hi, b.key.lo};
  w.parent = {b.parent.hi, b.parent.lo};
  w.bytes = b.bytes;
  w.where = static_cast<uint8_t>((b.hbm_slot >= 0 ? wire::kBlockInHbm : 0) |
                                 (b.host_slot >= 0 ? wire::kBlockInHost : 0) |
                                 (b.in_nvme ? wire::kBlockInNvme : 0) |
                                 (b.nvme_verified ? wire::kBlockNvmeVerified : 0));
  w.uses = b.uses;
  w.hbm_slot = b.hbm_slot;
  w.host_slot = b.host_slot;
  w.pins_hbm = b.pins_hbm;
  w.pins_host = b.pins_host;
  w.nvme_record = b.nvme_record;
  w.nvme_hits = b.nvme_hits;
  w.payload_xxh3 = b.payload_xxh3;
  w.header_xxh3 = b.header_xxh3;
  return w;
}

std::string Asked(const wire::AdminRequest& a) {
  std::string s = AdminActionName(a.action);
  if (a.contract_id != 0) s += " contract " + ContractIdHex(a.contract_id);
  const Key128 key{a.key.hi, a.key.lo};
  if (!key.IsZero()) s += " key " + key.ToHex();
  if (a.tier != wire::kTierNone) s += " tier " + std::to_string(a.tier);
  if (a.offset != 0 || a.limit != 0) s += " offset " + std::to_string(a.offset) + " limit " + std::to_string(a.limit);
  return s;
}

}  // namespace

Status Session::DoAdmin(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                        wire::CompletionEntry* c) {
  wire::AdminRequest a;
  std::memcpy(&a, in.data(), sizeof a);  // one copy out of shared memory
  KVTIER_RETURN_IF_ERROR(wire::ValidateAdminRequest(a));
  std::string who = "client " + std::to_string(id_) + " (" + name_ + ", " + peer_.ToString();
  if (namespaced_) who += ", tenant " + tenants_->access().tenant_name(tenant_);
  who += ")";
  bool scoped = false;
  if (tenants_ != nullptr) {
    Status allowed =
        tenants_->access().AdmitAdmin(peer_, tenant_, static_cast<wire::AdminAction>(a.action), &scoped);
    if (!allowed.ok()) {
      metrics_->access_denied.fetch_add(1, std::memory_order_relaxed);
      if (counters_ != nullptr) counters_->access_denied.fetch_add(1, std::memory_order_relaxed);
      static LogLimit denied_log;  // a client may ask at any rate
      uint64_t held = 0;
      if (denied_log.Allow(&held)) {
        spdlog::warn("audit: {} asked {}: refused: {} ({} more refusals held back)", who, Asked(a), allowed.message(),
                     held);
      }
      return allowed;
    }
  }
  // Without tenants a tenant admin's view is the whole daemon's: one namespace.
  if (!namespaced_ && static_cast<wire::AdminAction>(a.action) != wire::AdminAction::kTenantStats) scoped = false;
  std::string changed;
  Status s = RunAdmin(req, a, scoped, out, c, &changed);
  // Actions that change something: one line each (the audit trail; only peers with admin
  // rights get here). Reads (ls, inspect, contracts, counters, a verify that dropped
  // nothing), which kvtierctl asks page by page: one line per interval, with the count.
  uint64_t held = 0;
  const auto act = static_cast<wire::AdminAction>(a.action);
  const bool changes = act == wire::AdminAction::kEvictKey || act == wire::AdminAction::kEvictContract ||
                       act == wire::AdminAction::kFlush || act == wire::AdminAction::kReloadConfig ||
                       !changed.empty();
  if (changes || AdminLog().Allow(&held)) {
    spdlog::info("audit: {} asked {}{}: {}{}{}{}", who, Asked(a), scoped ? " (own namespace)" : "",
                 s.ok() ? "ok" : s.ToString(), changed.empty() ? "" : "; ", changed,
                 changes ? "" : " (" + std::to_string(held) + " more reads held back)");
  }
  return s;
}

Status Session::RunAdmin(const wire::RequestEntry& req, const wire::AdminRequest& a, bool scoped, uint8_t* out,
                         wire::CompletionEntry* c, std::string* changed) {
  const uint64_t room = req.out_len;
  auto need = [&](uint64_t bytes, const char* what) -> Status {
    if (bytes > room) {
      return Status::Invalid(std::string("out_len ") + std::to_string(room) + " too small for " + what +
                             " (" + std::to_string(bytes) + " bytes)");
    }
    return Status::Ok();
  };
  const Key128 key{a.key.hi, a.key.lo};
  // A scoped request names contracts by the tenant's own ids and sees only the tenant's
  // contracts (never the shared namespace's: those are other tenants' prefixes too).
  auto target = [&](uint64_t id) -> StatusOr<uint64_t> {
    if (!scoped) {
      KVTIER_RETURN_IF_ERROR(CheckContract(id));
      return id;
    }
    auto cid = ContractOf(id);
    if (cid.ok() && tenants_->owners().Get(*cid).tenant != tenant_) {
      return Status::NotFound("contract " + ContractIdHex(id) + " is not registered: register it first "
                              "(kvtier_register_contract)");
    }
    return cid;
  };
  // Inspect / evict of a key in any contract: the first of the tenant's contracts holding it.
  auto find_key = [&](uint64_t id) -> StatusOr<tiers::BlockInfo> {
    if (id != 0 || !scoped) {
      uint64_t cid = id;
      if (id != 0) {
        auto t = target(id);
        if (!t.ok()) return t.status();
        cid = *t;
      }
      return tm_->InspectBlock(cid, key);
    }
    for (const auto& [internal, pub] : OwnContracts()) {
      auto info = tm_->InspectBlock(internal, key);
      if (info.ok()) return info;
    }
    return Status::NotFound("InspectBlock: key not cached");
  };
  auto shown = [&](tiers::BlockInfo b) {
    if (scoped) b.contract_id = PublicId(b.contract_id);
    return ToWire(b);
  };
  switch (static_cast<wire::AdminAction>(a.action)) {
    case wire::AdminAction::kListContracts: {
      // Pages of the TierManager's id snapshot: the index lock is held for a few entries
      // at a time, never for the listing (a contract gone since the snapshot is skipped).
      auto ids = tm_->ContractIds();
      if (scoped) {
        // The tenant's own contracts only (OwnContracts is sorted by the TierManager's id).
        auto own = std::make_shared<std::vector<uint64_t>>();
        for (const auto& [internal, pub] : OwnContracts()) {
          if (std::binary_search(ids->begin(), ids->end(), internal)) own->push_back(internal);
        }
        ids = std::move(own);
      }
      uint64_t pos = 0;
      uint32_t n = 0;
      bool full = false;
      constexpr uint64_t kChunk = 64;
      for (uint64_t at = a.offset; !full && at < ids->size() && n < a.limit; at += kChunk) {
        const uint64_t len = std::min<uint64_t>({kChunk, ids->size() - at, uint64_t{a.limit} - n});
        const auto infos = tm_->ContractInfos(std::span<const uint64_t>(ids->data() + at, len));
        for (const auto& ci : infos) {
          const std::vector<uint8_t> bytes = ci.contract.Serialize();
          wire::AdminContractInfo w;
          w.contract_id = scoped ? PublicId(ci.id) : ci.id;
          w.block_bytes = ci.block_bytes;
          for (int t = 0; t < 3; ++t) w.blocks[t] = ci.blocks[t];
          w.contract_bytes = static_cast<uint32_t>(bytes.size());
          const uint64_t padded = (bytes.size() + 7) / 8 * 8;
          if (pos + sizeof w + padded > room) {
            if (n == 0) KVTIER_RETURN_IF_ERROR(need(pos + sizeof w + padded, "one contract"));
            full = true;  // the page ends here; the caller asks again from offset + count
            break;
          }
          std::memcpy(out + pos, &w, sizeof w);
          std::memcpy(out + pos + sizeof w, bytes.data(), bytes.size());
          std::memset(out + pos + sizeof w + bytes.size(), 0, padded - bytes.size());
          pos += sizeof w + padded;
          ++n;
        }
      }
      c->value = ids->size();
      c->count = n;
      c->out_bytes = static_cast<uint32_t>(pos);
      return Status::Ok();
    }
    case wire::AdminAction::kListBlocks: {
      const uint32_t fit = static_cast<uint32_t>(std::min<uint64_t>(a.limit, room / sizeof(wire::AdminBlockInfo)));
      if (fit == 0) KVTIER_RETURN_IF_ERROR(need(sizeof(wire::AdminBlockInfo), "one block"));
      const auto tier = static_cast<tiers::Tier>(a.tier);
      std::vector<tiers::BlockInfo> blocks;
      uint64_t total = 0;
      if (scoped && a.contract_id == 0) {
        // The tenant's contracts one after the other, paged as one listing.
        uint64_t skip = a.offset;
        for (const auto& [internal, pub] : OwnContracts()) {
          std::vector<tiers::BlockInfo> page;
          uint64_t n = 0;
          const uint32_t want = static_cast<uint32_t>(fit - blocks.size());
          KVTIER_RETURN_IF_ERROR(tm_->ListBlocks(internal, tier, skip, want, &page, &n));
          total += n;
          skip = skip > n ? skip - n : 0;
          blocks.insert(blocks.end(), page.begin(), page.end());
        }
      } else {
        uint64_t cid = 0;
        if (a.contract_id != 0) {
          auto t = target(a.contract_id);
          if (!t.ok()) return t.status();
          cid = *t;
        }
        KVTIER_RETURN_IF_ERROR(tm_->ListBlocks(cid, tier, a.offset, fit, &blocks, &total));
      }
      for (size_t i = 0; i < blocks.size(); ++i) {
        const wire::AdminBlockInfo w = shown(blocks[i]);
        std::memcpy(out + i * sizeof w, &w, sizeof w);
      }
      c->value = total;
      c->count = static_cast<uint32_t>(blocks.size());
      c->out_bytes = static_cast<uint32_t>(blocks.size() * sizeof(wire::AdminBlockInfo));
      return Status::Ok();
    }
    case wire::AdminAction::kInspect: {
      KVTIER_RETURN_IF_ERROR(need(sizeof(wire::AdminBlockInfo), "a block"));
      auto info = find_key(a.contract_id);
      if (!info.ok()) return info.status();
      const wire::AdminBlockInfo w = shown(*info);
      std::memcpy(out, &w, sizeof w);
      c->count = 1;
      c->out_bytes = sizeof w;
      return Status::Ok();
    }
    case wire::AdminAction::kVerifyNvme: {
      KVTIER_RETURN_IF_ERROR(need(sizeof(wire::AdminVerifyReport), "a verify report"));
      tiers::VerifyReport r;
      KVTIER_RETURN_IF_ERROR(tm_->VerifyNvme(a.offset, a.limit, &r));
      wire::AdminVerifyReport w;
      w.total = r.total;
      w.checked = r.checked;
      w.ok = r.ok;
      w.corrupt = r.corrupt;
      w.missing = r.missing;
      w.io_errors = r.io_errors;
      std::memcpy(out, &w, sizeof w);
      c->count = 1;
      c->out_bytes = sizeof w;
      static LogLimit verify_log;
      uint64_t held = 0;
      if (r.corrupt > 0 && verify_log.Allow(&held)) {
        spdlog::warn("client {} ({}): verify found {} corrupt NVMe records (dropped) ({} more such lines held back)",
                     id_, name_, r.corrupt, held);
      }
      if (r.corrupt > 0) *changed = "dropped " + std::to_string(r.corrupt) + " corrupt NVMe records";
      return Status::Ok();
    }
    case wire::AdminAction::kEvictKey: {
      auto info = find_key(a.contract_id);
      if (!info.ok()) {
        if (info.status().IsNotFound()) return Status::NotFound("block " + key.ToHex() + " is not cached");
        return info.status();
      }
      const uint64_t contract = info->contract_id;
      Status s = tm_->Evict(contract, key);
      if (s.IsNotFound()) return Status::NotFound("block " + key.ToHex() + " is not cached");
      KVTIER_RETURN_IF_ERROR(s);
      *changed = "evicted block " + key.ToHex() + " of contract " + ContractIdHex(scoped ? PublicId(contract) : contract);
      c->value = 1;
      return Status::Ok();
    }
    case wire::AdminAction::kEvictContract: {
      uint64_t cid = a.contract_id;
      if (scoped) {
        auto t = target(a.contract_id);
        if (!t.ok()) return t.status();
        cid = *t;
      }
      uint64_t evicted = 0, skipped = 0;
      KVTIER_RETURN_IF_ERROR(tm_->EvictContract(cid, &evicted, &skipped));
      *changed = "evicted " + std::to_string(evicted) + " blocks of contract " + ContractIdHex(a.contract_id) + " (" +
                 std::to_string(skipped) + " pinned left)";
      c->value = evicted;
      c->count = static_cast<uint32_t>(std::min<uint64_t>(skipped, UINT32_MAX));
      return Status::Ok();
    }
    case wire::AdminAction::kFlush: {
      const tiers::Tier to = a.tier == wire::kTierHost ? tiers::Tier::kHost : tiers::Tier::kNvme;
      KVTIER_RETURN_IF_ERROR(tm_->Flush(to));
      *changed = std::string("flushed to ") + tiers::TierName(to);
      return Status::Ok();
    }
    case wire::AdminAction::kReloadConfig: {
      if (!reload_) return Status::Unsupported("this daemon cannot reload its config");
      KVTIER_TEST_POINT("Session::Admin:Reload");
      std::string summary;
      KVTIER_RETURN_IF_ERROR(reload_(&summary));
      // The reload's own line (rate-limited) has the summary; the audit line says it in
      // other words, so that a count of either kind of line stays a count of its kind.
      const std::string from = "reloaded eviction/admission settings from ";
      *changed = summary.rfind(from, 0) == 0 ? "took the eviction/admission settings of " + summary.substr(from.size())
                                             : summary;
      const size_t n = std::min<size_t>(summary.size(), room);
      if (n > 0) std::memcpy(out, summary.data(), n);
      c->out_bytes = static_cast<uint32_t>(n);
      return Status::Ok();
    }
    case wire::AdminAction::kTenantStats: {
      if (tenants_ == nullptr || !tenants_->access().tenants_configured()) {
        c->value = 0;  // one namespace: the tier stats are the whole story
        return Status::Ok();
      }
      const AccessPolicy& ap = tenants_->access();
      // Tenants in order, then the shared namespace; a scoped caller sees its own only.
      std::vector<uint32_t> ids;
      if (scoped) {
        ids.push_back(tenant_);
      } else {
        for (uint32_t t = 0; t < ap.tenant_count(); ++t) ids.push_back(t);
        ids.push_back(kSharedOwner);
      }
      const auto groups = tm_->GroupStatsAll();
      const uint32_t fit = static_cast<uint32_t>(std::min<uint64_t>(a.limit, room / sizeof(wire::AdminTenantStats)));
      if (fit == 0) KVTIER_RETURN_IF_ERROR(need(sizeof(wire::AdminTenantStats), "one tenant"));
      uint32_t n = 0;
      for (uint64_t i = a.offset; i < ids.size() && n < fit; ++i, ++n) {
        const TenantRow r = MakeTenantRow(*tenants_, ids[i], groups);
        wire::AdminTenantStats w;
        std::memcpy(w.name, r.name.data(), std::min(r.name.size(), sizeof w.name - 1));
        for (int k = 0; k < 3; ++k) {
          w.blocks[k] = r.blocks[k];
          w.quota_slots[k] = r.quota_slots[k];
          w.evictions[k] = r.evictions[k];
        }
        w.lookup_keys = r.lookup_keys;
        w.lookup_hits = r.lookup_hits;
        w.committed = r.committed;
        w.access_denied = r.access_denied;
        std::memcpy(out + n * sizeof w, &w, sizeof w);
      }
      c->value = ids.size();
      c->count = n;
      c->out_bytes = n * static_cast<uint32_t>(sizeof(wire::AdminTenantStats));
      return Status::Ok();
    }
  }
  return Status::Invalid("admin action " + std::to_string(a.action) + " unknown");
}

}  // namespace kvtier::daemon
