// Operator commands: kvtierctl [--socket PATH] COMMAND [--json]
//
//   stats                     per tier: capacity (bytes, and tokens per contract), used,
//                             blocks, payload vs scale bytes, hit ratio, promotions,
//                             demotions, bytes moved, checksum failures
//   tiers                     one line per tier
//   contracts                 registered contracts: id, model, geometry, format, block
//                             bytes, blocks per tier
//   ls [--contract ID] [--tier hbm|host|nvme] [--limit N]
//   inspect KEY [--contract ID]
//   verify                    re-reads and checks every NVMe record (progress on stderr)
//   evict KEY [--contract ID] | evict --contract ID
//   flush [--to host|nvme]    demote everything unpinned down to NVMe (or HBM -> host)
//   config check PATH         parse and validate a config file (no daemon needed)
//   config reload             the daemon re-reads its config (as SIGHUP)
//   export --contract ID --out FILE.kvt
//   import FILE.kvt
//
// Every command talks to kvtierd through libkvtier (the rings; operator requests are
// Op::kAdmin, formats/wire.h). Human tables by default, one JSON document with --json.
// A daemon that is not running, a wrong socket, an unknown key: one line on stderr and
// a non-zero exit.
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "formats/contract.h"
#include "formats/keys.h"
#include "formats/layout.h"
#include "formats/size.h"
#include "kvtier/kvtier.h"
#include "tools/cli.h"
#include "tools/export_file.h"

namespace kvtier {
namespace {

using cli::Fail;
using nlohmann::json;

constexpr uint32_t kPage = 4096;  // blocks per ls page (96 bytes each: fits the ring)

const char* TierStr(uint8_t t) {
  switch (t) {
    case KVTIER_TIER_HBM: return "hbm";
    case KVTIER_TIER_HOST: return "host";
    case KVTIER_TIER_NVME: return "nvme";
    case KVTIER_TIER_REMOTE: return "remote";
  }
  return "none";
}

std::string Bytes(uint64_t b) { return FormatSize(b, " "); }

std::string KeyHex(const kvtier_key& k) { return Key128{k.hi, k.lo}.ToHex(); }

// A connected client, closed on scope exit.
struct Conn {
  kvtier_client* c = nullptr;
  ~Conn() {
    if (c) kvtier_close(c);
  }
};

// Connects to the daemon; on failure prints one line and returns false (*code = exit).
bool Connect(const std::string& cmd, Conn* conn, int* code) {
  const std::string path = cli::SocketPath();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    *code = Fail(cmd + ": no kvtierd socket at " + path + " (is the daemon running? use --socket PATH)");
    return false;
  }
  kvtier_connect_options o{};
  o.name = "kvtierctl";
  o.timeout_ms = 600000;  // flush and verify may take minutes on large tiers
  if (kvtier_connect(path.c_str(), &o, &conn->c) != KVTIER_OK) {
    *code = Fail(cmd + ": cannot reach kvtierd at " + path + ": " + kvtier_last_error());
    return false;
  }
  return true;
}

int ApiFail(const std::string& cmd) { return Fail(cmd + ": " + kvtier_last_error()); }

// Parses args with --json (and `flags`), checks them against `known`.
StatusOr<cli::Args> ParseArgs(const std::vector<std::string>& argv, std::vector<std::string> known,
                              std::vector<std::string> flags = {}) {
  flags.push_back("json");
  known.push_back("json");
  auto args = cli::Args::Parse(argv, flags);
  if (!args.ok()) return args.status();
  KVTIER_RETURN_IF_ERROR(args->CheckKnown(known));
  return args;
}

bool WantsHelp(const std::vector<std::string>& argv, const char* usage) {
  if (!argv.empty() && (argv[0] == "--help" || argv[0] == "-h")) {
    std::printf("usage: kvtierctl [--socket PATH] %s\n", usage);
    return true;
  }
  return false;
}

StatusOr<uint64_t> ContractArg(const cli::Args& a) {
  auto v = a.Get("contract");
  if (!v) return uint64_t{0};
  uint64_t id = 0;
  if (!ParseContractIdHex(*v, &id) || id == 0) {
    return Status::Invalid("--contract must be 16 hex digits, got '" + *v + "'");
  }
  return id;
}

// ---- contracts ---------------------------------------------------------------------------

struct ContractRow {
  kvtier_contract_info info{};
  ScaleContract contract;
};

Status ListContracts(kvtier_client* c, std::vector<ContractRow>* out) {
  out->clear();
  std::vector<uint8_t> buf(512 * 1024);
  uint64_t offset = 0, total = 0;
  do {
    size_t bytes = 0;
    uint32_t n = 0;
    const kvtier_status st = kvtier_list_contracts(c, offset, 1024, buf.data(), buf.size(), &bytes, &n, &total);
    if (st == KVTIER_REJECTED) return Status::Rejected(kvtier_last_error());
    if (st != KVTIER_OK) return Status::IoError(kvtier_last_error());
    size_t pos = 0;
    for (uint32_t i = 0; i < n; ++i) {
      ContractRow r;
      if (pos + sizeof r.info > bytes) return Status::Corrupt("contract list reply truncated");
      std::memcpy(&r.info, buf.data() + pos, sizeof r.info);
      pos += sizeof r.info;
      if (pos + r.info.contract_bytes > bytes) return Status::Corrupt("contract list reply truncated");
      auto ct = ScaleContract::Deserialize({buf.data() + pos, r.info.contract_bytes});
      if (!ct.ok()) return ct.status();
      r.contract = std::move(*ct);
      pos += (r.info.contract_bytes + 7) / 8 * 8;
      out->push_back(std::move(r));
    }
    if (n == 0) break;
    offset += n;
  } while (offset < total);
  return Status::Ok();
}

json ContractJson(const ContractRow& r) {
  const auto& c = r.contract;
  return json{{"id", ContractIdHex(r.info.contract_id)},
              {"model", c.model_id},
              {"model_revision", c.model_revision},
              {"tokenizer_revision", c.tokenizer_revision},
              {"geometry",
               {{"layers", c.geometry.num_layers},
                {"kv_heads", c.geometry.num_kv_heads},
                {"head_dim", c.geometry.head_dim},
                {"block_tokens", c.geometry.block_tokens}}},
              {"tp", {{"rank", c.tp_rank}, {"size", c.tp_size}}},
              {"format", KvFormatName(c.format)},
              {"block_bytes", r.info.block_bytes},
              {"scale_bytes_per_block", BlockScaleBytes(c.format, c.geometry)},
              {"blocks", {{"hbm", r.info.blocks[0]}, {"host", r.info.blocks[1]}, {"nvme", r.info.blocks[2]}}}};
}

int RunContracts(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "contracts [--json]")) return 0;
  auto args = ParseArgs(argv, {});
  if (!args.ok()) return Fail("contracts: " + args.status().message(), 2);
  Conn conn;
  int code = 0;
  if (!Connect("contracts", &conn, &code)) return code;
  std::vector<ContractRow> rows;
  if (Status s = ListContracts(conn.c, &rows); !s.ok()) return Fail("contracts: " + s.message());
  if (args->Has("json")) {
    json j = json::array();
    for (const auto& r : rows) j.push_back(ContractJson(r));
    std::printf("%s\n", json{{"contracts", j}}.dump(2).c_str());
    return 0;
  }
  std::printf("%-16s  %-28s  %-17s  %-6s  %11s  %9s  %9s  %9s\n", "CONTRACT", "MODEL", "L x H x D x T",
              "FORMAT", "BLOCK", "HBM", "HOST", "NVME");
  for (const auto& r : rows) {
    const auto& g = r.contract.geometry;
    const std::string geo = std::to_string(g.num_layers) + "x" + std::to_string(g.num_kv_heads) + "x" +
                            std::to_string(g.head_dim) + "x" + std::to_string(g.block_tokens);
    std::printf("%-16s  %-28s  %-17s  %-6s  %11s  %9" PRIu64 "  %9" PRIu64 "  %9" PRIu64 "\n",
                ContractIdHex(r.info.contract_id).c_str(), r.contract.model_id.c_str(), geo.c_str(),
                KvFormatName(r.contract.format), Bytes(r.info.block_bytes).c_str(), r.info.blocks[0],
                r.info.blocks[1], r.info.blocks[2]);
  }
  if (rows.empty()) std::printf("(no contract registered)\n");
  return 0;
}

// ---- stats / tiers -------------------------------------------------------------------------

int RunStatsOrTiers(const std::vector<std::string>& argv, bool full) {
  const std::string cmd = full ? "stats" : "tiers";
  if (WantsHelp(argv, full ? "stats [--json]" : "tiers [--json]")) return 0;
  auto args = ParseArgs(argv, {});
  if (!args.ok()) return Fail(cmd + ": " + args.status().message(), 2);
  Conn conn;
  int code = 0;
  if (!Connect(cmd, &conn, &code)) return code;
  kvtier_tier_stats ts[8];
  size_t n = 0;
  if (kvtier_stats(conn.c, ts, 8, &n) != KVTIER_OK) return ApiFail(cmd);
  std::vector<ContractRow> rows;
  bool listed = true;
  if (full) {
    // The contracts are an admin listing: a client without the right gets the tiers alone.
    if (Status s = ListContracts(conn.c, &rows); !s.ok()) {
      if (s.code() != StatusCode::kRejected) return Fail(cmd + ": " + s.message());
      listed = false;
    }
  }
  std::vector<kvtier_tenant_counters> tenants(1024);
  size_t n_tenants = 0;
  if (full && kvtier_tenant_stats(conn.c, tenants.data(), tenants.size(), &n_tenants) != KVTIER_OK) n_tenants = 0;
  tenants.resize(n_tenants);
  json tiers = json::array();
  for (size_t i = 0; i < n; ++i) {
    const auto& t = ts[i];
    const uint64_t lookups = t.hits + t.misses;
    json j{{"tier", TierStr(t.tier)},
           {"present", t.present != 0},
           {"capacity_bytes", t.capacity_bytes},
           {"used_bytes", t.used_bytes},
           {"slots_total", t.slots_total},
           {"slots_used", t.slots_used},
           {"blocks", t.blocks},
           {"pinned", t.pinned}};
    if (full) {
      json per = json::array();
      uint64_t payload = 0, scales = 0;
      for (const auto& r : rows) {
        // The remote tier keeps no per-contract index here (it is shared by the fleet).
        const uint64_t blocks = t.tier <= KVTIER_TIER_NVME ? r.info.blocks[t.tier] : 0;
        const uint64_t sb = BlockScaleBytes(r.contract.format, r.contract.geometry);
        payload += blocks * (r.info.block_bytes - sb);
        scales += blocks * sb;
        per.push_back({{"contract", ContractIdHex(r.info.contract_id)},
                       {"capacity_tokens", t.slots_total * r.contract.geometry.block_tokens},
                       {"blocks", blocks}});
      }
      j["per_contract"] = per;
      j["payload_bytes"] = payload;
      j["scale_bytes"] = scales;
      j["hits"] = t.hits;
      j["misses"] = t.misses;
      j["hit_ratio"] = lookups ? static_cast<double>(t.hits) / static_cast<double>(lookups) : 0.0;
      j["promotions_in"] = t.promotions_in;
      j["demotions_out"] = t.demotions_out;
      j["bytes_read"] = t.bytes_read;
      j["bytes_written"] = t.bytes_written;
      j["bytes_moved"] = t.bytes_read + t.bytes_written;
      j["checksum_failures"] = t.checksum_failures;
      j["evictions_demoted"] = t.evictions_demoted;
      j["evictions_dropped"] = t.evictions_dropped;
      j["admission_rejects"] = t.admission_rejects;
      j["slab_moves"] = t.slab_moves;  // between slot classes
      j["read_gbps"] = t.read_gbps;
      j["write_gbps"] = t.write_gbps;
      j["errors"] = t.errors;              // remote tier: answers lost to a down or slow node
      j["write_errors"] = t.write_errors;  // remote tier: writes dropped or failed
    }
    tiers.push_back(j);
  }
  json tenant_rows = json::array();
  static const char* kTierKey[3] = {"hbm", "host", "nvme"};
  for (const auto& t : tenants) {
    json j{{"tenant", t.name},
           {"lookup_keys", t.lookup_keys},
           {"lookup_hits", t.lookup_hits},
           {"committed", t.committed},
           {"access_denied", t.access_denied}};
    for (int k = 0; k < 3; ++k) {
      j[std::string(kTierKey[k])] = {{"blocks", t.blocks[k]}, {"quota_slots", t.quota_slots[k]},
                                     {"evictions", t.evictions[k]}};
    }
    tenant_rows.push_back(j);
  }
  if (args->Has("json")) {
    json doc{{"socket", cli::SocketPath()}, {"tiers", tiers}};
    if (!tenants.empty()) doc["tenants"] = tenant_rows;
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  std::printf("%-5s %-7s %11s %11s %6s %10s %8s", "TIER", "PRESENT", "CAPACITY", "USED", "USED%", "BLOCKS",
              "PINNED");
  if (full) {
    std::printf(" %11s %11s %7s %9s %9s %11s %6s %7s %7s %10s", "PAYLOAD", "SCALES", "HIT%", "PROMOTED", "DEMOTED",
                "MOVED", "CKSUM!", "ERRORS", "WRITE!", "SLABMOVES");
  }
  std::printf("\n");
  for (const auto& j : tiers) {
    const uint64_t cap = j["capacity_bytes"], used = j["used_bytes"];
    std::printf("%-5s %-7s %11s %11s %5.1f%% %10" PRIu64 " %8" PRIu64, j["tier"].get<std::string>().c_str(),
                j["present"].get<bool>() ? "yes" : "no", Bytes(cap).c_str(), Bytes(used).c_str(),
                cap ? 100.0 * static_cast<double>(used) / static_cast<double>(cap) : 0.0,
                j["blocks"].get<uint64_t>(), j["pinned"].get<uint64_t>());
    if (full) {
      std::printf(" %11s %11s %6.1f%% %9" PRIu64 " %9" PRIu64 " %11s %6" PRIu64 " %7" PRIu64 " %7" PRIu64
                  " %10" PRIu64,
                  Bytes(j["payload_bytes"].get<uint64_t>()).c_str(), Bytes(j["scale_bytes"].get<uint64_t>()).c_str(),
                  100.0 * j["hit_ratio"].get<double>(), j["promotions_in"].get<uint64_t>(),
                  j["demotions_out"].get<uint64_t>(), Bytes(j["bytes_moved"].get<uint64_t>()).c_str(),
                  j["checksum_failures"].get<uint64_t>(), j["errors"].get<uint64_t>(),
                  j["write_errors"].get<uint64_t>(), j["slab_moves"].get<uint64_t>());
    }
    std::printf("\n");
  }
  if (full && !rows.empty()) {
    std::printf("\ncapacity in tokens per contract:\n%-16s  %-24s", "CONTRACT", "MODEL");
    for (const auto& j : tiers) std::printf(" %14s", j["tier"].get<std::string>().c_str());
    std::printf("\n");
    for (size_t r = 0; r < rows.size(); ++r) {
      std::printf("%-16s  %-24s", ContractIdHex(rows[r].info.contract_id).c_str(),
                  rows[r].contract.model_id.c_str());
      for (const auto& j : tiers) {
        std::printf(" %14" PRIu64, j["per_contract"][r]["capacity_tokens"].get<uint64_t>());
      }
      std::printf("\n");
    }
  }
  if (full && !listed) std::printf("\n(contracts not listed: this client may not run admin listings)\n");
  if (!tenants.empty()) {
    std::printf("\ntenants:\n%-24s %21s %21s %21s %11s %11s %10s %7s\n", "TENANT", "HBM BLOCKS/SHARE",
                "HOST BLOCKS/SHARE", "NVME BLOCKS/SHARE", "LOOKUPS", "HITS", "COMMITTED", "DENIED");
    for (const auto& t : tenants) {
      std::printf("%-24s", t.name);
      for (int k = 0; k < 3; ++k) {
        const std::string cell = std::to_string(t.blocks[k]) + "/" + std::to_string(t.quota_slots[k]);
        std::printf(" %21s", cell.c_str());
      }
      std::printf(" %11" PRIu64 " %11" PRIu64 " %10" PRIu64 " %7" PRIu64 "\n", t.lookup_keys, t.lookup_hits,
                  t.committed, t.access_denied);
    }
  }
  return 0;
}

// ---- ls / inspect ------------------------------------------------------------------------------

std::string Where(uint8_t w) {
  std::string s;
  if (w & KVTIER_BLOCK_IN_HBM) s += "hbm,";
  if (w & KVTIER_BLOCK_IN_HOST) s += "host,";
  if (w & KVTIER_BLOCK_IN_NVME) s += "nvme,";
  if (!s.empty()) s.pop_back();
  return s.empty() ? "-" : s;
}

json BlockJson(const kvtier_block_info& b, bool inspect) {
  json tiers = json::array();
  if (b.where & KVTIER_BLOCK_IN_HBM) tiers.push_back("hbm");
  if (b.where & KVTIER_BLOCK_IN_HOST) tiers.push_back("host");
  if (b.where & KVTIER_BLOCK_IN_NVME) tiers.push_back("nvme");
  json j{{"key", KeyHex(b.key)},   {"contract", ContractIdHex(b.contract_id)},
         {"parent", KeyHex(b.parent)}, {"bytes", b.bytes},
         {"tiers", tiers},           {"hits", b.uses},
         {"pins", {{"hbm", b.pins_hbm}, {"host", b.pins_host}}}};
  if (inspect) {
    j["hbm_slot"] = b.hbm_slot;
    j["host_slot"] = b.host_slot;
    if (b.where & KVTIER_BLOCK_IN_NVME) {
      char p[24], h[24];
      std::snprintf(p, sizeof p, "%016" PRIx64, b.payload_xxh3);
      std::snprintf(h, sizeof h, "%016" PRIx64, b.header_xxh3);
      j["nvme"] = {{"record", b.nvme_record},
                   {"payload_xxh3", p},
                   {"header_xxh3", h},
                   {"reads", b.nvme_hits},
                   {"verified", (b.where & KVTIER_BLOCK_NVME_VERIFIED) != 0}};
    }
  }
  return j;
}

int RunLs(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "ls [--contract ID] [--tier hbm|host|nvme] [--limit N] [--json]")) return 0;
  auto args = ParseArgs(argv, {"contract", "tier", "limit"});
  if (!args.ok()) return Fail("ls: " + args.status().message(), 2);
  if (!args->positional().empty()) return Fail("ls: unexpected argument '" + args->positional()[0] + "'", 2);
  auto cid = ContractArg(*args);
  if (!cid.ok()) return Fail("ls: " + cid.status().message(), 2);
  kvtier_tier tier = KVTIER_TIER_NONE;
  if (auto t = args->Get("tier")) {
    if (*t == "hbm") tier = KVTIER_TIER_HBM;
    else if (*t == "host") tier = KVTIER_TIER_HOST;
    else if (*t == "nvme") tier = KVTIER_TIER_NVME;
    else return Fail("ls: --tier must be hbm, host or nvme, got '" + *t + "'", 2);
  }
  auto limit = args->GetInt("limit", 0);
  if (!limit.ok() || *limit < 0) return Fail("ls: --limit must be a count >= 0 (0 = all)", 2);
  Conn conn;
  int code = 0;
  if (!Connect("ls", &conn, &code)) return code;
  const bool js = args->Has("json");
  json arr = json::array();
  std::vector<kvtier_block_info> page(kPage);
  uint64_t offset = 0, total = 0, shown = 0;
  const uint64_t max = *limit == 0 ? UINT64_MAX : static_cast<uint64_t>(*limit);
  if (!js) std::printf("%-32s  %-16s  %-13s  %10s  %6s  %-32s\n", "KEY", "CONTRACT", "TIERS", "BYTES", "HITS", "PARENT");
  do {
    uint32_t n = 0;
    if (kvtier_list_blocks(conn.c, *cid, tier, offset, kPage, page.data(), &n, &total) != KVTIER_OK) {
      return ApiFail("ls");
    }
    for (uint32_t i = 0; i < n && shown < max; ++i, ++shown) {
      const auto& b = page[i];
      if (js) {
        arr.push_back(BlockJson(b, false));
      } else {
        std::printf("%-32s  %-16s  %-13s  %10" PRIu64 "  %6u  %-32s\n", KeyHex(b.key).c_str(),
                    ContractIdHex(b.contract_id).c_str(), Where(b.where).c_str(), b.bytes, b.uses,
                    KeyHex(b.parent).c_str());
      }
    }
    if (n == 0) break;
    offset += n;
  } while (offset < total && shown < max);
  if (js) {
    std::printf("%s\n", json{{"total", total}, {"blocks", arr}}.dump(2).c_str());
  } else {
    std::printf("(%" PRIu64 " of %" PRIu64 " blocks)\n", shown, total);
  }
  return 0;
}

int RunInspect(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "inspect KEY [--contract ID] [--json]")) return 0;
  auto args = ParseArgs(argv, {"contract"});
  if (!args.ok()) return Fail("inspect: " + args.status().message(), 2);
  if (args->positional().size() != 1) return Fail("inspect: give one KEY (32 hex digits)", 2);
  auto key = Key128::FromHex(args->positional()[0]);
  if (!key || key->IsZero()) {
    return Fail("inspect: KEY must be 32 hex digits (not all zero), got '" + args->positional()[0] + "'", 2);
  }
  auto cid = ContractArg(*args);
  if (!cid.ok()) return Fail("inspect: " + cid.status().message(), 2);
  Conn conn;
  int code = 0;
  if (!Connect("inspect", &conn, &code)) return code;
  kvtier_block_info b{};
  if (kvtier_inspect(conn.c, *cid, kvtier_key{key->hi, key->lo}, &b) != KVTIER_OK) return ApiFail("inspect");
  const json j = BlockJson(b, true);
  if (args->Has("json")) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("key        %s\ncontract   %s\nparent     %s\ntiers      %s\nsize       %" PRIu64
              " bytes\nhits       %u\npins       hbm %u, host %u\n",
              KeyHex(b.key).c_str(), ContractIdHex(b.contract_id).c_str(), KeyHex(b.parent).c_str(),
              Where(b.where).c_str(), b.bytes, b.uses, b.pins_hbm, b.pins_host);
  if (b.hbm_slot >= 0) std::printf("hbm slot   %d\n", b.hbm_slot);
  if (b.host_slot >= 0) std::printf("host slot  %d\n", b.host_slot);
  if (j.contains("nvme")) {
    const auto& n = j["nvme"];
    std::printf("nvme       record %u, payload xxh3 %s, header xxh3 %s, %s\n", b.nvme_record,
                n["payload_xxh3"].get<std::string>().c_str(), n["header_xxh3"].get<std::string>().c_str(),
                n["verified"].get<bool>() ? "verified" : "not yet verified since restart");
  }
  return 0;
}

// ---- progress --------------------------------------------------------------------------------

// Progress on stderr: a redrawn bar on a terminal, a plain line every 10% otherwise.
class Progress {
 public:
  explicit Progress(std::string what) : what_(std::move(what)), tty_(::isatty(2) == 1) {}
  void Update(uint64_t done, uint64_t total) {
    if (total == 0) return;
    const int pct = static_cast<int>(100.0 * static_cast<double>(std::min(done, total)) / static_cast<double>(total));
    if (tty_) {
      const int w = 40, fill = pct * w / 100;
      std::fprintf(stderr, "\r%s [%s%s] %3d%% %" PRIu64 "/%" PRIu64, what_.c_str(), std::string(fill, '#').c_str(),
                   std::string(w - fill, '.').c_str(), pct, done, total);
      drawn_ = true;
    } else if (pct >= next_) {
      std::fprintf(stderr, "%s: %d%% (%" PRIu64 "/%" PRIu64 ")\n", what_.c_str(), pct, done, total);
      next_ = pct / 10 * 10 + 10;
    }
  }
  ~Progress() {
    if (drawn_) std::fputc('\n', stderr);
  }

 private:
  std::string what_;
  bool tty_;
  bool drawn_ = false;
  int next_ = 0;
};

// ---- verify / evict / flush -----------------------------------------------------------------

int RunVerify(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "verify [--batch N] [--json]")) return 0;
  auto args = ParseArgs(argv, {"batch"});
  if (!args.ok()) return Fail("verify: " + args.status().message(), 2);
  auto batch = args->GetInt("batch", 64);
  if (!batch.ok() || *batch < 1 || *batch > 65536) return Fail("verify: --batch must be in [1, 65536]", 2);
  Conn conn;
  int code = 0;
  if (!Connect("verify", &conn, &code)) return code;
  kvtier_verify_report sum{};
  uint64_t offset = 0, total = 0;
  {
    Progress prog("verify");
    while (true) {
      kvtier_verify_report r{};
      if (kvtier_verify_nvme(conn.c, offset, static_cast<uint32_t>(*batch), &r) != KVTIER_OK) {
        return ApiFail("verify");
      }
      total = r.total;
      sum.checked += r.checked;
      sum.ok += r.ok;
      sum.corrupt += r.corrupt;
      sum.missing += r.missing;
      sum.io_errors += r.io_errors;
      prog.Update(sum.checked + sum.missing, std::max(total + sum.corrupt, sum.checked + sum.missing));
      // Dropped (corrupt) records leave the index: the records after them move down.
      const uint64_t advance = static_cast<uint64_t>(*batch) - std::min<uint64_t>(r.corrupt, *batch);
      offset += advance == 0 ? 1 : advance;
      if (offset >= r.total) break;
    }
  }
  sum.total = total;
  if (args->Has("json")) {
    std::printf("%s\n", json{{"records", total},
                             {"checked", sum.checked},
                             {"ok", sum.ok},
                             {"corrupt", sum.corrupt},
                             {"missing", sum.missing},
                             {"io_errors", sum.io_errors}}
                            .dump(2)
                            .c_str());
  } else {
    std::printf("verified %" PRIu64 " NVMe records: %" PRIu64 " ok, %" PRIu64 " corrupt (dropped), %" PRIu64
                " gone meanwhile, %" PRIu64 " I/O errors\n",
                sum.checked, sum.ok, sum.corrupt, sum.missing, sum.io_errors);
  }
  if (sum.corrupt > 0 || sum.io_errors > 0) {
    return Fail("verify: " + std::to_string(sum.corrupt) + " corrupt records and " + std::to_string(sum.io_errors) +
                " I/O errors");
  }
  return 0;
}

int RunEvict(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "evict KEY [--contract ID] | evict --contract ID [--json]")) return 0;
  auto args = ParseArgs(argv, {"contract"});
  if (!args.ok()) return Fail("evict: " + args.status().message(), 2);
  auto cid = ContractArg(*args);
  if (!cid.ok()) return Fail("evict: " + cid.status().message(), 2);
  if (args->positional().size() > 1) return Fail("evict: give one KEY or --contract ID", 2);
  if (args->positional().empty() && *cid == 0) return Fail("evict: give a KEY or --contract ID", 2);
  Conn conn;
  int code = 0;
  if (!Connect("evict", &conn, &code)) return code;
  json j;
  if (!args->positional().empty()) {
    auto key = Key128::FromHex(args->positional()[0]);
    if (!key || key->IsZero()) {
      return Fail("evict: KEY must be 32 hex digits (not all zero), got '" + args->positional()[0] + "'", 2);
    }
    if (kvtier_evict(conn.c, *cid, kvtier_key{key->hi, key->lo}) != KVTIER_OK) return ApiFail("evict");
    j = {{"evicted", 1}, {"key", key->ToHex()}};
    if (!args->Has("json")) std::printf("evicted block %s\n", key->ToHex().c_str());
  } else {
    uint64_t ev = 0, sk = 0;
    if (kvtier_evict_contract(conn.c, *cid, &ev, &sk) != KVTIER_OK) return ApiFail("evict");
    j = {{"evicted", ev}, {"pinned_skipped", sk}, {"contract", ContractIdHex(*cid)}};
    if (!args->Has("json")) {
      std::printf("evicted %" PRIu64 " blocks of contract %s (%" PRIu64 " pinned, left in place)\n", ev,
                  ContractIdHex(*cid).c_str(), sk);
    }
  }
  if (args->Has("json")) std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

int RunFlush(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "flush [--to host|nvme] [--json]")) return 0;
  auto args = ParseArgs(argv, {"to"});
  if (!args.ok()) return Fail("flush: " + args.status().message(), 2);
  const std::string to = args->Get("to").value_or("nvme");
  if (to != "host" && to != "nvme") return Fail("flush: --to must be host or nvme, not '" + to + "'", 2);
  Conn conn;
  int code = 0;
  if (!Connect("flush", &conn, &code)) return code;
  if (kvtier_flush_to(conn.c, to == "host" ? KVTIER_TIER_HOST : KVTIER_TIER_NVME) != KVTIER_OK) {
    return ApiFail("flush");
  }
  if (args->Has("json")) std::printf("%s\n", json{{"flushed", true}, {"to", to}}.dump(2).c_str());
  else if (to == "host") std::printf("flushed: every unpinned block of HBM is in host memory\n");
  else std::printf("flushed: every unpinned block of HBM and host is on NVMe\n");
  return 0;
}

// ---- config -----------------------------------------------------------------------------------

int RunConfig(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "config check PATH | config reload [--json]")) return 0;
  auto args = ParseArgs(argv, {});
  if (!args.ok()) return Fail("config: " + args.status().message(), 2);
  const auto& pos = args->positional();
  const bool js = args->Has("json");
  if (pos.size() == 2 && pos[0] == "check") {
    auto c = config::LoadFile(pos[1], {});
    if (!c.ok()) {
      if (js) std::printf("%s\n", json{{"path", pos[1]}, {"ok", false}, {"error", c.status().message()}}.dump(2).c_str());
      return Fail("config check: " + c.status().message());
    }
    if (js) {
      std::printf("%s\n", json{{"path", pos[1]},
                               {"ok", true},
                               {"socket", c->daemon.socket},
                               {"slot_bytes", c->tiers.slot_bytes},
                               {"hbm_capacity", c->tiers.hbm.capacity_bytes},
                               {"host_capacity", c->tiers.host.capacity_bytes},
                               {"nvme_capacity", c->tiers.nvme.tier.capacity_bytes},
                               {"nvme_dir", c->tiers.nvme.dir}}
                              .dump(2)
                              .c_str());
    } else {
      std::printf("%s: ok (socket %s; slot %s; hbm %s, host %s, nvme %s in %s)\n", pos[1].c_str(),
                  c->daemon.socket.c_str(), Bytes(c->tiers.slot_bytes).c_str(),
                  Bytes(c->tiers.hbm.capacity_bytes).c_str(), Bytes(c->tiers.host.capacity_bytes).c_str(),
                  Bytes(c->tiers.nvme.tier.capacity_bytes).c_str(), c->tiers.nvme.dir.c_str());
    }
    return 0;
  }
  if (pos.size() == 1 && pos[0] == "reload") {
    Conn conn;
    int code = 0;
    if (!Connect("config reload", &conn, &code)) return code;
    char msg[1024] = {};
    if (kvtier_reload_config(conn.c, msg, sizeof msg) != KVTIER_OK) return ApiFail("config reload");
    if (js) std::printf("%s\n", json{{"reloaded", true}, {"summary", msg}}.dump(2).c_str());
    else std::printf("%s\n", msg);
    return 0;
  }
  return Fail("config: expected 'config check PATH' or 'config reload'", 2);
}

// ---- export / import ------------------------------------------------------------------------

int RunExport(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "export --contract ID --out FILE.kvt [--level N] [--json]")) return 0;
  auto args = ParseArgs(argv, {"contract", "out", "level"});
  if (!args.ok()) return Fail("export: " + args.status().message(), 2);
  auto cid = ContractArg(*args);
  if (!cid.ok()) return Fail("export: " + cid.status().message(), 2);
  if (*cid == 0) return Fail("export: missing --contract", 2);
  auto out = args->Require("out");
  if (!out.ok()) return Fail("export: " + out.status().message(), 2);
  auto level = args->GetInt("level", 3);
  if (!level.ok() || *level < 1 || *level > 19) return Fail("export: --level must be in [1, 19]", 2);
  Conn conn;
  int code = 0;
  if (!Connect("export", &conn, &code)) return code;
  std::vector<ContractRow> rows;
  if (Status s = ListContracts(conn.c, &rows); !s.ok()) return Fail("export: " + s.message());
  const ContractRow* row = nullptr;
  for (const auto& r : rows) {
    if (r.info.contract_id == *cid) row = &r;
  }
  if (row == nullptr) return Fail("export: contract " + ContractIdHex(*cid) + " is not registered with the daemon");
  // The block list first (keys, parents, sizes), then the bytes batch by batch.
  std::vector<kvtier_block_info> blocks, page(kPage);
  uint64_t offset = 0, total = 0;
  do {
    uint32_t n = 0;
    if (kvtier_list_blocks(conn.c, *cid, KVTIER_TIER_NONE, offset, kPage, page.data(), &n, &total) != KVTIER_OK) {
      return ApiFail("export");
    }
    blocks.insert(blocks.end(), page.begin(), page.begin() + n);
    if (n == 0) break;
    offset += n;
  } while (offset < total);
  uint64_t arena_bytes = 0;
  auto* arena = static_cast<const uint8_t*>(kvtier_host_arena(conn.c, &arena_bytes));
  if (arena == nullptr) return Fail("export: the daemon has no host tier to read blocks through");
  const uint64_t slot_bytes = kvtier_slot_bytes(conn.c);
  auto w = ExportWriter::Create(*out, row->contract, static_cast<int>(*level));
  if (!w.ok()) return Fail("export: " + w.status().message());
  uint64_t skipped = 0;
  {
    Progress prog("export");
    size_t i = 0;
    size_t batch = 16;
    while (i < blocks.size()) {
      const size_t n = std::min(batch, blocks.size() - i);
      std::vector<kvtier_key> keys(n);
      for (size_t k = 0; k < n; ++k) keys[k] = blocks[i + k].key;
      std::vector<kvtier_slot> slots(n);
      uint64_t lease = 0;
      size_t got = 0;
      const kvtier_status st =
          kvtier_acquire(conn.c, *cid, keys.data(), n, KVTIER_TIER_HOST, &lease, slots.data(), &got);
      if (st == KVTIER_RETRY || st == KVTIER_REJECTED) {
        if (batch > 1) {
          batch = 1;  // the host tier is short of free slots: one block at a time
          continue;
        }
        return ApiFail("export");
      }
      if (st != KVTIER_OK) return ApiFail("export");
      Status ws;
      for (size_t k = 0; k < got && ws.ok(); ++k) {
        const auto& b = blocks[i + k];
        // Where the slot lies (kvtier_host_slot: slot * granule, whatever its class).
        const auto* p = slots[k].tier == KVTIER_TIER_HOST
                            ? static_cast<const uint8_t*>(kvtier_host_slot(conn.c, slots[k].slot))
                            : nullptr;
        if (p == nullptr || uint64_t(p - arena) + b.bytes > arena_bytes || b.bytes > slot_bytes) {
          ws = Status::Corrupt("daemon returned a slot outside the host arena");
          break;
        }
        ws = (*w)->Add(Key128{b.key.hi, b.key.lo}, Key128{b.parent.hi, b.parent.lo}, {p, b.bytes});
      }
      if (lease != 0 && kvtier_release(conn.c, lease) != KVTIER_OK) return ApiFail("export");
      if (!ws.ok()) return Fail("export: " + ws.message());
      // A block evicted since the listing ends the acquired prefix: skip it.
      if (got < n) ++skipped;
      i += got < n ? got + 1 : n;
      prog.Update(i, blocks.size());
    }
  }
  if (Status s = (*w)->Finish(); !s.ok()) return Fail("export: " + s.message());
  const double ratio = (*w)->stored_bytes() ? static_cast<double>((*w)->raw_bytes()) / static_cast<double>((*w)->stored_bytes()) : 1.0;
  if (args->Has("json")) {
    std::printf("%s\n", json{{"file", *out},
                             {"contract", ContractIdHex(*cid)},
                             {"records", (*w)->records()},
                             {"skipped_evicted", skipped},
                             {"raw_bytes", (*w)->raw_bytes()},
                             {"stored_bytes", (*w)->stored_bytes()},
                             {"compressed_records", (*w)->compressed_records()},
                             {"ratio", ratio}}
                            .dump(2)
                            .c_str());
  } else {
    std::printf("exported %" PRIu64 " blocks of contract %s to %s: %s raw, %s stored (ratio %.3f, %" PRIu64
                " records compressed)%s\n",
                (*w)->records(), ContractIdHex(*cid).c_str(), out->c_str(), Bytes((*w)->raw_bytes()).c_str(),
                Bytes((*w)->stored_bytes()).c_str(), ratio, (*w)->compressed_records(),
                skipped ? (", " + std::to_string(skipped) + " evicted meanwhile").c_str() : "");
  }
  return 0;
}

int RunImport(const std::vector<std::string>& argv) {
  if (WantsHelp(argv, "import FILE.kvt [--json]")) return 0;
  auto args = ParseArgs(argv, {});
  if (!args.ok()) return Fail("import: " + args.status().message(), 2);
  if (args->positional().size() != 1) return Fail("import: give one FILE.kvt", 2);
  const std::string path = args->positional()[0];
  auto r = ExportReader::Open(path);
  if (!r.ok()) return Fail("import: " + path + ": " + r.status().message() + " (nothing stored)");
  uint64_t records = 0;
  {
    Progress prog("verify " + path);
    Status v = (*r)->VerifyAll([&](uint64_t done, uint64_t total) { prog.Update(done, total); }, &records);
    if (!v.ok()) return Fail("import: " + path + ": " + v.message() + " (nothing stored)");
  }
  const ScaleContract& ct = (*r)->contract();
  kvtier_contract_desc d{};
  d.model_id = ct.model_id.c_str();
  d.model_revision = ct.model_revision.c_str();
  d.tokenizer_revision = ct.tokenizer_revision.c_str();
  d.num_layers = ct.geometry.num_layers;
  d.num_kv_heads = ct.geometry.num_kv_heads;
  d.head_dim = ct.geometry.head_dim;
  d.block_tokens = ct.geometry.block_tokens;
  d.tp_rank = ct.tp_rank;
  d.tp_size = ct.tp_size;
  d.kv_format = static_cast<uint8_t>(ct.format);
  d.scale_rule = static_cast<uint8_t>(ct.scale_rule);
  d.v_scale_swizzle = ct.v_scale_swizzle ? 1 : 0;
  d.k_scales = ct.k_scales.data();
  d.v_scales = ct.v_scales.data();
  uint64_t id = 0;
  if (kvtier_contract_id(&d, &id) != KVTIER_OK || id != (*r)->contract_id()) {
    return Fail("import: " + path + ": the file's contract " + ContractIdHex((*r)->contract_id()) +
                " cannot be expressed through libkvtier (layout version?) (nothing stored)");
  }
  Conn conn;
  int code = 0;
  if (!Connect("import", &conn, &code)) return code;
  if (kvtier_register_contract(conn.c, &d, &id) != KVTIER_OK) {
    return Fail(std::string("import: the daemon refuses contract ") + ContractIdHex((*r)->contract_id()) + ": " +
                kvtier_last_error() + " (nothing stored)");
  }
  uint64_t arena_bytes = 0;
  auto* arena = static_cast<uint8_t*>(kvtier_host_arena(conn.c, &arena_bytes));
  const uint64_t slot_bytes = kvtier_slot_bytes(conn.c);
  if (arena == nullptr) return Fail("import: the daemon has no host tier to write blocks through (nothing stored)");
  uint64_t stored = 0;
  {
    Progress prog("import");
    bool eof = false;
    while (!eof) {
      // One batch: read up to 16 records, alloc that many host slots, copy, commit, release.
      std::vector<RecordHeader> recs;
      std::vector<std::vector<uint8_t>> payloads;
      while (recs.size() < 16) {
        RecordHeader h;
        std::vector<uint8_t> p;
        if (Status s = (*r)->Next(&h, &p, &eof); !s.ok()) {
          return Fail("import: " + s.message() + " after " + std::to_string(stored) + " blocks stored");
        }
        if (eof) break;
        if (p.size() > slot_bytes) {
          return Fail("import: a block of " + std::to_string(p.size()) + " bytes does not fit the daemon's " +
                      std::to_string(slot_bytes) + "-byte slots (" + std::to_string(stored) + " blocks stored)");
        }
        recs.push_back(h);
        payloads.push_back(std::move(p));
      }
      if (recs.empty()) break;
      std::vector<kvtier_slot> slots(recs.size());
      uint64_t lease = 0;
      if (kvtier_alloc(conn.c, id, recs.size(), KVTIER_TIER_HOST, &lease, slots.data()) != KVTIER_OK) {
        return Fail(std::string("import: ") + kvtier_last_error() + " (" + std::to_string(stored) + " blocks stored)");
      }
      std::vector<kvtier_commit_item> items(recs.size());
      for (size_t k = 0; k < recs.size(); ++k) {
        // A staging slot of this client (kvtier_host_slot_write), slot_bytes long.
        auto* p = slots[k].tier == KVTIER_TIER_HOST ? static_cast<uint8_t*>(kvtier_host_slot_write(conn.c, slots[k].slot))
                                                     : nullptr;
        if (p == nullptr || uint64_t(p - arena) + payloads[k].size() > arena_bytes) {
          (void)kvtier_release(conn.c, lease);
          return Fail("import: daemon returned a slot outside this client's staging area");
        }
        std::memcpy(p, payloads[k].data(), payloads[k].size());
        items[k].slot = slots[k];
        items[k].key = {recs[k].key.hi, recs[k].key.lo};
        items[k].parent = {recs[k].parent.hi, recs[k].parent.lo};
      }
      size_t committed = 0;
      const kvtier_status cs = kvtier_commit(conn.c, id, lease, items.data(), items.size(), &committed);
      const std::string err = cs != KVTIER_OK ? kvtier_last_error() : "";
      stored += committed;
      (void)kvtier_release(conn.c, lease);
      if (cs != KVTIER_OK) return Fail("import: " + err + " (" + std::to_string(stored) + " blocks stored)");
      prog.Update(stored, records);
    }
  }
  if (args->Has("json")) {
    std::printf("%s\n", json{{"file", path}, {"contract", ContractIdHex(id)}, {"records", records}, {"stored", stored}}
                            .dump(2)
                            .c_str());
  } else {
    std::printf("imported %" PRIu64 " blocks of contract %s from %s\n", stored, ContractIdHex(id).c_str(), path.c_str());
  }
  return 0;
}

cli::CommandRegistrar r1("stats", "per-tier statistics of the running daemon",
                         [](const std::vector<std::string>& a) { return RunStatsOrTiers(a, true); });
cli::CommandRegistrar r2("tiers", "one line per tier of the running daemon",
                         [](const std::vector<std::string>& a) { return RunStatsOrTiers(a, false); });
cli::CommandRegistrar r3("contracts", "registered contracts and their blocks per tier", RunContracts);
cli::CommandRegistrar r4("ls", "list indexed blocks [--contract ID] [--tier T]", RunLs);
cli::CommandRegistrar r5("inspect", "one block: contract, tiers, size, checksums, parent, hits", RunInspect);
cli::CommandRegistrar r6("verify", "re-read and check every NVMe record", RunVerify);
cli::CommandRegistrar r7("evict", "evict one block (KEY) or a whole contract (--contract ID)", RunEvict);
cli::CommandRegistrar r8("flush", "demote everything unpinned from HBM and host to NVMe", RunFlush);
cli::CommandRegistrar r9("config", "config check PATH | config reload", RunConfig, "", {"check", "reload"});
cli::CommandRegistrar r10("export", "export a contract's blocks to a .kvt file", RunExport);
cli::CommandRegistrar r11("import", "import a .kvt file into the daemon (verified first)", RunImport);

}  // namespace
}  // namespace kvtier
