// The client/daemon wire protocol: control-socket frames, the per-client ring region in
// shared memory, and the request/completion entries that travel through it.
//
// Both daemon/ and client/ include this header and nothing of each other (DESIGN.md
// section 2). It is a byte format like the others in formats/: fixed-size, little-endian
// structs with a static_assert on every size, plus the validation the daemon runs on
// every field it reads from a client. Nothing here does I/O; the ring helpers only touch
// memory the caller has mapped.
//
// ---- Control socket (unix stream socket) -------------------------------------------
// Every message is a 16-byte ControlHeader followed by `length` payload bytes.
//   client -> daemon  kAttach        AttachRequest
//   daemon -> client  kAttachReply   AttachReply, with SCM_RIGHTS fds:
//                                     [0] ring region memfd, [1] host arena memfd (when
//                                     the daemon has a host tier, flag kReplyHasHost;
//                                     sealed: it maps read-only), [2] the client's
//                                     staging area memfd (kReplyHasStaging, protocol 5).
//                                     With kReplyHostPrivate (tenants configured) no
//                                     arena fd: [1] is the staging area; with
//                                     kReplyHostParts (protocol 6) [1..n] are the host
//                                     parts the client maps and the staging area follows
//   client -> daemon  kRequest       RequestEntry + in_len bytes of input (the socket
//                                     path: the same operations as the ring, for tools
//                                     and as the benchmark baseline; in_off is ignored)
//   daemon -> client  kCompletion    CompletionEntry + out_bytes bytes of output
//   daemon -> client  kGoodbye       the reason, as text (up to kMaxGoodbyeBytes), sent
//                                     just before the daemon closes a client's socket
//                                     (a ring it cannot read, too many corrupt requests);
//                                     the client shows it in the error of its next call
// The first message must be kAttach. It names the range of versions the client speaks,
// [min_protocol_version, protocol_version] (min 0: protocol_version alone); the daemon
// answers with the highest version both speak (NegotiateProtocol: it serves every
// version from kMinProtocolVersion to kProtocolVersion) in AttachReply.protocol_version,
// the ring region's header and every later control header, or with status Unsupported
// when the ranges do not meet, and closes the socket. The socket
// stays open for the life of the client: when it closes (crash included) the daemon
// releases every lease the client held.
//
// ---- Ring region (one memfd per client, created, sized and sealed by the daemon) ----
//   [0, 4096)            RingRegionHeader (read-only for the client by convention)
//   [req_offset, ...)    RingControl + entries x RequestEntry     (client -> daemon)
//   [cmp_offset, ...)    RingControl + entries x CompletionEntry  (daemon -> client)
//   [data_offset, +data_bytes)  data area: variable-length inputs and outputs,
//                        referenced from entries by (offset, length) relative to
//                        data_offset; the client chooses where, the daemon bounds-checks.
// Both rings are single-producer single-consumer, lock-free, bounded (a power of two
// entries), with producer and consumer indices on separate cache lines. Indices are
// free-running u32 counters; slot = index & (entries - 1).
//
// Wake-up: a consumer that finds its ring empty spins briefly, then sets `sleeping`,
// re-checks, and futex-waits on `tail` (a shared futex: the mapping is MAP_SHARED). A
// producer publishes `tail` and then reads `sleeping`; when set it futex-wakes `tail`.
// Both sides use sequentially consistent operations on these two words, so either the
// producer sees the flag or the consumer sees the new tail (no lost wake-up). While it
// spins, a consumer publishes its CPU (`consumer_cpu`) and reads its peer's from the other
// ring: it calls sched_yield (every 64 polls) only when both last ran on the same CPU,
// where spinning would keep the peer from running. Elsewhere it never yields: a yield
// hands the CPU to any runnable task (another process's build) for a whole CFS slice,
// which is milliseconds of latency for a request that needed microseconds.
//
// The daemon never trusts the region: it copies an entry out of the ring before
// checking it, copies input bytes out of the data area before using them, and refuses
// indices that claim more than `entries` outstanding requests (the client is then
// disconnected, since its ring can no longer be read).
//
// When you change any struct here, bump kProtocolVersion.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "formats/keys.h"
#include "formats/status.h"
#include "formats/tier_stats_fields.h"

namespace kvtier::wire {

// 2: WireSlot.from_tier (was reserved[0]): acquire says where each block was.
// 3: WireTierStats.errors and write_errors (the remote tier's), 168 bytes (was 152).
// 5: the host arena maps read-only; AttachReply.staging_slots and fd [2], the client's
//    staging area (kReplyHasStaging), where host alloc slots live (see AttachReply); a
//    commit's completion counts the keys already cached (CompletionEntry.cached_*); the
//    attach reply is followed by a SlotClassTable (the host tier's granule and slot
//    classes); the register completion says the contract's slot class (count) and fill
//    (est_seconds).
// 6: with tenants, the attach reply may pass the client's tenant's part of the host arena
//    (kReplyHostParts: a HostPartTable after the SlotClassTable, its fds before the
//    staging area's); host acquires of blocks in it answer arena ids, not copies. A
//    protocol-5 client of such a daemon gets no part, and copies as before.
// 7: WireTierStats.slab_moves (bytes 4-7, reserved and 0 before; a client of protocol 6
//    or older gets 0 there); the attach reply ends with the HBM tier's HbmGeometry (after
//    the SlotClassTable and any HostPartTable; HBM slot s at s * granule, slots of the
//    host's classes). A client of protocol 6 or older, which would address HBM slot s at
//    s * slot_bytes, gets no HBM IPC handle and no HBM leases from a daemon whose HBM tier
//    has several classes.
// 8: a commit's completion also counts, of cached_different, the keys whose committed
//    bytes replaced the cached block (cached_replaced, tiers.on_conflict = replace) and the
//    keys that were disputed and not yet gone (cached_disputed, drop-disputed: nothing
//    stored, nothing served). Both are in cached_different too, so that a client of
//    protocol 7 or older is told its bytes were not the ones stored.
// 9: slot sizes made per contract (tiers.slot_classes = "per-contract"): the attach
//    reply's SlotClassTable and HbmGeometry say so (kSlotClassesPerContract, no classes
//    listed: the tiers make them as contracts register), staging_slots then counts the
//    staging area's granules, and the register completion gives the contract's slot in
//    each tier (CompletionEntry.cached_same / cached_different, in granules). Such a
//    daemon refuses the attach of a client of protocol 8 or older (Unsupported, naming
//    the protocol), which would address slots by a table of classes fixed at attach.
inline constexpr uint32_t kProtocolVersion = 9;
// The oldest client protocol this daemon still serves: a newer daemon serves older
// clients within one major version. 3, since a version-2 client would misread the
// version-3 stats record. Version 4 adds Op::kAcquireAsync; a version-3 client never
// sends it, and a library that negotiated 3 answers its asynchronous acquire with
// Unsupported. A client of protocol 3 or 4 maps the host arena writable, which the
// sealed arena refuses: the daemon sends it no host arena, and answers its host alloc and
// acquire with Unsupported (HBM, lookup and the rest serve it as before).
inline constexpr uint32_t kMinProtocolVersion = 3;
inline constexpr uint32_t kControlMagic = 0x5754564Bu;  // "KVTW" as u32 LE
inline constexpr uint32_t kRingMagic = 0x5254564Bu + 1;  // "LVTR": differs from records
inline constexpr size_t kCacheLine = 64;
inline constexpr size_t kRingHeaderBytes = 4096;
inline constexpr uint32_t kMaxControlPayload = 16u << 20;  // 16 MiB per socket message
inline constexpr uint32_t kMinRingEntries = 8;
inline constexpr uint32_t kMaxRingEntries = 65536;

// ---- Control socket ----------------------------------------------------------------

enum class ControlType : uint16_t {
  kAttach = 1,
  kAttachReply = 2,
  kRequest = 3,
  kCompletion = 4,
  kGoodbye = 5,
};
inline constexpr uint32_t kMaxGoodbyeBytes = 1024;

struct ControlHeader {
  uint32_t magic = kControlMagic;
  uint16_t version = kProtocolVersion;  // protocol version of the sender
  uint16_t type = 0;                    // ControlType
  uint32_t length = 0;                  // payload bytes that follow, <= kMaxControlPayload
  uint32_t reserved = 0;                // must be 0
};
static_assert(sizeof(ControlHeader) == 16);

inline constexpr uint32_t kAttachHasGpu = 1u << 0;  // client can map HBM (CUDA IPC)

struct AttachRequest {
  uint32_t protocol_version = kProtocolVersion;  // the newest version the client speaks
  uint32_t flags = 0;   // kAttach* bits; others must be 0
  uint32_t pid = 0;     // informational (logs, metrics)
  uint32_t min_protocol_version = kMinProtocolVersion;  // the oldest it speaks; 0: protocol_version
  char name[48] = {};   // informational client name, NUL-padded
};
static_assert(sizeof(AttachRequest) == 64);

inline constexpr uint32_t kReplyHasHbm = 1u << 0;  // hbm_ipc_handle is set (GPU clients only)
inline constexpr uint32_t kReplyHasHost = 1u << 1;
inline constexpr uint32_t kReplyHasNvme = 1u << 2;
inline constexpr uint32_t kReplyHasStaging = 1u << 3;  // protocol 5: fd [2], staging_slots
// Protocol 5, with kReplyHasHost and kReplyHasStaging: the client gets no host arena fd
// (the daemon has [[tenants]]: an arena mapping would show every tenant's blocks). Its
// window keeps the layout (arena ids below host_arena_bytes / slot_bytes, unmapped), and
// a host acquire's slots are copies in its staging area. fds: [0] ring, [1] staging.
inline constexpr uint32_t kReplyHostPrivate = 1u << 4;
// Protocol 6, with kReplyHostPrivate: the reply's payload is AttachReply + SlotClassTable +
// HostPartTable, and fds [1..count] are the parts it lists (sealed memfds: they map
// read-only), each to be mapped at its offset in the window's arena part; the staging
// area is fd [count + 1]. The rest of the arena stays unmapped. A host acquire answers the
// arena id of a block in a mapped part (no copy), a staging id (a copy) otherwise.
inline constexpr uint32_t kReplyHostParts = 1u << 5;

struct AttachReply {
  int32_t status = 0;                 // StatusCode; non-zero: message says why, no fds
  uint32_t protocol_version = kProtocolVersion;
  uint64_t client_id = 0;             // daemon-assigned, unique for the daemon's life
  uint64_t slot_bytes = 0;            // bytes of one slot in every tier
  uint64_t host_arena_bytes = 0;      // size of the host arena memfd (0: no host tier)
  uint64_t ring_bytes = 0;            // size of the ring region memfd
  uint32_t flags = 0;                 // kReplyHas* bits
  uint32_t num_fds = 0;               // fds passed with this message (SCM_RIGHTS)
  uint32_t max_keys_per_request = 0;  // daemon limit on count for key operations
  // Protocol 5 (kReplyHasStaging): slots of this client's staging area, fd [2], of
  // staging_slots * slot_bytes bytes (protocol 9 with kSlotClassesPerContract: of
  // staging_slots * the host granule bytes, a staging slot as long as its contract's). The client maps the arena read-only and the staging
  // area writable right after it: staging slot i is host slot id host_arena_bytes /
  // slot_bytes + i. Host alloc leases hand out staging ids; acquire leases arena ids (with
  // kReplyHostPrivate: staging ids too, each slot a copy of the block).
  uint32_t staging_slots = 0;
  uint8_t hbm_ipc_handle[64] = {};    // cudaIpcMemHandle_t of the HBM arena (kReplyHasHbm: only to a
                                      // client that attached with kAttachHasGpu)
  char message[128] = {};             // NUL-terminated error text when status != 0
};
static_assert(sizeof(AttachReply) == 248);

// Protocol 5: the attach reply's payload is AttachReply + SlotClassTable (length
// sizeof both). Host slot s is at arena offset s * granule whatever its class; its size is
// the class of the contract whose block it holds (the register completion names it).
// Classes are listed smallest first (tiers/slab_allocator.h).
// Protocol 9, flags kSlotClassesPerContract: the tier makes a class per contract as it
// registers (its block rounded up to the granule); count is 0 and class_bytes empty, and
// the register completion gives each contract's slot bytes. The granule is then the
// smallest slot.
inline constexpr uint32_t kMaxWireSlotClasses = 4;
inline constexpr uint32_t kSlotClassesPerContract = 1u << 0;
struct SlotClassTable {
  uint32_t count = 0;       // classes, 1..kMaxWireSlotClasses (0: no host tier, or per contract)
  uint32_t flags = 0;       // protocol 9: kSlotClassesPerContract; 0 before (reserved)
  uint64_t granule = 0;     // host slot s at s * granule; a 4 KiB multiple
  uint64_t slab_bytes = 0;  // the arena's slabs (informational)
  uint64_t class_bytes[kMaxWireSlotClasses] = {};  // slot bytes of each class
};
static_assert(sizeof(SlotClassTable) == 56);

// Protocol 6 (kReplyHostParts): the parts of the host arena this client maps: its tenant's
// (tiers/host/host_pool.h, "Parts"). Offsets and sizes are granule multiples inside
// [0, host_arena_bytes); parts do not overlap.
inline constexpr uint32_t kMaxWireHostParts = 2;
struct HostPartTable {
  uint32_t count = 0;  // 1..kMaxWireHostParts
  uint32_t reserved = 0;
  struct Part {
    uint64_t offset = 0;  // bytes into the arena (host slot offset / granule = slot id)
    uint64_t bytes = 0;   // the part's memfd size
  } parts[kMaxWireHostParts];
};
static_assert(sizeof(HostPartTable) == 40);

// Protocol 7: after the SlotClassTable (and the HostPartTable), the HBM tier's slots (count 0: no HBM tier). HBM
// slot s (a block-table entry of the decode kernels) is at arena offset s * granule
// whatever its class; the kernels' pool stride (kvt_pool.slot_bytes) is the granule.
struct HbmGeometry {
  SlotClassTable classes;
  uint64_t arena_bytes = 0;  // bytes of the HBM arena's slabs (every slot lies below)
};
static_assert(sizeof(HbmGeometry) == 64);

// ---- Ring region ---------------------------------------------------------------------

struct RingRegionHeader {
  uint32_t magic = kRingMagic;
  uint32_t version = kProtocolVersion;
  uint32_t entries = 0;      // entries per ring (power of two)
  uint32_t reserved = 0;
  uint64_t req_offset = 0;   // RingControl of the request ring, then its entries
  uint64_t cmp_offset = 0;   // RingControl of the completion ring, then its entries
  uint64_t data_offset = 0;  // data area
  uint64_t data_bytes = 0;
  uint64_t total_bytes = 0;  // size of the region (== memfd size)
};
static_assert(sizeof(RingRegionHeader) == 56);

// Indices and the sleep flag of one ring; each on its own cache line so the producer's
// and consumer's writes do not share a line.
struct alignas(kCacheLine) RingControl {
  alignas(kCacheLine) uint32_t tail;      // producer: next index to write (futex word)
  alignas(kCacheLine) uint32_t head;      // consumer: next index to read
  alignas(kCacheLine) uint32_t sleeping;  // consumer: 1 while (about to be) futex-waiting
  // Consumer: 1 + the CPU it last spun on (0 = unknown; a hint, never trusted). The other
  // side, spinning for its own ring, yields its CPU now and then only when the peer it is
  // waiting for last ran on that same CPU (see "Wake-up" above). In padding that protocol
  // 1 left zero: a peer that never writes it reads as unknown.
  uint32_t consumer_cpu;
};
static_assert(sizeof(RingControl) == 3 * kCacheLine);

enum class Op : uint16_t {
  kLookup = 1,            // in: count keys. out: count tier bytes. -> count = hit blocks
  kAcquire = 2,           // in: count keys; tier = target. out: count WireSlot -> lease
  kAlloc = 3,             // count = n; tier = target. out: n WireSlot -> lease
  kCommit = 4,            // lease_id; in: count CommitItem -> count = committed
  kRelease = 5,           // lease_id
  kPrefetch = 6,          // in: count keys; tier = target
  kStats = 7,             // out: up to count WireTierStats -> count = tiers written
  kRegisterContract = 8,  // in: in_len bytes of canonical contract -> value = contract id;
                          // protocol 5: count = its host slot class, est_seconds = its fill;
                          // protocol 9: cached_same = its host slot, cached_different its
                          // HBM slot (0: no HBM tier), each in granules of its tier
  kNop = 9,               // nothing; for round-trip measurements
  kAdmin = 10,            // in: one AdminRequest (count 0). out: by action (see AdminAction)
  // in: AcquireAsyncHeader, then count keys; tier = target. out: AcquireProgress, then
  // count WireSlot. The daemon acquires the keys in steps of chunk_blocks and, as the
  // leading steps finish, writes their slots and then (release) AcquireProgress.ready,
  // so the client uses the first blocks while the rest are still moving. The completion
  // is the blocking acquire's: value = lease, count = slots (protocol 4).
  kAcquireAsync = 11,
};
inline constexpr uint16_t kMaxOp = 11;

// Input header of Op::kAcquireAsync.
struct AcquireAsyncHeader {
  uint32_t chunk_blocks = 0;  // blocks per readiness step; 0: kDefaultAcquireChunk
  uint32_t reserved = 0;      // must be 0
};
static_assert(sizeof(AcquireAsyncHeader) == 8);
inline constexpr uint32_t kDefaultAcquireChunk = 16;

// Output header of Op::kAcquireAsync, in the request's out region. `ready` only grows:
// the WireSlots before it are final. `done` is 1 once no more will become ready (the
// completion follows). Read both with acquire loads (std::atomic_ref). `events` is
// bumped (release) after every change of `ready` or `done`, and the daemon then wakes
// it as a shared futex word (formats/ring_wait.h FutexWake), so that a client sleeps on
// it (FUTEX_WAIT with the value it last read) instead of polling. A daemon before this
// field left it 0: a client's bounded futex sleep then times out and it polls.
struct AcquireProgress {
  uint32_t ready = 0;
  uint32_t done = 0;
  uint32_t events = 0;
  uint32_t reserved = 0;
};
static_assert(sizeof(AcquireProgress) == 16);

inline const char* OpName(uint16_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kLookup: return "lookup";
    case Op::kAcquire: return "acquire";
    case Op::kAlloc: return "alloc";
    case Op::kCommit: return "commit";
    case Op::kRelease: return "release";
    case Op::kPrefetch: return "prefetch";
    case Op::kStats: return "stats";
    case Op::kRegisterContract: return "register_contract";
    case Op::kNop: return "nop";
    case Op::kAdmin: return "admin";
    case Op::kAcquireAsync: return "acquire_async";
  }
  return "unknown";
}

// Tier numbers on the wire (equal to tiers::Tier).
inline constexpr uint8_t kTierHbm = 0, kTierHost = 1, kTierNvme = 2, kTierRemote = 3,
                         kTierNone = 255;

// RequestEntry.flags. kRequestShared (kRegisterContract only): register the contract in
// the shared namespace (docs/security.md); the completion's value is the contract's
// shared handle (SharedContractId, formats/contract.h), the id the client then names it by.
inline constexpr uint8_t kRequestShared = 1u << 0;

struct RequestEntry {
  uint64_t tag = 0;          // client cookie, echoed in the completion
  uint16_t op = 0;           // Op
  uint8_t tier = 0;          // target tier (acquire, alloc, prefetch): kTierHbm or kTierHost
  uint8_t flags = 0;         // kRequestShared on kRegisterContract; else 0
  uint32_t count = 0;        // keys / slots / items; see Op
  uint64_t contract_id = 0;  // lookup, acquire, alloc, commit, prefetch
  uint64_t lease_id = 0;     // commit, release
  uint32_t in_off = 0;       // input bytes in the data area (8-byte aligned)
  uint32_t in_len = 0;
  uint32_t out_off = 0;      // output room in the data area (8-byte aligned)
  uint32_t out_len = 0;
  uint8_t reserved[16] = {};  // must be 0
};
static_assert(sizeof(RequestEntry) == 64);

struct CompletionEntry {
  uint64_t tag = 0;          // the request's tag (0 for requests unreadable enough to have none)
  uint16_t op = 0;           // the request's op
  uint16_t msg_len = 0;      // error text bytes written at the start of the out region
  int32_t status = 0;        // StatusCode
  uint64_t value = 0;        // lease id (acquire, alloc) or contract id (register)
  uint32_t count = 0;        // see Op
  uint32_t out_bytes = 0;    // bytes written to the out region
  double est_seconds = 0.0;  // lookup: estimated time to bring the hits to HBM
  // Commit (protocol 5): of the `count` items that went through, the keys that were
  // already cached with equal bytes, with different bytes (tiers.on_conflict decided),
  // and cached where the bytes are not compared (HBM); the rest were stored. Zero from
  // an older daemon (in its reserved bytes).
  uint32_t cached_same = 0;
  uint32_t cached_different = 0;
  uint32_t cached_unchecked = 0;
  // Commit (protocol 8): of cached_different, the keys whose bytes replaced the cached
  // block, and the keys disputed and not yet gone (drop-disputed: not stored). Zero from
  // an older daemon.
  uint32_t cached_replaced = 0;
  uint32_t cached_disputed = 0;
  uint8_t reserved[4] = {};
};
static_assert(sizeof(CompletionEntry) == 64);

// One slot, as acquire and alloc return it. from_tier (acquire): the tier the block was in
// when the acquire began (what the acquire promoted it from; remote for a block it fetched
// from the remote tier); alloc: kTierNone.
struct WireSlot {
  uint8_t tier = kTierNone;
  uint8_t from_tier = kTierNone;
  uint8_t reserved[2] = {};
  uint32_t slot = 0;
};
static_assert(sizeof(WireSlot) == 8);

// A key on the wire: the Key128 words, native (little-endian) order.
struct WireKey {
  uint64_t hi = 0;
  uint64_t lo = 0;
};
static_assert(sizeof(WireKey) == 16 && sizeof(Key128) == 16);

// One commit: an allocated slot of the request's lease and the key it now holds.
struct CommitItem {
  uint32_t slot = 0;
  uint8_t tier = kTierNone;
  uint8_t reserved[3] = {};  // must be 0
  WireKey key;
  WireKey parent;            // all zero for the first block of a chain
};
static_assert(sizeof(CommitItem) == 40);

// One tier's statistics on the wire: the tier and present bytes, slab_moves, then the
// counters of the one field list (formats/tier_stats_fields.h), in its order. The C ABI's
// kvtier_tier_stats is generated from the same list with the same layout; the client
// copies field by field. The daemon fills it from tiers::TierStats (daemon/stats_record.h).
struct WireTierStats {
  uint8_t tier = 0;
  uint8_t present = 0;       // 1: the tier is configured and running
  uint8_t reserved[2] = {};  // 0
  uint32_t slab_moves = 0;   // 0 from a daemon of protocol 6 or older
#define KVTIER_WIRE_STATS_MEMBER_(type, name) type name = 0;
  KVTIER_TIER_STATS_FIELDS(KVTIER_WIRE_STATS_MEMBER_)
#undef KVTIER_WIRE_STATS_MEMBER_
};
static_assert(sizeof(WireTierStats) == 8 + 20 * 8);

// ---- Operator (admin) requests: Op::kAdmin ------------------------------------------
// kvtierctl's requests. They travel like every other op (ring or socket); the input is
// one AdminRequest whose fields are checked per action (ValidateAdminRequest), and the
// output is action-specific:
//   kListContracts  out: count x (AdminContractInfo + contract bytes, padded to 8);
//                   value = contracts in total. offset/limit page over them.
//   kListBlocks     filter: contract_id (0 = all), tier (kTierNone = all).
//                   out: count x AdminBlockInfo; value = matching blocks in total.
//                   offset/limit page over the (unordered) index; a listing while blocks
//                   come and go may skip or repeat some.
//   kInspect        key (contract_id 0 = any contract). out: one AdminBlockInfo.
//   kVerifyNvme     offset/limit over the NVMe records (record order): re-reads and checks
//                   each. out: one AdminVerifyReport.
//   kEvictKey       key (contract_id 0 = any contract holding it).
//   kEvictContract  contract_id. value = blocks evicted, count = pinned blocks skipped.
//   kFlush          demote everything unpinned from HBM and host to NVMe (blocks the
//                   transport until done: TierManager::Flush). tier = kTierHost: only
//                   HBM is emptied, into host; kTierNvme or kTierNone: down to NVMe.
//   kReloadConfig   re-read the config file, as SIGHUP does. Output: the outcome as text.
//   kTenantStats    per-tenant counters: count x AdminTenantStats, value = tenants in
//                   total (offset/limit page over them). A client that is not an operator
//                   gets its own tenant only.
enum class AdminAction : uint16_t {
  kListContracts = 1,
  kListBlocks = 2,
  kInspect = 3,
  kVerifyNvme = 4,
  kEvictKey = 5,
  kEvictContract = 6,
  kFlush = 7,
  kReloadConfig = 8,
  kTenantStats = 9,
};
inline constexpr uint16_t kMaxAdminAction = 9;
inline constexpr uint32_t kMaxAdminLimit = 65536;  // entries per page

struct AdminRequest {
  uint16_t action = 0;       // AdminAction
  uint8_t tier = kTierNone;  // kListBlocks filter; kTierNone elsewhere
  uint8_t reserved0 = 0;     // must be 0
  uint32_t limit = 0;        // page size (list, verify): [1, kMaxAdminLimit]; else 0
  uint64_t contract_id = 0;  // filter / target; see the action
  uint64_t offset = 0;       // first entry of the page (list, verify); else 0
  WireKey key;               // kInspect, kEvictKey; else zero
  uint8_t reserved[24] = {};  // must be 0
};
static_assert(sizeof(AdminRequest) == 64);

struct AdminContractInfo {
  uint64_t contract_id = 0;
  uint64_t block_bytes = 0;     // bytes of one block of this contract
  uint64_t blocks[3] = {};      // blocks cached per tier (hbm, host, nvme)
  uint32_t contract_bytes = 0;  // canonical serialization bytes that follow
  uint32_t reserved = 0;
};
static_assert(sizeof(AdminContractInfo) == 48);

inline constexpr uint8_t kBlockInHbm = 1u << 0, kBlockInHost = 1u << 1, kBlockInNvme = 1u << 2,
                         kBlockNvmeVerified = 1u << 3;

struct AdminBlockInfo {
  uint64_t contract_id = 0;
  WireKey key;
  WireKey parent;
  uint64_t bytes = 0;          // payload bytes
  uint8_t where = 0;           // kBlockIn* bits
  uint8_t reserved[3] = {};
  uint32_t uses = 0;           // hits since it was indexed (this daemon's life)
  int32_t hbm_slot = -1, host_slot = -1;
  uint32_t pins_hbm = 0, pins_host = 0;
  uint32_t nvme_record = 0;    // kInspect only (with kBlockInNvme)
  uint32_t nvme_hits = 0;      // kInspect only: reads counted by the NVMe index
  uint64_t payload_xxh3 = 0;   // kInspect only: checksums stored in the NVMe record
  uint64_t header_xxh3 = 0;
};
static_assert(sizeof(AdminBlockInfo) == 96);

struct AdminVerifyReport {
  uint64_t total = 0;    // NVMe records in the index
  uint64_t checked = 0;  // read in this call
  uint64_t ok = 0;
  uint64_t corrupt = 0;  // failed a checksum: dropped from the index, counted in stats
  uint64_t missing = 0;  // gone between listing and reading (evicted meanwhile)
  uint64_t io_errors = 0;
};
static_assert(sizeof(AdminVerifyReport) == 48);

// One tenant's counters (kTenantStats). Per local tier (hbm, host, nvme): blocks held,
// share in slots, copies evicted. The daemon's tenant 0 is "default" (the clients no
// [[tenants]] table matches); the last entry is "shared" (the shared namespace).
struct AdminTenantStats {
  char name[64] = {};             // NUL-padded
  uint64_t blocks[3] = {};
  uint64_t quota_slots[3] = {};
  uint64_t evictions[3] = {};
  uint64_t lookup_keys = 0;       // keys its clients looked up
  uint64_t lookup_hits = 0;       // blocks those lookups found
  uint64_t committed = 0;         // blocks its clients committed
  uint64_t access_denied = 0;     // its clients' admin requests refused
};
static_assert(sizeof(AdminTenantStats) == 168);

// Checks an AdminRequest's fields for its action. Ids and keys are checked by the daemon.
inline Status ValidateAdminRequest(const AdminRequest& a) {
  if (a.action == 0 || a.action > kMaxAdminAction) {
    return Status::Invalid("admin action " + std::to_string(a.action) + " unknown");
  }
  if (a.reserved0 != 0) return Status::Invalid("admin reserved bytes must be 0");
  for (uint8_t b : a.reserved) {
    if (b != 0) return Status::Invalid("admin reserved bytes must be 0");
  }
  const auto act = static_cast<AdminAction>(a.action);
  const bool paged = act == AdminAction::kListContracts || act == AdminAction::kListBlocks ||
                     act == AdminAction::kVerifyNvme || act == AdminAction::kTenantStats;
  if (paged) {
    if (a.limit == 0 || a.limit > kMaxAdminLimit) {
      return Status::Invalid("admin limit " + std::to_string(a.limit) + " not in [1, " +
                             std::to_string(kMaxAdminLimit) + "]");
    }
  } else if (a.limit != 0 || a.offset != 0) {
    return Status::Invalid("admin limit and offset must be 0 for this action");
  }
  if (act == AdminAction::kListBlocks) {
    if (a.tier != kTierHbm && a.tier != kTierHost && a.tier != kTierNvme && a.tier != kTierNone) {
      return Status::Invalid("admin tier filter " + std::to_string(a.tier) + " unknown");
    }
  } else if (act == AdminAction::kFlush) {
    if (a.tier != kTierHost && a.tier != kTierNvme && a.tier != kTierNone) {
      return Status::Invalid("admin flush target " + std::to_string(a.tier) + " must be host (1), nvme (2) or 255");
    }
  } else if (a.tier != kTierNone) {
    return Status::Invalid("admin tier must be 255 (none) for this action");
  }
  const bool keyed = act == AdminAction::kInspect || act == AdminAction::kEvictKey;
  const bool zero_key = a.key.hi == 0 && a.key.lo == 0;
  if (keyed && zero_key) return Status::Invalid("key 0 is not a block key");
  if (!keyed && !zero_key) return Status::Invalid("admin key must be 0 for this action");
  if (act == AdminAction::kEvictContract && a.contract_id == 0) {
    return Status::Invalid("contract id 0 is never a contract");
  }
  if ((act == AdminAction::kListContracts || act == AdminAction::kVerifyNvme ||
       act == AdminAction::kFlush || act == AdminAction::kReloadConfig || act == AdminAction::kTenantStats) &&
      a.contract_id != 0) {
    return Status::Invalid("admin contract id must be 0 for this action");
  }
  return Status::Ok();
}

// ---- Layout of a ring region -----------------------------------------------------------

// Computes the region layout for `entries` per ring and `data_bytes` of data area.
// Invalid when entries is not a power of two in [kMinRingEntries, kMaxRingEntries] or
// data_bytes is 0, over 1 GiB or not a multiple of 4096.
inline Status MakeRingLayout(uint32_t entries, uint64_t data_bytes, RingRegionHeader* out) {
  if (entries < kMinRingEntries || entries > kMaxRingEntries || (entries & (entries - 1)) != 0) {
    return Status::Invalid("ring entries " + std::to_string(entries) +
                           " is not a power of two in [8, 65536]");
  }
  if (data_bytes == 0 || data_bytes > (uint64_t{1} << 30) || data_bytes % 4096 != 0) {
    return Status::Invalid("ring data bytes " + std::to_string(data_bytes) +
                           " is not a multiple of 4096 in [4096, 1GiB]");
  }
  auto align = [](uint64_t v) { return (v + 4095) / 4096 * 4096; };
  RingRegionHeader h;
  h.entries = entries;
  h.req_offset = kRingHeaderBytes;
  h.cmp_offset = align(h.req_offset + sizeof(RingControl) + uint64_t{entries} * sizeof(RequestEntry));
  h.data_offset =
      align(h.cmp_offset + sizeof(RingControl) + uint64_t{entries} * sizeof(CompletionEntry));
  h.data_bytes = data_bytes;
  h.total_bytes = h.data_offset + data_bytes;
  *out = h;
  return Status::Ok();
}

// Checks a header read from a mapped region of `mapped_bytes` (the client's check):
// the layout must be exactly what MakeRingLayout computes for its entries and size.
inline Status CheckRingHeader(const RingRegionHeader& h, uint64_t mapped_bytes) {
  if (h.magic != kRingMagic) return Status::Corrupt("ring region magic mismatch");
  if (h.version < kMinProtocolVersion || h.version > kProtocolVersion) {
    return Status::Unsupported("ring region version " + std::to_string(h.version));
  }
  RingRegionHeader expect;
  KVTIER_RETURN_IF_ERROR(MakeRingLayout(h.entries, h.data_bytes, &expect));
  if (h.req_offset != expect.req_offset || h.cmp_offset != expect.cmp_offset ||
      h.data_offset != expect.data_offset || h.total_bytes != expect.total_bytes ||
      h.total_bytes != mapped_bytes) {
    return Status::Corrupt("ring region layout does not match its size");
  }
  return Status::Ok();
}

// ---- Validation (daemon side) ------------------------------------------------------------

struct RequestLimits {
  uint64_t data_bytes = 0;             // size of the data area
  uint32_t max_keys = 65536;           // count limit for key/slot/item operations
  uint32_t max_contract_bytes = 65536;  // limit on a serialized contract
  uint32_t max_stats = 16;             // most WireTierStats a stats request may ask for
};

// Bytes of input `req` must carry, by op and count.
inline uint64_t RequiredInBytes(const RequestEntry& req) {
  switch (static_cast<Op>(req.op)) {
    case Op::kLookup:
    case Op::kAcquire:
    case Op::kPrefetch: return uint64_t{req.count} * sizeof(WireKey);
    case Op::kAcquireAsync: return sizeof(AcquireAsyncHeader) + uint64_t{req.count} * sizeof(WireKey);
    case Op::kCommit: return uint64_t{req.count} * sizeof(CommitItem);
    case Op::kRegisterContract: return req.count;
    case Op::kAdmin: return sizeof(AdminRequest);
    default: return 0;
  }
}
// Minimum output room `req` needs, by op and count.
inline uint64_t RequiredOutBytes(const RequestEntry& req) {
  switch (static_cast<Op>(req.op)) {
    case Op::kLookup: return req.count;  // one tier byte per key
    case Op::kAcquire:
    case Op::kAlloc: return uint64_t{req.count} * sizeof(WireSlot);
    case Op::kAcquireAsync: return sizeof(AcquireProgress) + uint64_t{req.count} * sizeof(WireSlot);
    case Op::kStats: return uint64_t{req.count} * sizeof(WireTierStats);
    default: return 0;
  }
}

namespace internal {
inline Status CheckRequestFields(const RequestEntry& req, const RequestLimits& lim) {
  if (req.op == 0 || req.op > kMaxOp) {
    return Status::Invalid("op " + std::to_string(req.op) + " unknown");
  }
  if ((req.flags & ~(req.op == static_cast<uint16_t>(Op::kRegisterContract) ? kRequestShared : 0)) != 0) {
    return Status::Invalid("flags must be 0");
  }
  for (uint8_t b : req.reserved) {
    if (b != 0) return Status::Invalid("reserved bytes must be 0");
  }
  const Op op = static_cast<Op>(req.op);
  switch (op) {
    case Op::kLookup:
    case Op::kAcquire:
    case Op::kAcquireAsync:
    case Op::kAlloc:
    case Op::kCommit:
    case Op::kPrefetch:
      if (req.count == 0 || req.count > lim.max_keys) {
        return Status::Invalid("count " + std::to_string(req.count) + " not in [1, " +
                               std::to_string(lim.max_keys) + "]");
      }
      break;
    case Op::kStats:
      if (req.count == 0 || req.count > lim.max_stats) {
        return Status::Invalid("stats count " + std::to_string(req.count) + " not in [1, " +
                               std::to_string(lim.max_stats) + "]");
      }
      break;
    case Op::kRegisterContract:
      if (req.count == 0 || req.count > lim.max_contract_bytes) {
        return Status::Invalid("contract length " + std::to_string(req.count) + " not in [1, " +
                               std::to_string(lim.max_contract_bytes) + "]");
      }
      break;
    case Op::kRelease:
    case Op::kNop:
    case Op::kAdmin:
      if (req.count != 0) return Status::Invalid("count must be 0 for " + std::string(OpName(req.op)));
      break;
  }
  if (op == Op::kAcquire || op == Op::kAcquireAsync || op == Op::kAlloc || op == Op::kPrefetch) {
    if (req.tier != kTierHbm && req.tier != kTierHost) {
      return Status::Invalid("target tier " + std::to_string(req.tier) + " is not hbm (0) or host (1)");
    }
  } else if (req.tier != 0) {
    return Status::Invalid("tier must be 0 for " + std::string(OpName(req.op)));
  }
  if (op == Op::kCommit && req.lease_id == 0) return Status::Invalid("lease_id 0 is never a lease");
  return Status::Ok();
}
}  // namespace internal

// Checks every field of a request read from a ring: op known, flags and reserved zero,
// count within limits, in/out regions inside the data area (64-bit arithmetic, no
// overflow) and 8-byte aligned, lengths consistent with count, target tier allowed.
// Returns Invalid with a message naming the field. Contract ids, lease ids and slot
// ids are checked against the daemon's state by the daemon.
inline Status ValidateRingRequest(const RequestEntry& req, const RequestLimits& lim) {
  KVTIER_RETURN_IF_ERROR(internal::CheckRequestFields(req, lim));
  const uint64_t need_in = RequiredInBytes(req);
  const uint64_t need_out = RequiredOutBytes(req);
  if (req.in_len != need_in) {
    return Status::Invalid("in_len " + std::to_string(req.in_len) + " != " +
                           std::to_string(need_in) + " for count " + std::to_string(req.count));
  }
  if (req.out_len < need_out) {
    return Status::Invalid("out_len " + std::to_string(req.out_len) + " < " +
                           std::to_string(need_out) + " needed");
  }
  if (req.in_len > 0 &&
      (req.in_off % 8 != 0 || uint64_t{req.in_off} + req.in_len > lim.data_bytes)) {
    return Status::Invalid("in region [" + std::to_string(req.in_off) + ", +" +
                           std::to_string(req.in_len) + ") outside the data area or unaligned");
  }
  if (req.out_len > 0 &&
      (req.out_off % 8 != 0 || uint64_t{req.out_off} + req.out_len > lim.data_bytes)) {
    return Status::Invalid("out region [" + std::to_string(req.out_off) + ", +" +
                           std::to_string(req.out_len) + ") outside the data area or unaligned");
  }
  return Status::Ok();
}

// The frame of a ring request alone: op known, flags and reserved bytes zero, in_len and
// out_len consistent with count, both regions inside the data area and aligned. A
// request that fails ValidateRingRequest with a sound frame is an ordinary mistake
// (a count over the limit, a tier it may not target, lease 0) and is answered with an
// error; a broken frame means the client's ring or library is corrupt, and the daemon
// counts it against the client (daemon.max_bad_requests).
inline Status CheckRingFrame(const RequestEntry& req, const RequestLimits& lim) {
  if (req.op == 0 || req.op > kMaxOp) return Status::Invalid("op " + std::to_string(req.op) + " unknown");
  if ((req.flags & ~(req.op == static_cast<uint16_t>(Op::kRegisterContract) ? kRequestShared : 0)) != 0) {
    return Status::Invalid("flags must be 0");
  }
  for (uint8_t b : req.reserved) {
    if (b != 0) return Status::Invalid("reserved bytes must be 0");
  }
  if (req.in_len != RequiredInBytes(req)) return Status::Invalid("in_len does not match count");
  if (req.out_len < RequiredOutBytes(req)) return Status::Invalid("out_len too small for count");
  if (req.in_len > 0 && (req.in_off % 8 != 0 || uint64_t{req.in_off} + req.in_len > lim.data_bytes)) {
    return Status::Invalid("in region outside the data area or unaligned");
  }
  if (req.out_len > 0 && (req.out_off % 8 != 0 || uint64_t{req.out_off} + req.out_len > lim.data_bytes)) {
    return Status::Invalid("out region outside the data area or unaligned");
  }
  return Status::Ok();
}

// The same for a socket request, whose input is inline (`inline_in_bytes` of payload
// followed the entry) and whose output is returned inline (out_len bounded by the
// socket message limit); in_off and out_off are ignored there.
inline Status ValidateSocketRequest(const RequestEntry& req, uint64_t inline_in_bytes,
                                    const RequestLimits& lim) {
  KVTIER_RETURN_IF_ERROR(internal::CheckRequestFields(req, lim));
  const uint64_t need_in = RequiredInBytes(req);
  if (req.in_len != need_in || inline_in_bytes != need_in) {
    return Status::Invalid("in_len " + std::to_string(req.in_len) + " / payload " +
                           std::to_string(inline_in_bytes) + " != " + std::to_string(need_in));
  }
  if (req.out_len < RequiredOutBytes(req) ||
      req.out_len > kMaxControlPayload - sizeof(CompletionEntry)) {
    return Status::Invalid("out_len " + std::to_string(req.out_len) + " out of range");
  }
  return Status::Ok();
}

// The version both ends of an attach speak: the highest in the intersection of the
// client's [client_min, client_max] (client_min 0: client_max alone) and this side's
// [kMinProtocolVersion, kProtocolVersion]; 0 when they do not meet.
inline uint32_t NegotiateProtocol(uint32_t client_min, uint32_t client_max) {
  const uint32_t lo = std::max(client_min == 0 ? client_max : client_min, kMinProtocolVersion);
  const uint32_t hi = std::min(client_max, kProtocolVersion);
  return lo <= hi ? hi : 0;
}

// Checks a control header: magic, reserved, type known, length bounded. The version
// is compared by the caller (a wrong version still gets a reply saying so).
inline Status ValidateControlHeader(const ControlHeader& h) {
  if (h.magic != kControlMagic) return Status::Invalid("control message magic mismatch");
  if (h.reserved != 0) return Status::Invalid("control header reserved field not 0");
  if (h.type < static_cast<uint16_t>(ControlType::kAttach) ||
      h.type > static_cast<uint16_t>(ControlType::kGoodbye)) {
    return Status::Invalid("control message type " + std::to_string(h.type) + " unknown");
  }
  if (h.length > kMaxControlPayload) {
    return Status::Invalid("control message length " + std::to_string(h.length) + " over limit");
  }
  return Status::Ok();
}

// Before attach, a kAttach header is read only when its payload is exactly an
// AttachRequest: nothing a stranger declares is allocated.
inline Status CheckAttachHeader(const ControlHeader& h) {
  if (h.length != sizeof(AttachRequest)) {
    return Status::Invalid("attach payload is " + std::to_string(h.length) + " bytes, expected " +
                           std::to_string(sizeof(AttachRequest)));
  }
  return Status::Ok();
}

// Parses an attach: its payload (exactly an AttachRequest), the protocol version both
// ends speak (the header's version must be the request's newest), and its flags (only
// kAttach* bits). On success *out holds the request (its name as sent: up to 48 bytes,
// not NUL-terminated when all are used) and *version the negotiated version.
inline Status ParseAttach(const ControlHeader& h, const uint8_t* payload, size_t n, AttachRequest* out,
                          uint32_t* version) {
  if (n != sizeof(AttachRequest)) {
    return Status::Invalid("attach payload is " + std::to_string(n) + " bytes, expected " +
                           std::to_string(sizeof(AttachRequest)));
  }
  AttachRequest a;
  std::memcpy(&a, payload, sizeof a);
  const uint32_t v = NegotiateProtocol(a.min_protocol_version, a.protocol_version);
  if (h.version != a.protocol_version || v == 0) {
    return Status::Unsupported(
        "protocol version " + std::to_string(a.protocol_version) +
        (a.min_protocol_version ? " (from " + std::to_string(a.min_protocol_version) + ")" : "") + " (header " +
        std::to_string(h.version) + "); this daemon speaks " + std::to_string(kMinProtocolVersion) + " to " +
        std::to_string(kProtocolVersion));
  }
  if ((a.flags & ~kAttachHasGpu) != 0) return Status::Invalid("attach flags/reserved bits unknown");
  *out = a;
  *version = v;
  return Status::Ok();
}

// ---- SPSC ring operations on mapped memory ----------------------------------------------
// `ctl` and `slots` point into the region. Producer-side and consumer-side calls must
// each come from one thread at a time.

template <typename Entry>
class RingView {
 public:
  RingView() = default;
  RingView(RingControl* ctl, Entry* slots, uint32_t entries)
      : ctl_(ctl), slots_(slots), mask_(entries - 1), entries_(entries) {}

  bool valid() const { return ctl_ != nullptr; }
  uint32_t entries() const { return entries_; }
  RingControl* control() const { return ctl_; }

  // Producer: writes one entry; false when the ring is full.
  bool TryPush(const Entry& e) {
    const uint32_t tail = std::atomic_ref<uint32_t>(ctl_->tail).load(std::memory_order_relaxed);
    const uint32_t head = std::atomic_ref<uint32_t>(ctl_->head).load(std::memory_order_acquire);
    if (tail - head >= entries_) return false;
    std::memcpy(&slots_[tail & mask_], &e, sizeof(Entry));
    std::atomic_ref<uint32_t>(ctl_->tail).store(tail + 1, std::memory_order_seq_cst);
    return true;
  }
  // Producer: true when the consumer said it sleeps (then the caller wakes `tail`).
  bool ConsumerSleeping() const {
    return std::atomic_ref<uint32_t>(ctl_->sleeping).load(std::memory_order_seq_cst) != 0;
  }

  // Consumer: number of entries ready. Returns false when the indices are impossible
  // (more outstanding than the ring holds): the peer corrupted them.
  bool Available(uint32_t* n) const {
    const uint32_t tail = std::atomic_ref<uint32_t>(ctl_->tail).load(std::memory_order_acquire);
    const uint32_t head = std::atomic_ref<uint32_t>(ctl_->head).load(std::memory_order_relaxed);
    *n = tail - head;
    return *n <= entries_;
  }
  // Consumer: copies the entry at head out of shared memory and advances head. Call
  // only after Available() reported at least one entry.
  void Pop(Entry* out) {
    const uint32_t head = std::atomic_ref<uint32_t>(ctl_->head).load(std::memory_order_relaxed);
    std::memcpy(out, &slots_[head & mask_], sizeof(Entry));
    std::atomic_ref<uint32_t>(ctl_->head).store(head + 1, std::memory_order_release);
  }
  // Consumer: the sleep protocol's two steps; see the header comment.
  void SetSleeping(bool s) {
    std::atomic_ref<uint32_t>(ctl_->sleeping).store(s ? 1 : 0, std::memory_order_seq_cst);
  }
  uint32_t LoadTail() const {
    return std::atomic_ref<uint32_t>(ctl_->tail).load(std::memory_order_seq_cst);
  }
  uint32_t* tail_word() const { return &ctl_->tail; }
  // Consumer: publishes the CPU it spins on (cpu < 0: unknown). Any side: reads the
  // consumer's last CPU (-1: unknown). Relaxed: a scheduling hint, not synchronisation.
  void SetConsumerCpu(int cpu) {
    std::atomic_ref<uint32_t>(ctl_->consumer_cpu).store(cpu < 0 ? 0u : static_cast<uint32_t>(cpu) + 1,
                                                        std::memory_order_relaxed);
  }
  int ConsumerCpu() const {
    const uint32_t v = std::atomic_ref<uint32_t>(ctl_->consumer_cpu).load(std::memory_order_relaxed);
    return v == 0 ? -1 : static_cast<int>(v - 1);
  }

 private:
  RingControl* ctl_ = nullptr;
  Entry* slots_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t entries_ = 0;
};

// Request and completion rings of a mapped region (after CheckRingHeader).
inline RingView<RequestEntry> RequestRing(uint8_t* base, const RingRegionHeader& h) {
  auto* ctl = reinterpret_cast<RingControl*>(base + h.req_offset);
  return {ctl, reinterpret_cast<RequestEntry*>(base + h.req_offset + sizeof(RingControl)),
          h.entries};
}
inline RingView<CompletionEntry> CompletionRing(uint8_t* base, const RingRegionHeader& h) {
  auto* ctl = reinterpret_cast<RingControl*>(base + h.cmp_offset);
  return {ctl, reinterpret_cast<CompletionEntry*>(base + h.cmp_offset + sizeof(RingControl)),
          h.entries};
}

}  // namespace kvtier::wire
