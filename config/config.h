// kvtierd configuration: the TOML schema, its defaults, and validation.
//
// A config is a TOML file (see config/kvtier.toml, which documents every key) plus
// command-line overrides `--set section.key=value`. Loading is all-or-nothing: the first
// problem becomes one line naming the key ("tiers.host.capacity: bad size \"4GiX\" ...")
// and nothing is started. Unknown keys are errors (a typo must not silently fall back to
// a default).
//
// This library knows nothing about tiers/ or daemon/ (DESIGN.md section 2: config
// depends on toml++ only). Enumerations are kept as the strings the file uses, already
// checked against their allowed sets; the daemon maps them onto tiers::TierManagerOptions.
//
// Relative paths are resolved against the working directory at start.
// Exceptions: toml++ throws on malformed TOML; Load* catches it and returns Invalid. No
// exception leaves this library.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "formats/size.h"
#include "formats/status.h"
#include "tiers/policy/policy_options.h"  // header-only: the policy names and knobs

namespace kvtier::config {

struct TierConfig {
  uint64_t capacity_bytes = 0;     // 0 disables the tier. Default: per tier (see below)
  std::string policy = "lru";      // a name of tiers::kPolicyNames (lru, s3fifo, prefix-lru,
                                   // sieve, arc, reuse, tinylfu). Default: "lru"
  double high_watermark = 0.95;    // start evicting above this fill, in (0, 1]. Default: 0.95
  double low_watermark = 0.85;     // evict down to this fill, below high. Default: 0.85
  std::string on_evict = "demote";  // demote | drop. Default: "demote"
};

struct NvmeConfig {
  TierConfig tier;                        // capacity Default: 2GiB; on_evict always drop
  std::string dir = "./kvtier-data/nvme";  // data files and index. Default: ./kvtier-data/nvme
  std::string admission = "always";       // always | second-hit | reuse. Default: "always"
  uint64_t daily_write_budget_bytes = 0;  // 0 = unlimited. Default: 0
  // Share of daily_write_budget the blocks one user's clients (by peer uid) committed
  // may spend, in (0, 1]. Default: 0.5
  double daily_write_budget_per_client = 0.5;
  uint32_t queue_depth = 64;              // io_uring depth, [1, 4096]. Default: 64
  bool verify_on_restart = true;          // verify blocks before first serve. Default: true
  // With several slot classes: the NVMe tier's records (4 KiB + a class) are cut in slabs
  // of this size, a 4 KiB multiple (docs/tiers.md). Default: 64MiB
  uint64_t slab_bytes = uint64_t{64} << 20;
};

// [tiers.remote]: a Redis Cluster shared by a fleet of daemons (docs/remote.md).
struct RemoteConfig {
  std::vector<std::string> nodes;     // seeds "host:port"; empty = no remote tier. Default: []
  uint32_t connect_timeout_ms = 200;  // [1, 60000]. Default: 200
  uint32_t command_timeout_ms = 500;  // [1, 60000]. Default: 500
  uint32_t pool_size = 4;             // idle connections per node, [1, 256]. Default: 4
  std::string write = "on-demote";    // on-demote | write-through | off. Default: "on-demote"
  bool compress = true;               // zstd a value when it saves >= 1/8. Default: true
  // Authentication and TLS (docs/remote.md). The password is read from password_file at
  // start (one line; a file others can read or write is refused), never from the config.
  std::string user;                   // Redis ACL user; "" = the default user. Default: ""
  std::string password_file;          // "" = no AUTH. Default: ""
  bool tls = false;                   // TLS to every node. Default: false
  std::string tls_ca_file;            // CA bundle (PEM); "" = the system's. Default: ""
  std::string tls_cert_file;          // client certificate (PEM); "" = none. Default: ""
  std::string tls_key_file;           // its key (PEM, closed to others). Default: ""
  std::string tls_server_name;        // name the certificates carry; "" = the node's host. Default: ""
  bool tls_verify = true;             // verify chain and name. Default: true
  // Before every key: <key_prefix>[<namespace>:]{<contract>:<key>}; printable ASCII, no
  // spaces or braces, at most 64 bytes. Default: "kvt:"
  std::string key_prefix = "kvt:";
};

// The blocks of common models at 16-token NVFP4 blocks, 8 KV heads x head_dim 128 (18 KiB
// a layer): 8 layers (small test models; Llama-3.2-1B's 16 layers of head_dim 64), 32
// (Llama-3-8B, Mistral-7B), 40 (Mistral-Nemo-12B). With the default slot_bytes (80 layers,
// Llama-3-70B) they are the "auto" slot classes; every one divides a 2880 KiB slab.
inline constexpr uint64_t kCommonBlockBytes[] = {144ull << 10, 576ull << 10, 720ull << 10};
// "auto" slab: the classes' least common multiple, at most this.
inline constexpr uint64_t kMaxAutoSlabBytes = 64ull << 20;

struct TiersConfig {
  uint64_t slot_bytes = 1474560;  // one block; multiple of 4096. Default: 1440KiB
                                  // (80 layers x 8 heads x 128 dim x 16 tokens NVFP4)
  // tiers.on_conflict: a commit of a cached key with other bytes: keep-first (the cached
  // block stays) | replace (the new bytes replace it) | drop-disputed (both go); a pinned
  // or moving block always stays. Default: "keep-first"
  std::string on_conflict = "keep-first";
  // tiers.slot_classes: the slot sizes (at most 4, 4 KiB multiples, the largest equal to
  // slot_bytes); a contract's blocks take the smallest that holds them, and the classes
  // share each tier's slabs by demand (docs/tiers.md). Empty with slot_classes_auto false:
  // one class of slot_bytes. Default: "auto" (slot_classes_auto; SlotClasses() resolves it)
  std::vector<uint64_t> slot_classes;
  bool slot_classes_auto = true;  // tiers.slot_classes = "auto". Default: true
  // tiers.slot_classes = "per-contract": each tier makes a contract's slot size when it
  // registers (its block rounded up to the tier's granule, which the tier's capacity alone
  // fixes at start; docs/tiers.md "Classes made at registration"), and slot_bytes is the
  // largest block a contract may have (a 4 KiB multiple up to 4GiB). slab_bytes and
  // tiers.nvme.slab_bytes are not used: the slabs follow the capacities. Default: false
  bool slot_classes_per_contract = false;
  // tiers.slab_bytes: with several classes, the tiers are cut into slabs of this size, each
  // holding slots of one class; a 4 KiB multiple in [slot_bytes, 1GiB]; 0 ("auto"): the
  // least common multiple of the classes, or 64 MiB when that is larger (SlabBytes()).
  // Default: 0 (auto)
  uint64_t slab_bytes = 0;
  // The classes the tiers get: the explicit list, or for "auto" slot_bytes and each of
  // kCommonBlockBytes below it, when the host tier holds one slab of them (else one
  // class). Empty: one class of slot_bytes.
  std::vector<uint64_t> SlotClasses() const;
  // The slab size for SlotClasses(): slab_bytes, or its "auto" value.
  uint64_t SlabBytes() const;
  TierConfig hbm;                 // capacity Default: 0 (set it on a GPU machine)
  int32_t cuda_device = 0;        // GPU for the HBM tier, >= 0. Default: 0
  // tiers.hbm.copy: how host -> HBM batches are copied: auto | kernel | batch | loop
  // (docs/tiers.md). Default: "auto"
  std::string hbm_copy = "auto";
  uint32_t hbm_copy_streams = 1;  // tiers.hbm.copy_streams: copy-engine streams, [1, 8]. Default: 1
  TierConfig host;                // capacity Default: 1GiB
  // tiers.host.staging_slots_per_client: host slots one client may hold under alloc leases
  // at once (with [[tenants]], and the copies its host acquires hold), the size of its
  // private staging area (daemon/staging.h); [0, host slots of the smallest class],
  // 0 = daemon.max_tier_share_per_client of the host tier's slots (at least 1), the most
  // its leases may hold anyway. Its memory in use is bounded by its leases (counted in
  // bytes against that share), its freed slots' by staging_bytes_total. Default: 0
  uint32_t host_staging_slots_per_client = 0;
  // tiers.host.staging_bytes_total: the memory every client's staging area may hold at
  // once (slots in use, and freed slots that keep their pages; StagingBudget in
  // daemon/staging.h); past it freed slots' pages are taken back, then staging allocs get
  // Retry. 0 = the host tier's capacity. Needs a restart. Default: 0
  uint64_t host_staging_bytes_total = 0;
  // tiers.host.tenant_parts: with [[tenants]], each tenant's host_share is a part of the
  // host tier of its own (a memfd its clients map read-only: host acquires of blocks in it
  // copy nothing) that no other tenant's blocks use; false: one arena for every tenant and
  // a copy per host acquire (docs/security.md, "Memory isolation"). Needs a restart.
  // Default: true
  bool host_tenant_parts = true;
  NvmeConfig nvme;
  RemoteConfig remote;
  // [tiers.policy]: the eviction policies' knobs, the same for every tier (each field's
  // range and default are in tiers/policy/policy_options.h).
  tiers::PolicyOptions policy;
};

struct DaemonConfig {
  std::string socket = "./kvtier-data/kvtierd.sock";  // control socket. Default: ./kvtier-data/kvtierd.sock
  std::string log_level = "info";        // trace|debug|info|warn|error|critical|off. Default: info
  std::string metrics_address = "127.0.0.1";  // loopback only. Default: 127.0.0.1
  uint32_t metrics_port = 9464;          // Prometheus /metrics; 0 = off. Default: 9464
  // /metrics connections open at once, [1, 1024]; past it a new one is closed at accept.
  // Default: 16
  uint32_t metrics_max_connections = 16;
  // Per-tenant series on /metrics (kvtier_tenant_*: each tenant's blocks, lookups and
  // hits). Any local user can read the port, and one tenant's live hit count tells
  // another which prefixes it caches: only for an operator who keeps the port from the
  // tenants (docs/security.md, "What the metrics port shows"). Default: false
  bool metrics_tenants = false;
  uint32_t ring_entries = 256;           // per ring, power of two in [8, 65536]. Default: 256
  uint64_t ring_data_bytes = 4u << 20;   // per-client data area, 4 KiB multiple. Default: 4MiB
  uint32_t max_clients = 64;             // attached clients at once, [1, 4096]. Default: 64
  uint32_t max_unattached = 64;          // connections not yet attached, [1, 4096]. Default: 64
  // Of them, the most one peer uid (SO_PEERCRED at accept) may hold, [1, 4096]: no user
  // keeps the others from attaching. A uid that may not attach at all holds none (its
  // connection is refused at accept). Default: 8
  uint32_t max_unattached_per_uid = 8;
  uint32_t attach_timeout_ms = 5000;     // accept to attach reply, [1, 600000]. Default: 5000
  // Socket-path replies queued for a client that does not read them, [64KiB, 1GiB];
  // past it the client is disconnected. Default: 64MiB
  uint64_t max_socket_queue_bytes = 64u << 20;
  uint32_t max_keys_per_request = 65536;  // [1, 1048576]. Default: 65536
  uint32_t max_leases_per_client = 65536;  // open leases per client, [1, 1<<24]. Default: 65536
  // Share of each tier's slots (hbm, host) one client may hold under its leases, alloc
  // and acquire together (a slot named twice in one acquire counts once), (0, 1]. Past
  // it an alloc or acquire is Rejected. Default: 0.75
  double max_tier_share_per_client = 0.75;
  // Contracts the clients of one uid may keep registered, counted across their attaches
  // (a repeat counts once), [1, 1<<20]: a contract counts against every uid that
  // registered it until the daemon forgets it. A contract no attached client registered
  // and no block uses is forgotten when its last registrant detaches, or by the sweep
  // (contract_sweep_ms) once its last block is gone. Default: 1024
  uint32_t max_contracts_per_client = 1024;
  // Interval of the sweep that forgets contracts no attached client registered whose
  // blocks are all gone, [100, 86400000] ms. Default: 30000
  uint32_t contract_sweep_ms = 30000;
  // Clients attached at once by one user id / by one process (SO_PEERCRED), [1, 4096].
  // Default: 48 / 16
  uint32_t max_clients_per_uid = 48;
  uint32_t max_clients_per_pid = 16;
  // With [[tenants]]: clients attached at once by the members of one tenant (its uids
  // together, the implicit tenant's too), [1, 4096]: no tenant takes every place of
  // max_clients. Default: 48
  uint32_t max_clients_per_tenant = 48;
  // Asynchronous acquires (kvtier_acquire_async) in flight per client, [1, 1024]; past it,
  // one is answered Rejected. Default: 8
  uint32_t max_async_acquires_per_client = 8;
  uint32_t max_bad_requests = 16;        // corrupt ring requests before disconnect. Default: 16
  uint32_t bad_request_decay_ms = 10000;  // one strike forgiven per interval, [1, 1<<30]. Default: 10000
  uint32_t spin_us = 50;                 // request loop busy-poll before sleeping. Default: 50
  // Ring threads busy-polling at once, over every client, [0, 4096]; the others sleep at
  // once (a request wakes them). Bounds the CPU that requests trickled over many
  // sessions can buy. Default: 1
  uint32_t max_spinning_rings = 1;
  // How far above the daemon's nice value a client's big acquires and releases run (past
  // their first 1024 keys, each client's on a thread of its own), [0, 19]; 0: on the
  // client's ring thread at the daemon's priority. For clients attaching after a reload.
  // Default: 10
  uint32_t bulk_nice = 10;
  bool trace_copies = false;             // log large acquires' and HBM copies' timelines. Default: false
};

// [security]: who may attach and who may run operator actions, judged by the peer's
// credentials (SO_PEERCRED, SO_PEERGROUPS) as the kernel recorded them at connect.
// The daemon's own uid and root may always attach and administer, and the daemon's group
// may attach (what the default socket mode 0660 lets in): the defaults keep a single-user
// machine, and the packaged service's kvtier group, working with no extra steps
// (docs/security.md).
struct SecurityConfig {
  // Owner and group given to the control socket at start: a user / group name or a
  // number; "" leaves what the daemon creates it with. Default: "", ""
  std::string socket_owner;
  std::string socket_group;
  // Mode of the control socket: TOML octal (0o660) or a string ("0660"), at most 0777.
  // Default: 0660
  uint32_t socket_mode = 0660;
  // uids / gids (primary or supplementary) that may attach as engines, beyond the
  // daemon's uid and group, root and the members of every [[tenants]] table. Default: [], []
  std::vector<uint32_t> attach_uids, attach_gids;
  // uids / gids that may run every operator action (list, inspect, contracts, export,
  // verify, evict, flush, config reload) over every tenant, beyond the daemon's uid and
  // root. Default: [], []
  std::vector<uint32_t> admin_uids, admin_gids;
  // What a client that matches no [[tenants]] table is: "default" (the implicit tenant,
  // the namespace every client shares when no tenant is configured) | "refuse" (its
  // attach is refused). Default: "default"
  std::string unmatched = "default";
};

// One [[tenants]] table: a namespace of blocks and a guaranteed share of each tier.
struct TenantConfig {
  std::string name;            // [A-Za-z0-9._-]{1,64}, unique, not "default" or "shared"
  std::vector<uint32_t> uids;  // peers with one of these uids belong here (checked first)
  std::vector<uint32_t> gids;  // else peers with one of these gids (primary or supplementary)
  // Share of each tier's slots, in [0, 1], that other tenants' blocks cannot push this
  // tenant's blocks below; past it, the tenant's own blocks are evicted first. The shares
  // of a tier add up to at most 1. Default: 0 (no guarantee)
  double hbm_share = 0, host_share = 0, nvme_share = 0;
  // Members may run the operator actions that stay inside the tenant's namespace (list,
  // inspect, contracts, export, evict); never flush, verify or config reload. Default: false
  bool admin = false;
};

struct Config {
  DaemonConfig daemon;
  TiersConfig tiers;
  SecurityConfig security;
  std::vector<TenantConfig> tenants;  // [[tenants]]; empty: every client in one namespace
  std::string source;  // file the config came from ("<string>" for LoadString)

  Config();  // the built-in defaults (host 1GiB, nvme 2GiB, hbm 0)

  // Pure checks of every value (ranges, sets, watermark order, sizes vs slot size).
  // Invalid, with the message starting with the key.
  Status Validate() const;
  // Checks the folders against the file system: the NVMe folder and the socket's folder
  // must exist and be writable, or be creatable under a writable parent.
  Status CheckPaths() const;
};

// One "--set section.key=value" override. The value is read as a TOML value when it
// parses as one (numbers, booleans, quoted strings), else taken as a bare string.
struct Override {
  std::string key;    // "tiers.host.capacity"
  std::string value;  // "4GiB"
};
// Splits "section.key=value". Invalid when there is no '=' or the key is empty.
StatusOr<Override> ParseOverride(std::string_view arg);

// Parses TOML text, applies the overrides, validates (not CheckPaths). `source` names
// the text in messages (a file path).
StatusOr<Config> LoadString(std::string_view toml_text, const std::vector<Override>& overrides,
                            const std::string& source = "<string>");
StatusOr<Config> LoadFile(const std::string& path, const std::vector<Override>& overrides);

// Sizes ("4GiB", "4G", 4096) use the one grammar of formats/size.h, re-exported here.
using ::kvtier::FormatSize;
using ::kvtier::ParseSize;

// Every key of the schema, dotted ("daemon.socket", ...), in file order.
std::vector<std::string> SchemaKeys();

}  // namespace kvtier::config
