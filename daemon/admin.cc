// Operator requests (Op::kAdmin: kvtierctl's list, inspect, verify, evict, flush and
// config reload), executed for a Session like every other op. Each action copies the
// AdminRequest out of shared memory once, checks it, and writes a page of records into
// the out region, never past its length.
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
}  // namespace

Status Session::DoAdmin(const wire::RequestEntry& req, std::span<const uint8_t> in, uint8_t* out,
                        wire::CompletionEntry* c) {
  wire::AdminRequest a;
  std::memcpy(&a, in.data(), sizeof a);  // one copy out of shared memory
  KVTIER_RETURN_IF_ERROR(wire::ValidateAdminRequest(a));
  const uint64_t room = req.out_len;
  auto need = [&](uint64_t bytes, const char* what) -> Status {
    if (bytes > room) {
      return Status::Invalid(std::string("out_len ") + std::to_string(room) + " too small for " + what +
                             " (" + std::to_string(bytes) + " bytes)");
    }
    return Status::Ok();
  };
  const Key128 key{a.key.hi, a.key.lo};
  switch (static_cast<wire::AdminAction>(a.action)) {
    case wire::AdminAction::kListContracts: {
      // Pages of the TierManager's id snapshot: the index lock is held for a few entries
      // at a time, never for the listing (a contract gone since the snapshot is skipped).
      const auto ids = tm_->ContractIds();
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
          w.contract_id = ci.id;
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
      if (a.contract_id != 0) KVTIER_RETURN_IF_ERROR(CheckContract(a.contract_id));
      std::vector<tiers::BlockInfo> blocks;
      uint64_t total = 0;
      KVTIER_RETURN_IF_ERROR(tm_->ListBlocks(a.contract_id, static_cast<tiers::Tier>(a.tier), a.offset,
                                             fit, &blocks, &total));
      for (size_t i = 0; i < blocks.size(); ++i) {
        const wire::AdminBlockInfo w = ToWire(blocks[i]);
        std::memcpy(out + i * sizeof w, &w, sizeof w);
      }
      c->value = total;
      c->count = static_cast<uint32_t>(blocks.size());
      c->out_bytes = static_cast<uint32_t>(blocks.size() * sizeof(wire::AdminBlockInfo));
      return Status::Ok();
    }
    case wire::AdminAction::kInspect: {
      KVTIER_RETURN_IF_ERROR(need(sizeof(wire::AdminBlockInfo), "a block"));
      if (a.contract_id != 0) KVTIER_RETURN_IF_ERROR(CheckContract(a.contract_id));
      auto info = tm_->InspectBlock(a.contract_id, key);
      if (!info.ok()) return info.status();
      const wire::AdminBlockInfo w = ToWire(*info);
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
      return Status::Ok();
    }
    case wire::AdminAction::kEvictKey: {
      uint64_t contract = a.contract_id;
      if (contract != 0) {
        KVTIER_RETURN_IF_ERROR(CheckContract(contract));
      } else {
        auto info = tm_->InspectBlock(0, key);
        if (!info.ok()) return info.status();
        contract = info->contract_id;
      }
      Status s = tm_->Evict(contract, key);
      if (s.IsNotFound()) return Status::NotFound("block " + key.ToHex() + " is not cached");
      KVTIER_RETURN_IF_ERROR(s);
      if (uint64_t held = 0; AdminLog().Allow(&held)) {
        spdlog::info("client {} ({}): evicted block {} of contract {} ({} more admin lines held back)", id_, name_,
                     key.ToHex(), ContractIdHex(contract), held);
      }
      c->value = 1;
      return Status::Ok();
    }
    case wire::AdminAction::kEvictContract: {
      uint64_t evicted = 0, skipped = 0;
      KVTIER_RETURN_IF_ERROR(tm_->EvictContract(a.contract_id, &evicted, &skipped));
      if (uint64_t held = 0; AdminLog().Allow(&held)) {
        spdlog::info("client {} ({}): evicted {} blocks of contract {} ({} pinned left) ({} more admin lines held back)",
                     id_, name_, evicted, ContractIdHex(a.contract_id), skipped, held);
      }
      c->value = evicted;
      c->count = static_cast<uint32_t>(std::min<uint64_t>(skipped, UINT32_MAX));
      return Status::Ok();
    }
    case wire::AdminAction::kFlush: {
      const tiers::Tier to = a.tier == wire::kTierHost ? tiers::Tier::kHost : tiers::Tier::kNvme;
      KVTIER_RETURN_IF_ERROR(tm_->Flush(to));
      if (uint64_t held = 0; AdminLog().Allow(&held)) {
        spdlog::info("client {} ({}): flush to {} done ({} more admin lines held back)", id_, name_,
                     tiers::TierName(to), held);
      }
      return Status::Ok();
    }
    case wire::AdminAction::kReloadConfig: {
      if (!reload_) return Status::Unsupported("this daemon cannot reload its config");
      KVTIER_TEST_POINT("Session::Admin:Reload");
      std::string summary;
      KVTIER_RETURN_IF_ERROR(reload_(&summary));
      const size_t n = std::min<size_t>(summary.size(), room);
      if (n > 0) std::memcpy(out, summary.data(), n);
      c->out_bytes = static_cast<uint32_t>(n);
      return Status::Ok();
    }
  }
  return Status::Invalid("admin action " + std::to_string(a.action) + " unknown");
}

}  // namespace kvtier::daemon
