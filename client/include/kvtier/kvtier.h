/* libkvtier: the C ABI engines use to talk to kvtierd.
 *
 * An engine process attaches once (kvtier_connect): the daemon passes, over its unix
 * socket, a shared-memory ring region and the host arena (memfd), plus the HBM arena's
 * CUDA IPC handle where the daemon has an HBM tier. After that every request travels
 * through the rings, not the socket. The socket stays open: when it closes (the process
 * exits or crashes) the daemon releases every lease the client held.
 *
 * Conventions:
 *  - Handles are opaque; every function returns a kvtier_status and never throws.
 *  - On failure, kvtier_last_error() (per thread) says why in one line.
 *  - A kvtier_client may be shared by threads; its calls are serialised (one request
 *    in flight per client). Use one client per engine worker for parallelism.
 *  - Keys are kvtier_key {hi, lo}: the 128-bit block keys of the key chain
 *    (kvtier_key_chain; DESIGN.md section 3), identical in every process and language.
 *  - Tiers: KVTIER_TIER_HBM (slot ids index the HBM arena: the decode kernels' block
 *    table; slot s at the arena + s * kvtier_hbm_granule), KVTIER_TIER_HOST (slot s is at kvtier_host_slot(c, s), which is
 *    kvtier_host_arena() + s * granule: the host tier may hold slots of several sizes,
 *    one size class per contract, kvtier_contract_slot), KVTIER_TIER_NVME.
 *  - The host tier is read-only to clients: the arena maps PROT_READ (the daemon seals it
 *    against writes), so an acquired or committed host slot cannot be changed by any
 *    client. A host alloc lease's slots are this client's private staging slots, mapped
 *    writable right after the arena (ids from the arena's bytes / granule up, each slot
 *    kvtier_slot_bytes long, or its contract's host slot where the daemon makes slot sizes
 *    per contract, tiers.slot_classes = "per-contract"); commit copies each block (the contract's block size) into a
 *    fresh arena slot, and only that copy is served, checksummed and persisted. Writing a
 *    staging slot after its commit changes nothing cached.
 *
 * Lifetimes:
 *  - kvtier_last_error() points at a per-thread buffer that the calling thread's next
 *    libkvtier call overwrites; copy it to keep it. It is "" after a success.
 *  - The host arena (kvtier_host_arena) is mapped from kvtier_connect until kvtier_close
 *    or kvtier_reconnect, which unmap it (a reconnect maps a new one, maybe elsewhere).
 *    Bytes of a slot are the caller's only while a lease holds that slot: after release
 *    the daemon may reuse it for another block.
 *  - kvtier_close must not run concurrently with another call on the same client, and no
 *    call may follow it: the handle is freed. Every lease ends with it (the daemon
 *    releases them when the socket closes). Other calls may come from any thread.
 *  - A client belongs to the process that connected it: after fork() the child's calls
 *    fail with INVALID ("used after fork: connect again in the child"); kvtier_close in
 *    the child frees the child's copy and leaves the parent's connection alone.
 */
#ifndef KVTIER_KVTIER_H_
#define KVTIER_KVTIER_H_

#include <stddef.h>
#include <stdint.h>

#include "kvtier/tier_stats.h"
#include "kvtier/version.h" /* KVTIER_VERSION_STRING, KVTIER_VERSION (generated) */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVTIER_API __attribute__((visibility("default")))
#else
#define KVTIER_API
#endif

/* 2: kvtier_tier_stats.errors, write_errors; kvtier_abi_layout.
 * 3: KVTIER_CONFLICT: kvtier_commit, kvtier_commit_chain and kvtier_store_tokens answer it
 *    (they answered OK) when keys were already cached with other bytes, and do not count
 *    those keys as committed; kvtier_commit_result.replaced and .disputed. */
#define KVTIER_ABI_VERSION 3

typedef enum kvtier_status {
  KVTIER_OK = 0,
  KVTIER_NOT_FOUND = 1,     /* key, lease or contract not present */
  KVTIER_REJECTED = 2,      /* refused by policy or a limit (tier full, lease table full) */
  KVTIER_RETRY = 3,         /* transient; the same call may succeed later */
  KVTIER_IO_ERROR = 4,      /* the OS or the daemon connection failed */
  KVTIER_CORRUPT = 5,       /* stored bytes failed a check */
  KVTIER_INVALID = 6,       /* malformed argument or request */
  KVTIER_UNSUPPORTED = 7,   /* valid but not supported here (version, tier, geometry) */
  KVTIER_DISCONNECTED = 8,  /* the daemon closed the connection (the error says why when it
                               said so); kvtier_reconnect or close the client */
  KVTIER_TIMEOUT = 9,       /* no completion within the client's timeout: the connection is
                               given up (later calls fail at once); kvtier_reconnect */
  KVTIER_CONFLICT = 10,     /* commit: every item went through, but some keys were already
                               cached with other bytes (or disputed): those keys do not hold
                               the caller's bytes and are not counted in *n_committed; the
                               error line gives the counts (kvtier_commit_report: which) */
} kvtier_status;

typedef enum kvtier_tier {
  KVTIER_TIER_HBM = 0,
  KVTIER_TIER_HOST = 1,
  KVTIER_TIER_NVME = 2,
  KVTIER_TIER_REMOTE = 3,
  KVTIER_TIER_NONE = 255,
} kvtier_tier;

typedef enum kvtier_transport {
  KVTIER_TRANSPORT_RING = 0,   /* shared-memory rings (the default) */
  KVTIER_TRANSPORT_SOCKET = 1, /* the same requests over the unix socket (tools, baseline) */
} kvtier_transport;

typedef struct kvtier_client kvtier_client; /* opaque */

typedef struct kvtier_key {
  uint64_t hi;
  uint64_t lo;
} kvtier_key;

typedef struct kvtier_slot {
  uint8_t tier;      /* kvtier_tier */
  uint8_t from_tier; /* acquire: where the block was when the acquire began (HBM, host,
                        NVMe, or remote for a block it fetched from the remote tier), so one
                        acquire is a whole restore that says where it came from; alloc:
                        KVTIER_TIER_NONE. Ignored in commit items. */
  uint8_t reserved[2];
  uint32_t slot;
} kvtier_slot;

typedef struct kvtier_connect_options {
  const char* name;    /* shown in the daemon's logs; NULL = "libkvtier" */
  int has_gpu;         /* 1: this process maps HBM (may target KVTIER_TIER_HBM) */
  uint32_t timeout_ms; /* per request; 0 = 60000 */
  uint32_t spin_us;    /* busy-poll for a completion before sleeping; 0 = 50 */
} kvtier_connect_options;

/* Everything that decides what a block's bytes mean (DESIGN.md section 3). */
typedef struct kvtier_contract_desc {
  const char* model_id;           /* required */
  const char* model_revision;     /* NULL = "" */
  const char* tokenizer_revision; /* NULL = "" */
  uint32_t num_layers, num_kv_heads, head_dim, block_tokens;
  uint32_t tp_rank, tp_size;      /* tp_size 0 is read as 1 */
  uint8_t kv_format;              /* 0 nvfp4, 1 fp8, 2 bf16 */
  uint8_t scale_rule;             /* 0 max6, 1 4over6 */
  uint8_t v_scale_swizzle;        /* 0 or 1 */
  uint8_t reserved;
  const float* k_scales;          /* num_layers entries; NULL = all 1.0 */
  const float* v_scales;          /* num_layers entries; NULL = all 1.0 */
} kvtier_contract_desc;

typedef struct kvtier_lookup_result {
  size_t hit_blocks;         /* longest cached prefix */
  double est_seconds_to_hbm; /* estimated time to bring the hits to HBM */
} kvtier_lookup_result;

/* A slot's bytes must be complete when kvtier_commit is called: for an HBM slot, the
 * engine's copies and kernels that write it have finished (cudaStreamSynchronize or an
 * event), since the daemon hashes the block on a stream of its own at commit. */
typedef struct kvtier_commit_item {
  kvtier_slot slot;   /* a slot of the alloc lease */
  kvtier_key key;     /* the block key it now holds */
  kvtier_key parent;  /* parent block key; {0,0} for the first block */
} kvtier_commit_item;

/* What a commit did with its items (kvtier_commit_report). A key already cached is
 * compared with the committed bytes: the committer learns that its bytes were not the
 * ones stored. committed = stored + same_bytes + different_bytes + unchecked + disputed.
 * The keys that now hold the caller's bytes (what kvtier_commit counts) are stored +
 * same_bytes + unchecked + replaced; the others, different_bytes - replaced + disputed,
 * are what makes kvtier_commit answer KVTIER_CONFLICT. */
typedef struct kvtier_commit_result {
  size_t committed;       /* items that went through */
  size_t stored;          /* keys not cached before: now cached with these bytes */
  size_t same_bytes;      /* already cached with equal bytes: the cached block stays */
  size_t different_bytes; /* already cached with other bytes: the daemon's tiers.on_conflict
                             decided (keep-first: the cached block stays, these bytes are
                             dropped; replace: these bytes replace it; drop-disputed: both
                             go), counted and logged by the daemon */
  size_t unchecked;       /* already cached where bytes are not compared (only in HBM, or
                             an HBM commit): the cached block stays */
  size_t replaced;        /* of different_bytes: these bytes replaced the cached block
                             (tiers.on_conflict = replace, the block not pinned) */
  size_t disputed;        /* the key was disputed before (drop-disputed) and its block is
                             still pinned or moving: nothing is served under it and these
                             bytes are not stored; commit again once it is gone (protocol 8
                             daemons; an older one counts them in same_bytes) */
} kvtier_commit_result;

/* kvtier_tier_stats: one tier's statistics, defined in tier_stats.h (the field list the
 * daemon, the wire and Python share). */

/* ---- record layouts ---------------------------------------------------------------- */
/* One row of the layout table: a field of a public record (offsetof and sizeof as this
 * library was compiled), or, with field "", the record's own sizeof. Bindings that mirror
 * the records (Python's ctypes structs) check theirs against it when they load. */
typedef struct kvtier_abi_field {
  const char* record; /* "kvtier_tier_stats" */
  const char* field;  /* "hits"; "" for the row of sizeof(record) */
  uint32_t offset;    /* offsetof(record, field); 0 on the sizeof row */
  uint32_t size;      /* sizeof(field); sizeof(record) on the sizeof row */
} kvtier_abi_field;
/* The table of every public record's fields, *n rows; static, never fails. */
KVTIER_API const kvtier_abi_field* kvtier_abi_layout(size_t* n);

/* ---- errors ---------------------------------------------------------------------- */
KVTIER_API const char* kvtier_status_name(kvtier_status s);
/* One line: why the calling thread's last failed call failed ("" after a success). */
KVTIER_API const char* kvtier_last_error(void);
KVTIER_API uint32_t kvtier_protocol_version(void);
/* KVTIER_ABI_VERSION of the library loaded at run time (a caller built against another
 * header compares it with its own KVTIER_ABI_VERSION). */
KVTIER_API uint32_t kvtier_abi_version(void);

/* ---- version ---------------------------------------------------------------------- */
/* The loaded library's version, "MAJOR.MINOR.PATCH" (compare with KVTIER_VERSION_STRING,
 * the version of the header compiled against). */
KVTIER_API const char* kvtier_version(void);

/* ---- connection ------------------------------------------------------------------- */
KVTIER_API kvtier_status kvtier_connect(const char* socket_path, const kvtier_connect_options* opts,
                                        kvtier_client** out);
/* Releases nothing explicitly: closing the socket makes the daemon release the leases. */
KVTIER_API void kvtier_close(kvtier_client* c);
/* Attaches again to the same socket (after DISCONNECTED, TIMEOUT, or a daemon restart) and
 * registers again every contract this client registered. The old connection's leases are
 * gone, and the host arena is mapped anew (kvtier_host_arena may return another address).
 * On failure the client stays given up and a later call may try again. */
KVTIER_API kvtier_status kvtier_reconnect(kvtier_client* c);
/* Opt-in: a call on a given-up connection first runs kvtier_reconnect (the call that
 * found the connection broken still fails; the next one reconnects). Default: off. */
KVTIER_API kvtier_status kvtier_set_auto_reconnect(kvtier_client* c, int enable);
KVTIER_API kvtier_status kvtier_set_transport(kvtier_client* c, kvtier_transport t);
KVTIER_API uint64_t kvtier_client_id(const kvtier_client* c);
KVTIER_API uint64_t kvtier_slot_bytes(const kvtier_client* c);
/* Base of the host window (NULL without a host tier); *bytes gets its size: the arena,
 * mapped read-only (a write faults), then this client's staging area, writable. Host
 * slot s is at base + s * kvtier_host_granule. Against a daemon with [[tenants]] the arena's
 * part is not mapped (a read faults) but for its tenant's part of it (kvtier_host_parts): a
 * host acquire's slots are the arena slots of blocks there, and copies of the others in the
 * staging area (staging ids), made for this client's lease. */
KVTIER_API void* kvtier_host_arena(const kvtier_client* c, uint64_t* bytes);
/* Host slot `slot` of any lease, read-only: kvtier_host_arena() + slot * granule (NULL for
 * a slot past the window, and for an arena slot where the arena is not mapped: a daemon
 * with tenants, outside the client's tenant's part). It is as long as its contract's slot class (kvtier_contract_slot; a
 * staging slot: kvtier_slot_bytes, or its contract's slot where slot sizes are made per
 * contract). */
KVTIER_API const void* kvtier_host_slot(const kvtier_client* c, uint32_t slot);
/* Writable host slot of an alloc lease (a staging slot); NULL for an arena slot (acquired
 * or committed blocks are read-only) and for a slot past the window. */
KVTIER_API void* kvtier_host_slot_write(const kvtier_client* c, uint32_t slot);
/* The staging area's memfd (owned by the client, closed by kvtier_close; -1 without a
 * host tier): mapped writable after the arena; a binding that maps the arena itself maps
 * this too (its slot 0 is host slot id arena bytes / granule, kvtier_host_granule). */
KVTIER_API int kvtier_host_staging_fd(const kvtier_client* c);
/* The host arena's memfd (owned by the client, closed by kvtier_close; -1 without a host
 * tier, and against a daemon with tenants, which sends none). A binding may map it itself (dup it first) so that its views outlive the client's
 * own mapping: the Python package does. */
KVTIER_API int kvtier_host_arena_fd(const kvtier_client* c);
/* Against a daemon with [[tenants]] (tiers.host.tenant_parts): the parts of the arena
 * this client maps read-only, its tenant's, where host acquires of its blocks answer arena
 * slots read in place. Returns how many there are (0: none, every arena slot unmapped);
 * for i below that, *fd (owned by the client, closed by kvtier_close; dup it to keep it),
 * *offset (bytes into the arena: the part lies at kvtier_host_arena() + offset) and
 * *bytes of part i (each pointer may be NULL). A binding that maps the window itself
 * maps these at their offsets. */
KVTIER_API uint32_t kvtier_host_parts(const kvtier_client* c, uint32_t i, int* fd, uint64_t* offset,
                                      uint64_t* bytes);
/* The host tier's granule: host slot s is at kvtier_host_arena() + s * granule, whatever
 * its size (0 without a host tier). With one slot class it is kvtier_slot_bytes. */
KVTIER_API uint64_t kvtier_host_granule(const kvtier_client* c);
/* The host tier's slot classes, smallest first: up to cap slot sizes into bytes (may be
 * NULL with cap 0); returns how many there are (0 without a host tier). The largest is
 * kvtier_slot_bytes; a contract's blocks take the smallest that holds them
 * (kvtier_contract_slot). 0 too where the daemon makes a slot size per contract as it
 * registers (tiers.slot_classes = "per-contract"): kvtier_slot_bytes is then the largest
 * block a contract may have, and kvtier_contract_slot a contract's slot. */
KVTIER_API uint32_t kvtier_host_slot_classes(const kvtier_client* c, uint64_t* bytes, uint32_t cap);
/* Counts the client's successful attaches (1 after kvtier_connect, one more per reconnect,
 * automatic ones included): a binding that caches the arena's address maps it again when
 * this changes. */
KVTIER_API uint64_t kvtier_attach_generation(const kvtier_client* c);
/* The HBM tier's granule: HBM slot s (a block-table entry of the decode kernels) is at
 * the arena's device address (kvtier_hbm_open) + s * granule, whatever its size: the HBM
 * tier has the host tier's slot classes. It is the stride to give the kernels
 * (kvt_pool.slot_bytes). With one class it is kvtier_slot_bytes; 0 without an HBM tier. */
KVTIER_API uint64_t kvtier_hbm_granule(const kvtier_client* c);
/* Bytes of the HBM arena (every slot lies below): kvt_pool.num_slots = bytes / granule.
 * 0 without an HBM tier, or from a daemon of protocol 5 (one slot size). */
KVTIER_API uint64_t kvtier_hbm_arena_bytes(const kvtier_client* c);
/* Copies the HBM arena's CUDA IPC handle (64 bytes); UNSUPPORTED without an HBM tier,
 * INVALID for a client that attached without has_gpu (the daemon sends the handle only to
 * GPU clients). CUDA IPC maps the arena read-write: a change made to a committed block is
 * detected when the block leaves HBM, and the block is dropped (docs/tiers.md). */
KVTIER_API kvtier_status kvtier_hbm_ipc_handle(const kvtier_client* c, uint8_t out[64]);
/* Opens the HBM arena in this process (cudaIpcOpenMemHandle), once; *dev_ptr is the
 * device address of slot 0. UNSUPPORTED in a build without CUDA or without HBM tier,
 * INVALID without has_gpu. */
KVTIER_API kvtier_status kvtier_hbm_open(kvtier_client* c, void** dev_ptr);

/* ---- contracts and keys ------------------------------------------------------------ */
/* Contract id (XXH3-64 of the canonical serialization) of a description. */
KVTIER_API kvtier_status kvtier_contract_id(const kvtier_contract_desc* d, uint64_t* id);
/* Bytes of one block of this contract (what a slot must hold). */
KVTIER_API kvtier_status kvtier_contract_block_bytes(const kvtier_contract_desc* d, uint64_t* bytes);
/* Registers the contract with the daemon (idempotent). REJECTED/UNSUPPORTED when its
 * block does not fit the daemon's slots. */
KVTIER_API kvtier_status kvtier_register_contract(kvtier_client* c, const kvtier_contract_desc* d,
                                                  uint64_t* contract_id);
/* Registers the contract in the shared namespace (README.md "Security"): one pool of
 * blocks for every tenant that registers the contract shared, such as a public system
 * prompt. It gives up the tenants' isolation for those blocks: any such tenant can find,
 * and time, what another stored there. *handle gets the contract's shared handle, which
 * is not its contract id: name the contract by it in every later call and key chain. */
KVTIER_API kvtier_status kvtier_register_contract_shared(kvtier_client* c, const kvtier_contract_desc* d,
                                                         uint64_t* handle);
/* The host slot size a contract this client registered takes (the smallest of the
 * daemon's slot classes, tiers.slot_classes, that holds its block) and *fill, block bytes /
 * slot bytes. NOT_FOUND for a contract this client did not register. */
KVTIER_API kvtier_status kvtier_contract_slot(kvtier_client* c, uint64_t contract_id, uint64_t* slot_bytes,
                                              double* fill);
/* The HBM slot size a contract this client registered takes (the HBM tier's class of its
 * block, which may differ from its host slot: each tier rounds to its own granule where
 * slot sizes are made per contract); 0 without an HBM tier. NOT_FOUND for a contract
 * this client did not register. */
KVTIER_API kvtier_status kvtier_contract_hbm_slot(kvtier_client* c, uint64_t contract_id, uint64_t* slot_bytes);
/* Keys of every full block of tokens: n_tokens / block_tokens keys into out (capacity
 * out_cap). *n_keys gets the count. Pure computation, no daemon needed. */
KVTIER_API kvtier_status kvtier_key_chain(uint64_t contract_id, const uint32_t* tokens,
                                          size_t n_tokens, uint32_t block_tokens, kvtier_key* out,
                                          size_t out_cap, size_t* n_keys);

/* ---- token-level calls ------------------------------------------------------------
 * Prompts as token ids instead of keys, leases and parents (what vLLM's KV connector and
 * LMCache's store/retrieve ask for). The block size comes from the contract, which this
 * client must have registered (NOT_FOUND otherwise). Requests over the daemon's
 * max_keys_per_request are split by the library. */

/* block_tokens of a contract this client registered. */
KVTIER_API kvtier_status kvtier_contract_block_tokens(kvtier_client* c, uint64_t contract_id,
                                                      uint32_t* block_tokens);
/* kvtier_key_chain with the contract's own block_tokens. */
KVTIER_API kvtier_status kvtier_key_chain_tokens(kvtier_client* c, uint64_t contract_id,
                                                 const uint32_t* tokens, size_t n_tokens,
                                                 kvtier_key* out, size_t out_cap, size_t* n_keys);
/* How many leading tokens of the prompt the engine can take from the cache: whole cached
 * blocks, never the block holding the last prompt token (the engine recomputes that token
 * to get the next token's logits; vLLM's get_num_new_matched_tokens). A prompt of
 * n_tokens <= block_tokens gives 0 without a round trip. */
KVTIER_API kvtier_status kvtier_lookup_tokens(kvtier_client* c, uint64_t contract_id,
                                              const uint32_t* tokens, size_t n_tokens,
                                              size_t* cached_tokens);
/* kvtier_commit of slots[i] under keys[i] with the parents filled in: keys[i - 1], and
 * `parent` ({0,0} for a chain that starts at the prompt's first block) for keys[0].
 * KVTIER_CONFLICT as kvtier_commit. */
KVTIER_API kvtier_status kvtier_commit_chain(kvtier_client* c, uint64_t contract_id, uint64_t lease,
                                             const kvtier_slot* slots, const kvtier_key* keys, size_t n,
                                             kvtier_key parent, size_t* n_committed);
/* Stores a prompt's blocks in the host tier after prefill: looks up the cached prefix,
 * and for every full block after it copies blocks[i] (block_bytes of the contract) into a
 * fresh host slot and commits the chain. blocks has n_tokens / block_tokens entries; the
 * cached prefix's entries are not read (may be NULL). *stored_blocks (may be NULL) gets
 * how many blocks it stored; they stay cached, unpinned. KVTIER_CONFLICT when some keys
 * were cached with other bytes meanwhile (not counted in *stored_blocks). */
KVTIER_API kvtier_status kvtier_store_tokens(kvtier_client* c, uint64_t contract_id,
                                             const uint32_t* tokens, size_t n_tokens,
                                             const void* const* blocks, size_t* stored_blocks);
/* Pins the reusable cached prefix of a prompt (kvtier_lookup_tokens' rule) in `target` under
 * a new lease: *cached_tokens tokens, in *cached_tokens / block_tokens slots (slots_out,
 * slots_cap entries, at least (n_tokens - 1) / block_tokens). A miss is *lease = 0. */
KVTIER_API kvtier_status kvtier_load_tokens(kvtier_client* c, uint64_t contract_id,
                                            const uint32_t* tokens, size_t n_tokens, kvtier_tier target,
                                            uint64_t* lease, kvtier_slot* slots_out, size_t slots_cap,
                                            size_t* cached_tokens);

/* ---- operations ------------------------------------------------------------------- */
/* Longest cached prefix of keys; tiers_out (n bytes, may be NULL) gets each block's tier
 * (KVTIER_TIER_NONE from the first miss on). n = 0 (a prompt shorter than a block) is 0
 * hits, with no round trip. A contract the daemon does not know is NOT_FOUND ("register
 * it first"), for every operation: a caller that forgot to register hears so. */
KVTIER_API kvtier_status kvtier_lookup(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys,
                                       size_t n, kvtier_lookup_result* result, uint8_t* tiers_out);
/* Promotes the cached prefix of keys to `target` (HBM, or host for a client without a
 * GPU) and pins it under a new lease. slots_out (n entries) gets the slots; *n_slots how
 * many (the prefix; 0 means nothing was cached and no lease was made: *lease = 0, which
 * kvtier_release accepts). n = 0 is 0 hits (keys and slots_out may then be NULL). */
KVTIER_API kvtier_status kvtier_acquire(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys,
                                        size_t n, kvtier_tier target, uint64_t* lease,
                                        kvtier_slot* slots_out, size_t* n_slots);
/* ---- asynchronous acquire --------------------------------------------------------- */
/* kvtier_acquire without blocking the caller: the request goes out and the call returns a
 * handle. The daemon acquires the keys in steps of chunk_blocks (0: 16) and publishes the
 * slots of the leading blocks as they become ready, so an engine uses the first blocks
 * while the rest still restore (from NVMe, say). Several may be in flight on one client,
 * each in its own region of the upper half of the ring's data area: one that finds no room
 * there answers REJECTED at once, one past the daemon's
 * daemon.max_async_acquires_per_client (8) finishes REJECTED. Synchronous calls on the
 * client go on meanwhile (in the lower half). Needs the ring transport and a daemon of
 * protocol 4 (UNSUPPORTED otherwise). n = 0 is finished at once with 0 hits.
 *   kvtier_acquire_async_fd     an eventfd, written once per ready step (leading blocks
 *                               became usable) and once when the acquire finished: poll
 *                               it in an event loop, read it (8 bytes) to rearm, then ask
 *                               _ready or _wait; owned by the handle
 *   kvtier_acquire_async_ready  *ready = leading blocks usable now (only grows); copies
 *                               the first min(*ready, cap) slots into slots_out
 *   kvtier_acquire_async_wait   OK once finished; RETRY if still in flight after
 *                               timeout_ms (-1: no limit)
 *   kvtier_acquire_async_result waits, then answers what kvtier_acquire would have:
 *                               *lease (0 for a miss), *n_slots, slots_out (n entries);
 *                               the lease is then the caller's to release
 *   kvtier_acquire_async_free   waits for the acquire to finish (the daemon cannot take
 *                               it back), releases its lease unless result took it, and
 *                               frees the handle. After kvtier_close the handle answers
 *                               DISCONNECTED and must still be freed. */
typedef struct kvtier_acquire_op kvtier_acquire_op;
KVTIER_API kvtier_status kvtier_acquire_async(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys,
                                              size_t n, kvtier_tier target, uint32_t chunk_blocks,
                                              kvtier_acquire_op** op);
KVTIER_API int kvtier_acquire_async_fd(const kvtier_acquire_op* op);
KVTIER_API kvtier_status kvtier_acquire_async_ready(kvtier_acquire_op* op, kvtier_slot* slots_out, size_t cap,
                                                    size_t* ready);
KVTIER_API kvtier_status kvtier_acquire_async_wait(kvtier_acquire_op* op, int timeout_ms);
KVTIER_API kvtier_status kvtier_acquire_async_result(kvtier_acquire_op* op, uint64_t* lease,
                                                     kvtier_slot* slots_out, size_t* n_slots);
KVTIER_API void kvtier_acquire_async_free(kvtier_acquire_op* op);

/* n free slots of `target` to write blocks into, under a new lease. RETRY: the tier is
 * full for now (blocks being demoted, other clients' pins); REJECTED, with the numbers
 * (slots in the tier, held by this client, asked for), when this client's own leases keep
 * it full: release leases first, waiting cannot help. */
KVTIER_API kvtier_status kvtier_alloc(kvtier_client* c, uint64_t contract_id, size_t n, kvtier_tier target,
                                      uint64_t* lease, kvtier_slot* slots_out);
/* kvtier_alloc that waits out RETRY for up to wait_ms (backing off from 1 to 20 ms), so
 * an engine calls it once; any other answer, REJECTED included, returns at once. */
KVTIER_API kvtier_status kvtier_alloc_wait(kvtier_client* c, uint64_t contract_id, size_t n,
                                           kvtier_tier target, uint32_t wait_ms, uint64_t* lease,
                                           kvtier_slot* slots_out);
/* Makes written slots of an alloc lease visible under their keys. Stops at the first
 * failure; *n_committed (may be NULL) says how many keys went through and now hold these
 * bytes. The blocks stay pinned until the lease is released. Lookup, commit and prefetch
 * split a long request under the daemon's max_keys_per_request themselves; acquire and
 * alloc (one lease each) answer INVALID over it.
 * KVTIER_CONFLICT: every item went through, but some keys were already cached with other
 * bytes (tiers.on_conflict keep-first or drop-disputed, or replace of a pinned block) or
 * disputed (drop-disputed): they do not hold the caller's bytes (an acquire of them
 * serves the other bytes, or nothing), are not counted in *n_committed, and the error
 * line says how many. Never treat such a key as holding the caller's bytes. Before ABI
 * version 3 this call answered OK and counted them. */
KVTIER_API kvtier_status kvtier_commit(kvtier_client* c, uint64_t contract_id, uint64_t lease,
                                       const kvtier_commit_item* items, size_t n, size_t* n_committed);
/* kvtier_commit that also says, for the items that went through, how many were stored
 * and how many keys were already cached, with equal or different bytes (*result, may be
 * NULL; filled on failure too). A daemon of protocol < 5 counts every item as stored.
 * Answers OK on conflicts (the counts say them), as before ABI version 3: the caller
 * reads the report. */
KVTIER_API kvtier_status kvtier_commit_report(kvtier_client* c, uint64_t contract_id, uint64_t lease,
                                              const kvtier_commit_item* items, size_t n,
                                              kvtier_commit_result* result);
/* Ends a lease: acquired and committed blocks are unpinned, uncommitted slots freed.
 * Lease 0 (the lease of a miss) is a no-op returning OK, like free(NULL); a lease this
 * client does not hold is NOT_FOUND. */
KVTIER_API kvtier_status kvtier_release(kvtier_client* c, uint64_t lease);
/* Starts promoting the cached prefix of keys to target; returns at once (n = 0: nothing). */
KVTIER_API kvtier_status kvtier_prefetch(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys,
                                         size_t n, kvtier_tier target);
/* Per-tier statistics; up to cap entries, *n gets the count. */
KVTIER_API kvtier_status kvtier_stats(kvtier_client* c, kvtier_tier_stats* out, size_t cap, size_t* n);
/* One empty round trip (benchmarks, health checks). */
KVTIER_API kvtier_status kvtier_ping(kvtier_client* c);

/* ---- operator requests (kvtierctl) -------------------------------------------------
 * Additive: a daemon that predates them answers KVTIER_INVALID ("op 10 unknown").
 * Pages: offset/limit (1..65536); *total gets the number of matches, so a caller loops
 * until offset reaches it. Listing, inspecting and verifying change nothing but the
 * verification's own outcome (a corrupt NVMe record is dropped, as a read would). */

#define KVTIER_BLOCK_IN_HBM 0x1u
#define KVTIER_BLOCK_IN_HOST 0x2u
#define KVTIER_BLOCK_IN_NVME 0x4u
#define KVTIER_BLOCK_NVME_VERIFIED 0x8u

typedef struct kvtier_block_info {
  uint64_t contract_id;
  kvtier_key key, parent;
  uint64_t bytes;          /* payload bytes */
  uint8_t where;           /* KVTIER_BLOCK_* bits */
  uint8_t reserved[3];
  uint32_t uses;           /* hits since the daemon indexed it */
  int32_t hbm_slot, host_slot; /* -1 when no copy there */
  uint32_t pins_hbm, pins_host;
  uint32_t nvme_record, nvme_hits;      /* kvtier_inspect only */
  uint64_t payload_xxh3, header_xxh3;   /* kvtier_inspect only: the NVMe record's checksums */
} kvtier_block_info;

typedef struct kvtier_verify_report {
  uint64_t total, checked, ok, corrupt, missing, io_errors;
} kvtier_verify_report;

/* Header of one contract in kvtier_list_contracts' output; contract_bytes of canonical
 * contract serialization follow it, padded to a multiple of 8. */
typedef struct kvtier_contract_info {
  uint64_t contract_id, block_bytes;
  uint64_t blocks[3]; /* cached blocks per tier: hbm, host, nvme */
  uint32_t contract_bytes, reserved;
} kvtier_contract_info;

/* Registered contracts [offset, offset + limit) as consecutive (kvtier_contract_info +
 * bytes) records in out (out_cap bytes); *n records, *out_bytes bytes, *total contracts. */
KVTIER_API kvtier_status kvtier_list_contracts(kvtier_client* c, uint64_t offset, uint32_t limit,
                                               void* out, size_t out_cap, size_t* out_bytes,
                                               uint32_t* n, uint64_t* total);
/* A page of the block index: blocks of contract_id (0 = all) held in tier (KVTIER_TIER_NONE
 * = any). out has room for limit entries. */
KVTIER_API kvtier_status kvtier_list_blocks(kvtier_client* c, uint64_t contract_id, kvtier_tier tier,
                                            uint64_t offset, uint32_t limit, kvtier_block_info* out,
                                            uint32_t* n, uint64_t* total);
/* One block (contract_id 0 = any contract holding the key); NOT_FOUND when not cached. */
KVTIER_API kvtier_status kvtier_inspect(kvtier_client* c, uint64_t contract_id, kvtier_key key,
                                        kvtier_block_info* out);
/* Re-reads and checks NVMe records [offset, offset + limit) (record order). */
KVTIER_API kvtier_status kvtier_verify_nvme(kvtier_client* c, uint64_t offset, uint32_t limit,
                                            kvtier_verify_report* out);
/* Evicts one block from every tier (contract_id 0 = any); REJECTED while it is pinned. */
KVTIER_API kvtier_status kvtier_evict(kvtier_client* c, uint64_t contract_id, kvtier_key key);
/* Evicts every unpinned block of a contract; *evicted and *skipped (pinned) may be NULL. */
KVTIER_API kvtier_status kvtier_evict_contract(kvtier_client* c, uint64_t contract_id,
                                               uint64_t* evicted, uint64_t* skipped);
/* Demotes every unpinned block of HBM and host to NVMe; returns when done. */
KVTIER_API kvtier_status kvtier_flush(kvtier_client* c);
/* Demotes every unpinned block down to `to`: KVTIER_TIER_HOST empties HBM into host (host
 * and NVMe unchanged), KVTIER_TIER_NVME is kvtier_flush. Returns when done. */
KVTIER_API kvtier_status kvtier_flush_to(kvtier_client* c, kvtier_tier to);
/* Re-reads the daemon's config file as SIGHUP does; msg (msg_cap bytes, may be NULL) gets
 * a one-line summary. INVALID (and nothing changed) when the file does not validate. */
KVTIER_API kvtier_status kvtier_reload_config(kvtier_client* c, char* msg, size_t msg_cap);

/* One tenant's counters ([[tenants]] in the daemon's config). Per local tier (hbm, host,
 * nvme): blocks held, share in slots, copies evicted. */
typedef struct kvtier_tenant_counters {
  char name[64]; /* "default" (clients no table lists), a table's name, or "shared" */
  uint64_t blocks[3], quota_slots[3], evictions[3];
  uint64_t lookup_keys, lookup_hits, committed, access_denied;
} kvtier_tenant_counters;
/* Up to cap tenants into out; *n gets the count (0 without [[tenants]]). An operator gets
 * every tenant and the shared namespace, anyone else its own tenant. */
KVTIER_API kvtier_status kvtier_tenant_stats(kvtier_client* c, kvtier_tenant_counters* out, size_t cap, size_t* n);

/* ---- NVFP4 codec on the CPU ---------------------------------------------------------
 * The codec of kvtierd's tiers and the CUDA kernels (formats/nvfp4.h, DESIGN.md section 3),
 * for engines that move pages on the CPU (kvtier.pages). No client is needed; both calls
 * are thread-safe. Bytes are bit-identical to the quantize-append kernel's.
 *
 * n values (n a multiple of 16) of float32 x <-> `data`, n/2 bytes (byte j = code[2j] |
 * code[2j+1] << 4, E2M1 codes), and `scales`, n/16 E4M3 bytes (scale g covers values
 * [16g, 16g+16)). kv_scale is the global dequantization multiplier (the contract's k_scale
 * or v_scale of the layer): value = e2m1(code) * e4m3(scale) * kv_scale. One side (K or V)
 * of an NVFP4 page is H*T*D values in HND order (formats/layout.h): encoding them gives
 * that side's data region and scale region as they lie in the page.
 *
 * encode: rule 0 = max6, 1 = 4over6. INVALID (nothing written) on a count that is not a
 * multiple of 16, a NULL buffer, a non-finite value, or a kv_scale that is not a finite
 * positive normal float.
 * decode: INVALID on the same argument errors; CORRUPT (nothing written) when a scale byte
 * is an E4M3 NaN (0x7F/0xFF), which no encoder produces. */
KVTIER_API kvtier_status kvtier_nvfp4_encode(const float* x, size_t n, float kv_scale, uint32_t rule,
                                             uint8_t* data, uint8_t* scales);
KVTIER_API kvtier_status kvtier_nvfp4_decode(const uint8_t* data, const uint8_t* scales, size_t n,
                                             float kv_scale, float* out);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_KVTIER_H_ */
