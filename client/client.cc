// libkvtier: the C ABI of client/include/kvtier/kvtier.h. Argument checks and the
// encoding of each request live here; the attach is in attach.cc, the exchange of one
// request and its completion (rings or socket) in transport.cc. Nothing here throws
// across the ABI (every entry point catches, just in case an allocation fails).
#include "kvtier/kvtier.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <mutex>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "client/client_internal.h"
#include "formats/contract.h"
#include "formats/keys.h"
#include "formats/wire.h"

namespace w = kvtier::wire;

namespace kvtier::lib {

thread_local std::string g_last_error;  // kvtier_last_error()

kvtier_status Fail(kvtier_status s, std::string msg) {
  g_last_error = std::move(msg);
  return s;
}
kvtier_status Ok() {
  g_last_error.clear();
  return KVTIER_OK;
}
kvtier_status FromStatus(const kvtier::Status& s) {
  if (s.ok()) return Ok();
  return Fail(static_cast<kvtier_status>(s.code()), s.ToString());
}

// Where a registered contract's blocks go in the host and HBM tiers, from its register
// completion: protocol 9 gives each tier's slot in granules, protocol 5 names the host
// slot class (HBM's the same one, or one class); older daemons have one slot size.
void SetSlotFit(const kvtier_client* c, const w::CompletionEntry& cmp, RegisteredContract* rc) {
  const auto& t = c->host_classes;
  const auto& h = c->hbm.classes;
  if (c->reply.protocol_version >= 9) {
    rc->host_slot_bytes = uint64_t{cmp.cached_same} * t.granule;
    rc->hbm_slot_bytes = uint64_t{cmp.cached_different} * h.granule;
  } else {
    rc->host_slot_bytes = c->reply.protocol_version >= 5 && cmp.count < t.count && cmp.count < w::kMaxWireSlotClasses
                              ? t.class_bytes[cmp.count]
                              : c->reply.slot_bytes;
    rc->hbm_slot_bytes = h.count > 1 && cmp.count < h.count && cmp.count < w::kMaxWireSlotClasses
                             ? h.class_bytes[cmp.count]
                             : h.count == 1 ? h.class_bytes[0] : 0;
  }
  rc->fill = rc->host_slot_bytes ? static_cast<double>(rc->block_bytes) / static_cast<double>(rc->host_slot_bytes) : 0.0;
}

kvtier_status Reconnect(kvtier_client* c) {
  AbandonAsync(c, KVTIER_DISCONNECTED, "the client attached again while the acquire was in flight");
  Detach(c);
  c->broken = true;  // until the attach and every registration went through
  kvtier_connect_options o{};
  o.name = c->name.c_str();
  o.has_gpu = c->has_gpu ? 1 : 0;
  kvtier_status s = Attach(c->socket_path.c_str(), &o, c);
  if (s != KVTIER_OK) {
    c->broken_reason = std::string("reconnect failed: ") + g_last_error;
    return s;
  }
  c->broken = false;
  c->broken_reason.clear();
  for (auto& [id, rc] : c->contracts) {
    w::RequestEntry req;
    req.op = static_cast<uint16_t>(w::Op::kRegisterContract);
    req.flags = rc.shared ? w::kRequestShared : 0;
    req.count = static_cast<uint32_t>(rc.bytes.size());
    w::CompletionEntry cmp;
    s = Call(c, req, rc.bytes.data(), rc.bytes.size(), nullptr, 0, &cmp);
    if (s != KVTIER_OK) {
      const std::string why = "reconnect: registering contract " + kvtier::ContractIdHex(id) + ": " + g_last_error;
      c->broken = true;
      c->broken_reason = why;
      return Fail(s, why);
    }
    SetSlotFit(c, cmp, &rc);  // the daemon may have other slot classes now
  }
  return Ok();
}

}  // namespace kvtier::lib

namespace {

using namespace kvtier::lib;  // NOLINT: Fail, Ok, Call, Attach within this file

kvtier::Status ToContract(const kvtier_contract_desc* d, kvtier::ScaleContract* c) {
  if (d == nullptr) return kvtier::Status::Invalid("contract description is NULL");
  if (d->model_id == nullptr) return kvtier::Status::Invalid("contract model_id is NULL");
  c->model_id = d->model_id;
  c->model_revision = d->model_revision ? d->model_revision : "";
  c->tokenizer_revision = d->tokenizer_revision ? d->tokenizer_revision : "";
  c->geometry = kvtier::Geometry{d->num_layers, d->num_kv_heads, d->head_dim, d->block_tokens};
  c->tp_rank = d->tp_rank;
  c->tp_size = d->tp_size == 0 ? 1 : d->tp_size;
  if (d->kv_format > 2) return kvtier::Status::Invalid("kv_format " + std::to_string(d->kv_format) + " unknown");
  if (d->scale_rule > 1) return kvtier::Status::Invalid("scale_rule " + std::to_string(d->scale_rule) + " unknown");
  if (d->v_scale_swizzle > 1 || d->reserved != 0) return kvtier::Status::Invalid("contract flag bytes malformed");
  c->format = static_cast<kvtier::KvFormat>(d->kv_format);
  c->scale_rule = static_cast<kvtier::nvfp4::ScaleRule>(d->scale_rule);
  c->v_scale_swizzle = d->v_scale_swizzle != 0;
  if (d->num_layers == 0 || d->num_layers > 1024) {
    return kvtier::Status::Invalid("num_layers " + std::to_string(d->num_layers) + " not in [1, 1024]");
  }
  c->SetUnitScales();
  if (d->k_scales) c->k_scales.assign(d->k_scales, d->k_scales + d->num_layers);
  if (d->v_scales) c->v_scales.assign(d->v_scales, d->v_scales + d->num_layers);
  return c->Validate();
}

kvtier_status CheckClient(const kvtier_client* c) {
  if (c == nullptr) return Fail(KVTIER_INVALID, "client is NULL");
  if (c->fork_generation != ForkGeneration()) {
    return Fail(KVTIER_INVALID, "kvtier client used after fork: connect again in the child");
  }
  return KVTIER_OK;
}


// Items per request for an op whose request and reply take `bytes_per_item` of the ring's
// data area together: under the daemon's max_keys_per_request and inside the data area
// (with the error message's room).
size_t KeyChunk(const kvtier_client* c, size_t bytes_per_item) {
  const size_t max_keys = c->reply.max_keys_per_request ? c->reply.max_keys_per_request : 65536;
  const size_t room = c->hdr.data_bytes > 512 ? (c->hdr.data_bytes - 512) / bytes_per_item : 1;
  return std::max<size_t>(1, std::min(max_keys, room));
}

}  // namespace

extern "C" {

const char* kvtier_status_name(kvtier_status s) {
  switch (s) {
    case KVTIER_OK: return "OK";
    case KVTIER_NOT_FOUND: return "NOT_FOUND";
    case KVTIER_REJECTED: return "REJECTED";
    case KVTIER_RETRY: return "RETRY";
    case KVTIER_IO_ERROR: return "IO_ERROR";
    case KVTIER_CORRUPT: return "CORRUPT";
    case KVTIER_INVALID: return "INVALID";
    case KVTIER_UNSUPPORTED: return "UNSUPPORTED";
    case KVTIER_DISCONNECTED: return "DISCONNECTED";
    case KVTIER_TIMEOUT: return "TIMEOUT";
    case KVTIER_CONFLICT: return "CONFLICT";
  }
  return "UNKNOWN";
}

const char* kvtier_last_error(void) { return kvtier::lib::g_last_error.c_str(); }
uint32_t kvtier_protocol_version(void) { return w::kProtocolVersion; }
uint32_t kvtier_abi_version(void) { return KVTIER_ABI_VERSION; }


const char* kvtier_version(void) { return KVTIER_VERSION_STRING; }

kvtier_status kvtier_connect(const char* socket_path, const kvtier_connect_options* opts,
                             kvtier_client** out) {
  KVTIER_GUARD_BEGIN
  if (socket_path == nullptr || out == nullptr) return Fail(KVTIER_INVALID, "socket_path and out are required");
  *out = nullptr;
  auto* c = new kvtier_client();
  c->fork_generation = ForkGeneration();
  c->socket_path = socket_path;
  c->name = (opts && opts->name) ? opts->name : "libkvtier";
  c->has_gpu = opts && opts->has_gpu;
  if (opts) {
    if (opts->timeout_ms) c->timeout_ms = opts->timeout_ms;
    if (opts->spin_us) c->spin_us = opts->spin_us;
  }
  const kvtier_status s = Attach(socket_path, opts, c);
  if (s != KVTIER_OK) {
    delete c;
    return s;
  }
  *out = c;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_reconnect(kvtier_client* c) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  std::lock_guard<std::mutex> l(c->mu);
  return Reconnect(c);
  KVTIER_GUARD_END
}

kvtier_status kvtier_set_auto_reconnect(kvtier_client* c, int enable) {
  if (CheckClient(c)) return KVTIER_INVALID;
  std::lock_guard<std::mutex> l(c->mu);
  c->auto_reconnect = enable != 0;
  return Ok();
}

void kvtier_close(kvtier_client* c) {
  if (c == nullptr) return;
  ReleaseAsyncAtClose(c);
  Detach(c);
  delete c;
}

kvtier_status kvtier_set_transport(kvtier_client* c, kvtier_transport t) {
  if (CheckClient(c)) return KVTIER_INVALID;
  if (t != KVTIER_TRANSPORT_RING && t != KVTIER_TRANSPORT_SOCKET) return Fail(KVTIER_INVALID, "unknown transport");
  std::lock_guard<std::mutex> l(c->mu);
  if (!c->async.empty()) return Fail(KVTIER_INVALID, "an asynchronous acquire is in flight: finish it first");
  c->transport = t;
  return Ok();
}

uint64_t kvtier_client_id(const kvtier_client* c) { return c ? c->reply.client_id : 0; }
uint64_t kvtier_slot_bytes(const kvtier_client* c) { return c ? c->reply.slot_bytes : 0; }

int kvtier_host_arena_fd(const kvtier_client* c) { return c ? c->host_fd : -1; }
int kvtier_host_staging_fd(const kvtier_client* c) { return c ? c->staging_fd : -1; }
uint32_t kvtier_host_parts(const kvtier_client* c, uint32_t i, int* fd, uint64_t* offset, uint64_t* bytes) {
  if (c == nullptr || c->host == nullptr) return 0;
  const uint32_t n = c->host_parts.count;
  if (i < n) {
    if (fd) *fd = c->part_fds[i];
    if (offset) *offset = c->host_parts.parts[i].offset;
    if (bytes) *bytes = c->host_parts.parts[i].bytes;
  }
  return n;
}

uint64_t kvtier_hbm_granule(const kvtier_client* c) { return c != nullptr ? c->hbm.classes.granule : 0; }

uint64_t kvtier_hbm_arena_bytes(const kvtier_client* c) { return c != nullptr ? c->hbm.arena_bytes : 0; }

uint64_t kvtier_host_granule(const kvtier_client* c) {
  return c != nullptr && c->host != nullptr ? c->host_classes.granule : 0;
}

uint32_t kvtier_host_slot_classes(const kvtier_client* c, uint64_t* bytes, uint32_t cap) {
  if (c == nullptr || c->host == nullptr) return 0;
  const auto& t = c->host_classes;
  for (uint32_t i = 0; bytes != nullptr && i < t.count && i < cap; ++i) bytes[i] = t.class_bytes[i];
  return t.count;
}

const void* kvtier_host_slot(const kvtier_client* c, uint32_t slot) {
  uint64_t off = 0;
  return c != nullptr && HostSlot(c, slot, &off) ? c->host + off : nullptr;
}

void* kvtier_host_slot_write(const kvtier_client* c, uint32_t slot) {
  uint64_t off = 0;
  if (c == nullptr || !HostSlot(c, slot, &off) || off < c->host_arena_bytes) return nullptr;  // the arena is read-only
  return c->host + off;
}

// The contract this client registered under `contract_id` (call under c->mu), or null with
// the last error set to NOT_FOUND.
static const RegisteredContract* FindContract(kvtier_client* c, uint64_t contract_id) {
  auto it = c->contracts.find(contract_id);
  if (it == c->contracts.end()) {
    Fail(KVTIER_NOT_FOUND, "contract " + kvtier::ContractIdHex(contract_id) +
                               " was not registered by this client (kvtier_register_contract)");
    return nullptr;
  }
  return &it->second;
}

kvtier_status kvtier_contract_slot(kvtier_client* c, uint64_t contract_id, uint64_t* slot_bytes, double* fill) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  std::lock_guard<std::mutex> l(c->mu);
  const RegisteredContract* rc = FindContract(c, contract_id);
  if (rc == nullptr) return KVTIER_NOT_FOUND;
  if (slot_bytes) *slot_bytes = rc->host_slot_bytes;
  if (fill) *fill = rc->fill;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_contract_hbm_slot(kvtier_client* c, uint64_t contract_id, uint64_t* slot_bytes) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  std::lock_guard<std::mutex> l(c->mu);
  const RegisteredContract* rc = FindContract(c, contract_id);
  if (rc == nullptr) return KVTIER_NOT_FOUND;
  if (slot_bytes) *slot_bytes = rc->hbm_slot_bytes;
  return Ok();
  KVTIER_GUARD_END
}
uint64_t kvtier_attach_generation(const kvtier_client* c) { return c ? c->attaches : 0; }

void* kvtier_host_arena(const kvtier_client* c, uint64_t* bytes) {
  if (bytes) *bytes = c ? c->host_bytes : 0;
  return c ? c->host : nullptr;
}

// The daemon sends the HBM arena's IPC handle only to a client that attached with has_gpu.
constexpr const char* kNoGpuHandle =
    "this client attached without has_gpu (kvtier_connect_options): kvtierd gives the HBM arena only to GPU "
    "clients; connect with has_gpu = 1";

kvtier_status kvtier_hbm_ipc_handle(const kvtier_client* c, uint8_t out[64]) {
  if (CheckClient(c) || out == nullptr) return Fail(KVTIER_INVALID, "client and out are required");
  if (!c->has_gpu) return Fail(KVTIER_INVALID, kNoGpuHandle);
  if (!(c->reply.flags & w::kReplyHasHbm)) return Fail(KVTIER_UNSUPPORTED, "the daemon has no HBM tier");
  std::memcpy(out, c->reply.hbm_ipc_handle, 64);
  return Ok();
}

kvtier_status kvtier_hbm_open(kvtier_client* c, void** dev_ptr) {
  if (CheckClient(c) || dev_ptr == nullptr) return Fail(KVTIER_INVALID, "client and dev_ptr are required");
  if (!c->has_gpu) return Fail(KVTIER_INVALID, kNoGpuHandle);
  if (!(c->reply.flags & w::kReplyHasHbm)) return Fail(KVTIER_UNSUPPORTED, "the daemon has no HBM tier");
#if KVTIER_HAVE_CUDA
  std::lock_guard<std::mutex> l(c->mu);
  if (c->hbm_ptr == nullptr) {
    cudaIpcMemHandle_t h;
    static_assert(sizeof h == 64, "cudaIpcMemHandle_t is 64 bytes");
    std::memcpy(&h, c->reply.hbm_ipc_handle, sizeof h);
    const cudaError_t e = cudaIpcOpenMemHandle(&c->hbm_ptr, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      c->hbm_ptr = nullptr;
      return Fail(KVTIER_IO_ERROR, std::string("cudaIpcOpenMemHandle: ") + cudaGetErrorString(e));
    }
  }
  *dev_ptr = c->hbm_ptr;
  return Ok();
#else
  return Fail(KVTIER_UNSUPPORTED, "libkvtier was built without CUDA");
#endif
}

kvtier_status kvtier_contract_id(const kvtier_contract_desc* d, uint64_t* id) {
  KVTIER_GUARD_BEGIN
  if (id == nullptr) return Fail(KVTIER_INVALID, "id is NULL");
  kvtier::ScaleContract c;
  kvtier::Status s = ToContract(d, &c);
  if (!s.ok()) return FromStatus(s);
  *id = c.Id();
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_contract_block_bytes(const kvtier_contract_desc* d, uint64_t* bytes) {
  KVTIER_GUARD_BEGIN
  if (bytes == nullptr) return Fail(KVTIER_INVALID, "bytes is NULL");
  kvtier::ScaleContract c;
  kvtier::Status s = ToContract(d, &c);
  if (!s.ok()) return FromStatus(s);
  *bytes = c.block_bytes();
  return Ok();
  KVTIER_GUARD_END
}

static kvtier_status RegisterContract(kvtier_client* c, const kvtier_contract_desc* d, bool shared,
                                      uint64_t* contract_id) {
  if (CheckClient(c)) return KVTIER_INVALID;
  kvtier::ScaleContract sc;
  kvtier::Status s = ToContract(d, &sc);
  if (!s.ok()) return FromStatus(s);
  const auto bytes = sc.Serialize();
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kRegisterContract);
  req.flags = shared ? w::kRequestShared : 0;
  req.count = static_cast<uint32_t>(bytes.size());
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  kvtier_status st = Call(c, req, bytes.data(), bytes.size(), nullptr, 0, &cmp);
  if (st != KVTIER_OK) return st;
  const uint64_t want = shared ? kvtier::SharedContractId(sc.Id()) : sc.Id();
  if (cmp.value != want) return Fail(KVTIER_IO_ERROR, "daemon returned a different contract id");
  RegisteredContract rc{sc.geometry.block_tokens, sc.block_bytes(), bytes, shared};
  SetSlotFit(c, cmp, &rc);
  c->contracts[cmp.value] = std::move(rc);
  if (contract_id) *contract_id = cmp.value;
  return Ok();
}

kvtier_status kvtier_register_contract(kvtier_client* c, const kvtier_contract_desc* d,
                                       uint64_t* contract_id) {
  KVTIER_GUARD_BEGIN
  return RegisterContract(c, d, false, contract_id);
  KVTIER_GUARD_END
}

kvtier_status kvtier_register_contract_shared(kvtier_client* c, const kvtier_contract_desc* d, uint64_t* handle) {
  KVTIER_GUARD_BEGIN
  return RegisterContract(c, d, true, handle);
  KVTIER_GUARD_END
}

kvtier_status kvtier_key_chain(uint64_t contract_id, const uint32_t* tokens, size_t n_tokens,
                               uint32_t block_tokens, kvtier_key* out, size_t out_cap, size_t* n_keys) {
  KVTIER_GUARD_BEGIN
  if (block_tokens == 0) return Fail(KVTIER_INVALID, "block_tokens must be > 0");
  if (n_tokens > 0 && tokens == nullptr) return Fail(KVTIER_INVALID, "tokens is NULL");
  const size_t n = n_tokens / block_tokens;
  if (n_keys) *n_keys = n;
  if (n > out_cap || (n > 0 && out == nullptr)) {
    return Fail(KVTIER_INVALID, "out has room for " + std::to_string(out_cap) + " keys, " +
                                    std::to_string(n) + " needed");
  }
  const auto keys = kvtier::KeyChain(contract_id, std::span<const uint32_t>(tokens, n_tokens), block_tokens);
  for (size_t i = 0; i < n; ++i) out[i] = kvtier_key{keys[i].hi, keys[i].lo};
  return Ok();
  KVTIER_GUARD_END
}

// ---- token-level calls ----------------------------------------------------------------

kvtier_status kvtier_contract_block_tokens(kvtier_client* c, uint64_t contract_id, uint32_t* block_tokens) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (block_tokens == nullptr) return Fail(KVTIER_INVALID, "block_tokens is NULL");
  std::lock_guard<std::mutex> l(c->mu);
  const RegisteredContract* rc = FindContract(c, contract_id);
  if (rc == nullptr) return KVTIER_NOT_FOUND;
  *block_tokens = rc->block_tokens;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_key_chain_tokens(kvtier_client* c, uint64_t contract_id, const uint32_t* tokens,
                                      size_t n_tokens, kvtier_key* out, size_t out_cap, size_t* n_keys) {
  uint32_t bt = 0;
  const kvtier_status s = kvtier_contract_block_tokens(c, contract_id, &bt);
  if (s != KVTIER_OK) return s;
  return kvtier_key_chain(contract_id, tokens, n_tokens, bt, out, out_cap, n_keys);
}

namespace {
// Keys of the blocks a prompt of n_tokens may reuse: every full block, but never the one
// holding the last prompt token (the engine recomputes it to get the next token's logits).
kvtier_status ReusableKeys(kvtier_client* c, uint64_t contract_id, const uint32_t* tokens, size_t n_tokens,
                           std::vector<kvtier_key>* keys, uint32_t* block_tokens) {
  kvtier_status s = kvtier_contract_block_tokens(c, contract_id, block_tokens);
  if (s != KVTIER_OK) return s;
  const size_t usable = n_tokens == 0 ? 0 : (n_tokens - 1) / *block_tokens;
  keys->assign(usable, kvtier_key{0, 0});
  size_t n = 0;
  return kvtier_key_chain(contract_id, tokens, usable * *block_tokens, *block_tokens, keys->data(),
                          keys->size(), &n);
}
}  // namespace

kvtier_status kvtier_lookup_tokens(kvtier_client* c, uint64_t contract_id, const uint32_t* tokens,
                                   size_t n_tokens, size_t* cached_tokens) {
  KVTIER_GUARD_BEGIN
  if (cached_tokens == nullptr) return Fail(KVTIER_INVALID, "cached_tokens is NULL");
  *cached_tokens = 0;
  std::vector<kvtier_key> keys;
  uint32_t bt = 0;
  kvtier_status s = ReusableKeys(c, contract_id, tokens, n_tokens, &keys, &bt);
  if (s != KVTIER_OK) return s;
  kvtier_lookup_result r{};
  s = kvtier_lookup(c, contract_id, keys.data(), keys.size(), &r, nullptr);
  if (s != KVTIER_OK) return s;
  *cached_tokens = r.hit_blocks * bt;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_commit_chain(kvtier_client* c, uint64_t contract_id, uint64_t lease,
                                  const kvtier_slot* slots, const kvtier_key* keys, size_t n,
                                  kvtier_key parent, size_t* n_committed) {
  KVTIER_GUARD_BEGIN
  if (n_committed) *n_committed = 0;
  if (slots == nullptr || keys == nullptr) return Fail(KVTIER_INVALID, "slots and keys are required");
  std::vector<kvtier_commit_item> items(n);
  for (size_t i = 0; i < n; ++i) items[i] = kvtier_commit_item{slots[i], keys[i], i ? keys[i - 1] : parent};
  return kvtier_commit(c, contract_id, lease, items.data(), n, n_committed);
  KVTIER_GUARD_END
}

kvtier_status kvtier_store_tokens(kvtier_client* c, uint64_t contract_id, const uint32_t* tokens,
                                  size_t n_tokens, const void* const* blocks, size_t* stored_blocks) {
  KVTIER_GUARD_BEGIN
  if (stored_blocks) *stored_blocks = 0;
  uint32_t bt = 0;
  kvtier_status s = kvtier_contract_block_tokens(c, contract_id, &bt);
  if (s != KVTIER_OK) return s;
  const size_t nkeys = n_tokens / bt;
  if (nkeys > 0 && blocks == nullptr) return Fail(KVTIER_INVALID, "blocks is NULL");
  std::vector<kvtier_key> keys(nkeys);
  size_t n = 0;
  s = kvtier_key_chain(contract_id, tokens, n_tokens, bt, keys.data(), keys.size(), &n);
  if (s != KVTIER_OK) return s;
  kvtier_lookup_result r{};
  s = kvtier_lookup(c, contract_id, keys.data(), keys.size(), &r, nullptr);
  if (s != KVTIER_OK) return s;
  uint64_t block_bytes = 0;
  {
    std::lock_guard<std::mutex> l(c->mu);
    block_bytes = c->contracts[contract_id].block_bytes;
  }
  if (r.hit_blocks < nkeys && c->host == nullptr) return Fail(KVTIER_UNSUPPORTED, "the daemon has no host tier");
  // The uncached tail, in leases of at most max_keys_per_request blocks each.
  const size_t chunk = c->reply.max_keys_per_request ? c->reply.max_keys_per_request : 65536;
  size_t done = r.hit_blocks;
  std::string conflict;  // the last KVTIER_CONFLICT's line
  while (done < nkeys) {
    const size_t m = std::min(chunk, nkeys - done);
    uint64_t lease = 0;
    std::vector<kvtier_slot> slots(m);
    s = kvtier_alloc(c, contract_id, m, KVTIER_TIER_HOST, &lease, slots.data());
    if (s != KVTIER_OK) return s;
    for (size_t i = 0; i < m; ++i) {
      if (blocks[done + i] == nullptr) {
        (void)kvtier_release(c, lease);
        return Fail(KVTIER_INVALID, "blocks[" + std::to_string(done + i) + "] is NULL");
      }
      void* dst = kvtier_host_slot_write(c, slots[i].slot);
      if (dst == nullptr) return Fail(KVTIER_IO_ERROR, "alloc gave slot " + std::to_string(slots[i].slot) +
                                                           ", outside this client's staging area");
      std::memcpy(dst, blocks[done + i], block_bytes);
    }
    size_t committed = 0;
    s = kvtier_commit_chain(c, contract_id, lease, slots.data(), keys.data() + done, m,
                            done ? keys[done - 1] : kvtier_key{0, 0}, &committed);
    const std::string err = s == KVTIER_OK ? "" : kvtier_last_error();
    (void)kvtier_release(c, lease);  // committed blocks stay cached, unpinned
    if (stored_blocks) *stored_blocks += committed;
    if (s == KVTIER_CONFLICT) conflict = err;  // the rest is stored all the same
    else if (s != KVTIER_OK) return Fail(s, err);
    done += m;
  }
  if (!conflict.empty()) return Fail(KVTIER_CONFLICT, conflict);
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_load_tokens(kvtier_client* c, uint64_t contract_id, const uint32_t* tokens,
                                 size_t n_tokens, kvtier_tier target, uint64_t* lease,
                                 kvtier_slot* slots_out, size_t slots_cap, size_t* cached_tokens) {
  KVTIER_GUARD_BEGIN
  if (lease == nullptr || cached_tokens == nullptr) return Fail(KVTIER_INVALID, "lease and cached_tokens are required");
  *lease = 0;
  *cached_tokens = 0;
  std::vector<kvtier_key> keys;
  uint32_t bt = 0;
  kvtier_status s = ReusableKeys(c, contract_id, tokens, n_tokens, &keys, &bt);
  if (s != KVTIER_OK) return s;
  if (keys.size() > slots_cap || (!keys.empty() && slots_out == nullptr)) {
    return Fail(KVTIER_INVALID, "slots_out has room for " + std::to_string(slots_cap) + " slots, " +
                                    std::to_string(keys.size()) + " needed");
  }
  size_t n = 0;
  s = kvtier_acquire(c, contract_id, keys.data(), keys.size(), target, lease, slots_out, &n);
  if (s != KVTIER_OK) return s;
  *cached_tokens = n * bt;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_lookup(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys, size_t n,
                            kvtier_lookup_result* result, uint8_t* tiers_out) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (result == nullptr) return Fail(KVTIER_INVALID, "result is required");
  if (n == 0) {  // a prompt shorter than a block: nothing cached, nothing to ask
    *result = kvtier_lookup_result{0, 0.0};
    return Ok();
  }
  if (keys == nullptr) return Fail(KVTIER_INVALID, "keys is NULL");
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many keys");
  std::vector<uint8_t> tiers_buf;
  uint8_t* tout = tiers_out;
  if (tout == nullptr) {
    tiers_buf.resize(n);
    tout = tiers_buf.data();
  }
  std::lock_guard<std::mutex> l(c->mu);
  // Long requests go in chunks under max_keys_per_request (and the ring's data area); the
  // prefix ends in the first chunk that is not a full hit.
  const size_t chunk = KeyChunk(c, sizeof(kvtier_key) + 1);
  size_t hit = 0;
  double est = 0.0;
  for (size_t off = 0; off < n;) {
    const size_t m = std::min(chunk, n - off);
    w::RequestEntry req;
    req.op = static_cast<uint16_t>(w::Op::kLookup);
    req.count = static_cast<uint32_t>(m);
    req.contract_id = contract_id;
    w::CompletionEntry cmp;
    kvtier_status st = Call(c, req, keys + off, m * sizeof(kvtier_key), tout + off, m, &cmp);
    if (st != KVTIER_OK) return st;
    hit += cmp.count;
    est += cmp.est_seconds;
    off += m;
    if (cmp.count < m) {
      std::memset(tout + off, KVTIER_TIER_NONE, n - off);
      break;
    }
  }
  result->hit_blocks = hit;
  result->est_seconds_to_hbm = est;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_acquire(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys, size_t n,
                             kvtier_tier target, uint64_t* lease, kvtier_slot* slots_out, size_t* n_slots) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (lease == nullptr || n_slots == nullptr) return Fail(KVTIER_INVALID, "lease and n_slots are required");
  if (n == 0) {  // 0 hits: no lease, as for a miss
    *lease = 0;
    *n_slots = 0;
    return Ok();
  }
  if (keys == nullptr || slots_out == nullptr) return Fail(KVTIER_INVALID, "keys and slots_out are required");
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many keys");
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kAcquire);
  req.count = static_cast<uint32_t>(n);
  req.contract_id = contract_id;
  req.tier = static_cast<uint8_t>(target);
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  *lease = 0;
  *n_slots = 0;
  kvtier_status st = Call(c, req, keys, n * sizeof(kvtier_key), slots_out, n * sizeof(kvtier_slot), &cmp);
  if (st != KVTIER_OK) return st;
  *lease = cmp.value;
  *n_slots = cmp.count;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_alloc(kvtier_client* c, uint64_t contract_id, size_t n, kvtier_tier target,
                           uint64_t* lease, kvtier_slot* slots_out) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (n == 0 || lease == nullptr || slots_out == nullptr) return Fail(KVTIER_INVALID, "n > 0, lease and slots_out are required");
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many slots");
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kAlloc);
  req.count = static_cast<uint32_t>(n);
  req.contract_id = contract_id;
  req.tier = static_cast<uint8_t>(target);
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  *lease = 0;
  kvtier_status st = Call(c, req, nullptr, 0, slots_out, n * sizeof(kvtier_slot), &cmp);
  if (st != KVTIER_OK) return st;
  if (cmp.count != n) return Fail(KVTIER_IO_ERROR, "alloc returned a different slot count");
  *lease = cmp.value;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_alloc_wait(kvtier_client* c, uint64_t contract_id, size_t n, kvtier_tier target,
                                uint32_t wait_ms, uint64_t* lease, kvtier_slot* slots_out) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  auto pause = std::chrono::milliseconds(1);
  while (true) {
    const kvtier_status s = kvtier_alloc(c, contract_id, n, target, lease, slots_out);
    if (s != KVTIER_RETRY || std::chrono::steady_clock::now() + pause > deadline) return s;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

kvtier_status kvtier_commit(kvtier_client* c, uint64_t contract_id, uint64_t lease,
                            const kvtier_commit_item* items, size_t n, size_t* n_committed) {
  KVTIER_GUARD_BEGIN
  kvtier_commit_result r{};
  const kvtier_status s = kvtier_commit_report(c, contract_id, lease, items, n, &r);
  const size_t kept_other = r.different_bytes - r.replaced;  // cached with other bytes, kept
  if (n_committed) *n_committed = r.committed - kept_other - r.disputed;
  if (s != KVTIER_OK || kept_other + r.disputed == 0) return s;
  std::string why = std::to_string(kept_other + r.disputed) + " of " + std::to_string(r.committed) +
                    " keys do not hold these bytes:";
  if (kept_other > 0) {
    why += " " + std::to_string(kept_other) +
           " already cached with different bytes (tiers.on_conflict keeps or drops the cached block; the "
           "daemon logs the conflict)";
  }
  if (r.disputed > 0) {
    why += std::string(kept_other > 0 ? ";" : "") + " " + std::to_string(r.disputed) +
           " disputed (tiers.on_conflict = drop-disputed) and still pinned by another lease: nothing is served "
           "under them until the disputed block goes; commit again then";
  }
  return Fail(KVTIER_CONFLICT, why + ". They are not counted as committed (kvtier_commit_report gives the counts)");
  KVTIER_GUARD_END
}

kvtier_status kvtier_commit_report(kvtier_client* c, uint64_t contract_id, uint64_t lease,
                                   const kvtier_commit_item* items, size_t n, kvtier_commit_result* result) {
  KVTIER_GUARD_BEGIN
  kvtier_commit_result scratch{};
  kvtier_commit_result* r = result ? result : &scratch;
  *r = kvtier_commit_result{};
  if (CheckClient(c)) return KVTIER_INVALID;
  if (items == nullptr || n == 0) return Fail(KVTIER_INVALID, "items and n > 0 are required");
  if (n > UINT32_MAX) return Fail(KVTIER_INVALID, "too many items");
  std::vector<w::CommitItem> wi(n);
  for (size_t i = 0; i < n; ++i) {
    wi[i].slot = items[i].slot.slot;
    wi[i].tier = items[i].slot.tier;
    wi[i].key = w::WireKey{items[i].key.hi, items[i].key.lo};
    wi[i].parent = w::WireKey{items[i].parent.hi, items[i].parent.lo};
  }
  std::lock_guard<std::mutex> l(c->mu);
  const size_t chunk = KeyChunk(c, sizeof(w::CommitItem));
  size_t done = 0;
  for (size_t off = 0; off < n;) {
    const size_t m = std::min(chunk, n - off);
    w::RequestEntry req;
    req.op = static_cast<uint16_t>(w::Op::kCommit);
    req.count = static_cast<uint32_t>(m);
    req.contract_id = contract_id;
    req.lease_id = lease;
    w::CompletionEntry cmp;
    kvtier_status st = Call(c, req, wi.data() + off, m * sizeof(w::CommitItem), nullptr, 0, &cmp);
    const size_t went = std::min<size_t>(cmp.count, m);
    // A daemon of protocol < 5 leaves these zero (reserved bytes): every item "stored";
    // one of protocol < 8 no replaced (each different key counts as not stored) and no
    // disputed. The disputed keys are in cached_different on the wire (wire.h).
    const size_t same = std::min<size_t>(cmp.cached_same, went);
    const size_t diff_all = std::min<size_t>(cmp.cached_different, went - same);
    const size_t disp = std::min<size_t>(cmp.cached_disputed, diff_all);
    const size_t repl = std::min<size_t>(cmp.cached_replaced, diff_all - disp);
    const size_t unch = std::min<size_t>(cmp.cached_unchecked, went - same - diff_all);
    done += went;
    r->committed = done;
    r->same_bytes += same;
    r->different_bytes += diff_all - disp;
    r->replaced += repl;
    r->disputed += disp;
    r->unchecked += unch;
    r->stored += went - same - diff_all - unch;
    if (st != KVTIER_OK) return st;
    off += m;
  }
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_release(kvtier_client* c, uint64_t lease) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (lease == 0) return Ok();  // the lease of a miss: nothing to end, like free(NULL)
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kRelease);
  req.lease_id = lease;
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  return Call(c, req, nullptr, 0, nullptr, 0, &cmp);
  KVTIER_GUARD_END
}

kvtier_status kvtier_prefetch(kvtier_client* c, uint64_t contract_id, const kvtier_key* keys, size_t n,
                              kvtier_tier target) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (n == 0) return Ok();
  if (keys == nullptr || n > UINT32_MAX) return Fail(KVTIER_INVALID, "keys are required");
  std::lock_guard<std::mutex> l(c->mu);
  const size_t chunk = KeyChunk(c, sizeof(kvtier_key));
  for (size_t off = 0; off < n;) {
    const size_t m = std::min(chunk, n - off);
    w::RequestEntry req;
    req.op = static_cast<uint16_t>(w::Op::kPrefetch);
    req.count = static_cast<uint32_t>(m);
    req.contract_id = contract_id;
    req.tier = static_cast<uint8_t>(target);
    w::CompletionEntry cmp;
    kvtier_status st = Call(c, req, keys + off, m * sizeof(kvtier_key), nullptr, 0, &cmp);
    if (st != KVTIER_OK) return st;
    off += m;
  }
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_stats(kvtier_client* c, kvtier_tier_stats* out, size_t cap, size_t* n) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  if (out == nullptr || cap == 0 || n == nullptr) return Fail(KVTIER_INVALID, "out, cap > 0 and n are required");
  const uint32_t want = static_cast<uint32_t>(std::min<size_t>(cap, 8));
  std::vector<w::WireTierStats> ws(want);
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kStats);
  req.count = want;
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  kvtier_status st = Call(c, req, nullptr, 0, ws.data(), want * sizeof(w::WireTierStats), &cmp);
  if (st != KVTIER_OK) return st;
  *n = std::min<size_t>(cmp.count, want);
  // Both records come from one field list (formats/tier_stats_fields.h): field by field.
  for (size_t i = 0; i < *n; ++i) {
    kvtier_tier_stats& o = out[i];
    o = kvtier_tier_stats{};
    o.tier = ws[i].tier;
    o.present = ws[i].present;
    o.slab_moves = ws[i].slab_moves;
#define KVTIER_STATS_COPY_(type, name) o.name = ws[i].name;
    KVTIER_TIER_STATS_FIELDS(KVTIER_STATS_COPY_)
#undef KVTIER_STATS_COPY_
  }
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_ping(kvtier_client* c) {
  KVTIER_GUARD_BEGIN
  if (CheckClient(c)) return KVTIER_INVALID;
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kNop);
  w::CompletionEntry cmp;
  std::lock_guard<std::mutex> l(c->mu);
  return Call(c, req, nullptr, 0, nullptr, 0, &cmp);
  KVTIER_GUARD_END
}


// ---- operator requests ---------------------------------------------------------------

// Keys go out, and slots and the operator records come back, as the caller's C arrays:
// every field of each must sit where the wire record (formats/wire.h) puts it.
#define KVT_SAME_FIELD(c_rec, w_rec, f)                                                              \
  static_assert(offsetof(c_rec, f) == offsetof(w_rec, f) &&                                          \
                    sizeof(static_cast<c_rec*>(nullptr)->f) == sizeof(static_cast<w_rec*>(nullptr)->f), \
                #c_rec "." #f " differs from the wire");
#define KVT_KEY(f) KVT_SAME_FIELD(kvtier_key, w::WireKey, f)
#define KVT_SLOT(f) KVT_SAME_FIELD(kvtier_slot, w::WireSlot, f)
#define KVT_BLOCK(f) KVT_SAME_FIELD(kvtier_block_info, w::AdminBlockInfo, f)
#define KVT_VERIFY(f) KVT_SAME_FIELD(kvtier_verify_report, w::AdminVerifyReport, f)
#define KVT_CONTRACT(f) KVT_SAME_FIELD(kvtier_contract_info, w::AdminContractInfo, f)
static_assert(sizeof(kvtier_key) == sizeof(w::WireKey) && sizeof(kvtier_slot) == sizeof(w::WireSlot));
static_assert(sizeof(kvtier_block_info) == sizeof(w::AdminBlockInfo));
static_assert(sizeof(kvtier_verify_report) == sizeof(w::AdminVerifyReport));
static_assert(sizeof(kvtier_contract_info) == sizeof(w::AdminContractInfo));
KVT_KEY(hi) KVT_KEY(lo)
KVT_SLOT(tier) KVT_SLOT(from_tier) KVT_SLOT(slot)
KVT_BLOCK(contract_id) KVT_BLOCK(key) KVT_BLOCK(parent) KVT_BLOCK(bytes) KVT_BLOCK(where) KVT_BLOCK(uses)
KVT_BLOCK(hbm_slot) KVT_BLOCK(host_slot) KVT_BLOCK(pins_hbm) KVT_BLOCK(pins_host) KVT_BLOCK(nvme_record)
KVT_BLOCK(nvme_hits) KVT_BLOCK(payload_xxh3) KVT_BLOCK(header_xxh3)
KVT_VERIFY(total) KVT_VERIFY(checked) KVT_VERIFY(ok) KVT_VERIFY(corrupt) KVT_VERIFY(missing) KVT_VERIFY(io_errors)
KVT_CONTRACT(contract_id) KVT_CONTRACT(block_bytes) KVT_CONTRACT(blocks) KVT_CONTRACT(contract_bytes)
#undef KVT_KEY
#undef KVT_SLOT
#undef KVT_BLOCK
#undef KVT_VERIFY
#undef KVT_CONTRACT
#undef KVT_SAME_FIELD

static kvtier_status Admin(kvtier_client* c, const w::AdminRequest& a, void* out, size_t out_cap,
                           w::CompletionEntry* cmp) {
  if (CheckClient(c)) return KVTIER_INVALID;
  kvtier::Status v = w::ValidateAdminRequest(a);
  if (!v.ok()) return Fail(KVTIER_INVALID, v.message());
  if (out_cap > UINT32_MAX) out_cap = UINT32_MAX;
  w::RequestEntry req;
  req.op = static_cast<uint16_t>(w::Op::kAdmin);
  std::lock_guard<std::mutex> l(c->mu);
  return Call(c, req, &a, sizeof a, out, out_cap, cmp);
}

kvtier_status kvtier_list_contracts(kvtier_client* c, uint64_t offset, uint32_t limit, void* out,
                                    size_t out_cap, size_t* out_bytes, uint32_t* n, uint64_t* total) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr || out_bytes == nullptr || n == nullptr || total == nullptr) {
    return Fail(KVTIER_INVALID, "out, out_bytes, n and total are required");
  }
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kListContracts);
  a.offset = offset;
  a.limit = limit;
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, out, out_cap, &cmp);
  if (st != KVTIER_OK) return st;
  *out_bytes = cmp.out_bytes;
  *n = cmp.count;
  *total = cmp.value;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_list_blocks(kvtier_client* c, uint64_t contract_id, kvtier_tier tier, uint64_t offset,
                                 uint32_t limit, kvtier_block_info* out, uint32_t* n, uint64_t* total) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr || n == nullptr || total == nullptr) return Fail(KVTIER_INVALID, "out, n and total are required");
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kListBlocks);
  a.contract_id = contract_id;
  a.tier = static_cast<uint8_t>(tier);
  a.offset = offset;
  a.limit = limit;
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, out, size_t{limit} * sizeof(kvtier_block_info), &cmp);
  if (st != KVTIER_OK) return st;
  *n = std::min<uint32_t>(cmp.count, limit);
  *total = cmp.value;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_inspect(kvtier_client* c, uint64_t contract_id, kvtier_key key, kvtier_block_info* out) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr) return Fail(KVTIER_INVALID, "out is required");
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kInspect);
  a.contract_id = contract_id;
  a.key = {key.hi, key.lo};
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, out, sizeof *out, &cmp);
  if (st != KVTIER_OK) return st;
  if (cmp.count != 1) return Fail(KVTIER_IO_ERROR, "inspect reply holds no block");
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_verify_nvme(kvtier_client* c, uint64_t offset, uint32_t limit, kvtier_verify_report* out) {
  KVTIER_GUARD_BEGIN
  if (out == nullptr) return Fail(KVTIER_INVALID, "out is required");
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kVerifyNvme);
  a.offset = offset;
  a.limit = limit;
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, out, sizeof *out, &cmp);
  if (st != KVTIER_OK) return st;
  if (cmp.count != 1) return Fail(KVTIER_IO_ERROR, "verify reply holds no report");
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_evict(kvtier_client* c, uint64_t contract_id, kvtier_key key) {
  KVTIER_GUARD_BEGIN
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kEvictKey);
  a.contract_id = contract_id;
  a.key = {key.hi, key.lo};
  w::CompletionEntry cmp;
  return Admin(c, a, nullptr, 0, &cmp);
  KVTIER_GUARD_END
}

kvtier_status kvtier_evict_contract(kvtier_client* c, uint64_t contract_id, uint64_t* evicted, uint64_t* skipped) {
  KVTIER_GUARD_BEGIN
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kEvictContract);
  a.contract_id = contract_id;
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, nullptr, 0, &cmp);
  if (st != KVTIER_OK) return st;
  if (evicted) *evicted = cmp.value;
  if (skipped) *skipped = cmp.count;
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_flush(kvtier_client* c) { return kvtier_flush_to(c, KVTIER_TIER_NVME); }

kvtier_status kvtier_flush_to(kvtier_client* c, kvtier_tier to) {
  KVTIER_GUARD_BEGIN
  if (to != KVTIER_TIER_HOST && to != KVTIER_TIER_NVME) {
    return Fail(KVTIER_INVALID, "kvtier_flush_to: target must be KVTIER_TIER_HOST or KVTIER_TIER_NVME");
  }
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kFlush);
  a.tier = static_cast<uint8_t>(to);
  w::CompletionEntry cmp;
  return Admin(c, a, nullptr, 0, &cmp);
  KVTIER_GUARD_END
}

kvtier_status kvtier_tenant_stats(kvtier_client* c, kvtier_tenant_counters* out, size_t cap, size_t* n) {
  KVTIER_GUARD_BEGIN
  static_assert(sizeof(kvtier_tenant_counters) == sizeof(w::AdminTenantStats));
  if (n == nullptr) return Fail(KVTIER_INVALID, "n is NULL");
  *n = 0;
  if (cap > 0 && out == nullptr) return Fail(KVTIER_INVALID, "out is NULL");
  while (*n < cap) {
    w::AdminRequest a;
    a.action = static_cast<uint16_t>(w::AdminAction::kTenantStats);
    a.offset = *n;
    a.limit = static_cast<uint32_t>(std::min<size_t>(cap - *n, 256));
    std::vector<w::AdminTenantStats> page(a.limit);
    w::CompletionEntry cmp;
    kvtier_status st = Admin(c, a, page.data(), page.size() * sizeof(w::AdminTenantStats), &cmp);
    if (st != KVTIER_OK) return st;
    const size_t got = std::min<size_t>(cmp.count, page.size());
    for (size_t i = 0; i < got; ++i) {
      std::memcpy(&out[*n + i], &page[i], sizeof page[i]);
      out[*n + i].name[sizeof out[*n + i].name - 1] = '\0';
    }
    *n += got;
    if (got == 0 || *n >= cmp.value) break;
  }
  return Ok();
  KVTIER_GUARD_END
}

kvtier_status kvtier_reload_config(kvtier_client* c, char* msg, size_t msg_cap) {
  KVTIER_GUARD_BEGIN
  w::AdminRequest a;
  a.action = static_cast<uint16_t>(w::AdminAction::kReloadConfig);
  std::vector<char> buf(1024);
  w::CompletionEntry cmp;
  kvtier_status st = Admin(c, a, buf.data(), buf.size(), &cmp);
  if (st != KVTIER_OK) return st;
  if (msg != nullptr && msg_cap > 0) {
    const size_t n = std::min<size_t>(cmp.out_bytes, msg_cap - 1);
    std::memcpy(msg, buf.data(), n);
    msg[n] = '\0';
  }
  return Ok();
  KVTIER_GUARD_END
}

}  // extern "C"
