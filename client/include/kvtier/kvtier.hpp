// Thin C++ wrapper over the C ABI (kvtier.h): RAII for the client handle and for leases
// (ScopedLease), containers in place of pointer+count pairs. Builds as C++17 and C++20
// (PyTorch extensions are C++17): Span is a minimal view that any contiguous container,
// and std::span where the library has it, converts to. No exceptions: every call returns
// an Error with the C status and the error line, so it can sit on a data path; an empty
// result is a success with nothing in it, never an error in disguise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kvtier/kvtier.h"

namespace kvtier::client {

// A pointer and a count (what std::span<T> is in C++20): built from std::vector,
// std::array, std::span, a C array, or (pointer, size).
template <typename T>
class Span {
 public:
  Span() = default;
  Span(T* p, size_t n) : p_(p), n_(n) {}
  template <size_t N>
  Span(T (&a)[N]) : p_(a), n_(N) {}  // NOLINT: implicit, like std::span
  template <typename C,
            typename = std::enable_if_t<std::is_convertible_v<decltype(std::declval<C&>().data()), T*> &&
                                        std::is_convertible_v<decltype(std::declval<C&>().size()), size_t>>>
  Span(C& c) : p_(c.data()), n_(c.size()) {}  // NOLINT: implicit, like std::span
  template <typename C,
            typename = std::enable_if_t<std::is_const_v<T> &&
                                        std::is_convertible_v<decltype(std::declval<const C&>().data()), T*>>,
            typename = void>
  Span(const C& c) : p_(c.data()), n_(c.size()) {}  // NOLINT: implicit, like std::span
  T* data() const { return p_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](size_t i) const { return p_[i]; }
  T* begin() const { return p_; }
  T* end() const { return p_ + n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

struct Error {
  kvtier_status status = KVTIER_OK;
  std::string message;
  bool ok() const { return status == KVTIER_OK; }
  explicit operator bool() const { return ok(); }
};

inline Error LastError(kvtier_status s) { return Error{s, s == KVTIER_OK ? "" : kvtier_last_error()}; }

struct LookupResult {
  size_t hit_blocks = 0;
  double est_seconds_to_hbm = 0.0;
  std::vector<uint8_t> tiers;  // one per key; KVTIER_TIER_NONE from the first miss on
};

// A lease as plain data: the caller releases it (Client::Release). ScopedLease below does
// that by itself.
struct Lease {
  uint64_t id = 0;                 // 0: no lease (nothing acquired)
  std::vector<kvtier_slot> slots;
};

// Key chain of a prompt (pure computation; identical to the daemon's and Python's):
// *keys gets one key per full block, none for a prompt shorter than a block (a success).
// INVALID (and *keys empty) for block_tokens 0 or a NULL token pointer.
inline Error KeyChain(uint64_t contract_id, Span<const uint32_t> tokens, uint32_t block_tokens,
                      std::vector<kvtier_key>* keys) {
  keys->assign(block_tokens ? tokens.size() / block_tokens : 0, kvtier_key{0, 0});
  size_t n = 0;
  const kvtier_status s = kvtier_key_chain(contract_id, tokens.data(), tokens.size(), block_tokens,
                                           keys->data(), keys->size(), &n);
  keys->resize(s == KVTIER_OK ? n : 0);
  return LastError(s);
}
// The same, for callers that need no error: an empty vector for both a short prompt and
// an error. Prefer the overload above, which tells them apart.
inline std::vector<kvtier_key> KeyChain(uint64_t contract_id, Span<const uint32_t> tokens,
                                        uint32_t block_tokens) {
  std::vector<kvtier_key> keys;
  (void)KeyChain(contract_id, tokens, block_tokens, &keys);
  return keys;
}

class ScopedLease;
class AsyncAcquire;

class Client {
 public:
  Client() = default;
  ~Client() { Close(); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  Client(Client&& o) noexcept : c_(std::exchange(o.c_, nullptr)) {}
  Client& operator=(Client&& o) noexcept {
    if (this != &o) {
      Close();
      c_ = std::exchange(o.c_, nullptr);
    }
    return *this;
  }

  Error Connect(const std::string& socket_path, const kvtier_connect_options* opts = nullptr) {
    Close();
    return LastError(kvtier_connect(socket_path.c_str(), opts, &c_));
  }
  // Every ScopedLease of this client must be gone (or released) first.
  void Close() {
    if (c_) kvtier_close(c_);
    c_ = nullptr;
  }
  // After DISCONNECTED, TIMEOUT or a daemon restart (kvtier_reconnect).
  Error Reconnect() { return LastError(kvtier_reconnect(c_)); }
  Error SetAutoReconnect(bool on) { return LastError(kvtier_set_auto_reconnect(c_, on ? 1 : 0)); }
  bool connected() const { return c_ != nullptr; }
  kvtier_client* get() const { return c_; }
  uint64_t slot_bytes() const { return kvtier_slot_bytes(c_); }
  // Host slot `slot` of any lease, read-only (the arena maps read-only to clients);
  // nullptr when it is outside the host window.
  const uint8_t* host_slot(uint32_t slot) const {
    return static_cast<const uint8_t*>(kvtier_host_slot(c_, slot));
  }
  // Writable host slot of an alloc lease (this client's staging slot); nullptr for an
  // acquired or committed (arena) slot and outside the window.
  uint8_t* host_slot_write(uint32_t slot) const { return static_cast<uint8_t*>(kvtier_host_slot_write(c_, slot)); }
  Error SetTransport(kvtier_transport t) { return LastError(kvtier_set_transport(c_, t)); }

  Error RegisterContract(const kvtier_contract_desc& d, uint64_t* id) {
    return LastError(kvtier_register_contract(c_, &d, id));
  }
  // The host slot size of a registered contract and its fill (kvtier_contract_slot).
  Error ContractSlot(uint64_t contract, uint64_t* slot_bytes, double* fill) {
    return LastError(kvtier_contract_slot(c_, contract, slot_bytes, fill));
  }
  // The HBM slot size of a registered contract (kvtier_contract_hbm_slot; 0 without HBM).
  Error ContractHbmSlot(uint64_t contract, uint64_t* slot_bytes) {
    return LastError(kvtier_contract_hbm_slot(c_, contract, slot_bytes));
  }
  // Host slot s is at the window's base + s * host_granule() whatever its slot class.
  uint64_t host_granule() const { return kvtier_host_granule(c_); }
  // HBM slot s at the arena (kvtier_hbm_open) + s * hbm_granule(); hbm_arena_bytes() / it
  // ids (kvtier_hbm_granule).
  uint64_t hbm_granule() const { return kvtier_hbm_granule(c_); }
  uint64_t hbm_arena_bytes() const { return kvtier_hbm_arena_bytes(c_); }
  Error Lookup(uint64_t contract, Span<const kvtier_key> keys, LookupResult* r) {
    r->tiers.assign(keys.size(), KVTIER_TIER_NONE);
    kvtier_lookup_result lr{};
    const kvtier_status s = kvtier_lookup(c_, contract, keys.data(), keys.size(), &lr, r->tiers.data());
    r->hit_blocks = lr.hit_blocks;
    r->est_seconds_to_hbm = lr.est_seconds_to_hbm;
    return LastError(s);
  }
  // A miss is a success with l->id == 0 and no slots.
  Error Acquire(uint64_t contract, Span<const kvtier_key> keys, kvtier_tier target, Lease* l) {
    l->slots.resize(keys.size());
    size_t n = 0;
    const kvtier_status s =
        kvtier_acquire(c_, contract, keys.data(), keys.size(), target, &l->id, l->slots.data(), &n);
    l->slots.resize(s == KVTIER_OK ? n : 0);
    return LastError(s);
  }
  Error Alloc(uint64_t contract, size_t n, kvtier_tier target, Lease* l) {
    l->slots.resize(n);
    const kvtier_status s = kvtier_alloc(c_, contract, n, target, &l->id, l->slots.data());
    if (s != KVTIER_OK) l->slots.clear();
    return LastError(s);
  }
  // The same, into a lease that releases itself (any lease *l held before is released).
  inline Error Acquire(uint64_t contract, Span<const kvtier_key> keys, kvtier_tier target, ScopedLease* l);
  inline Error Alloc(uint64_t contract, size_t n, kvtier_tier target, ScopedLease* l);
  // Acquire without blocking (kvtier_acquire_async): *op is in flight on success.
  inline Error AcquireAsync(uint64_t contract, Span<const kvtier_key> keys, kvtier_tier target, AsyncAcquire* op,
                            uint32_t chunk_blocks = 0);
  // KVTIER_CONFLICT (not ok) when some keys were already cached with other bytes or
  // disputed: *committed counts only the keys that hold these bytes (kvtier_commit).
  Error Commit(uint64_t contract, uint64_t lease, Span<const kvtier_commit_item> items,
               size_t* committed = nullptr) {
    return LastError(kvtier_commit(c_, contract, lease, items.data(), items.size(), committed));
  }
  // The same, saying how many were stored and how many keys were already cached, with
  // equal or different bytes (kvtier_commit_report: ok on conflicts, the counts say them).
  Error Commit(uint64_t contract, uint64_t lease, Span<const kvtier_commit_item> items,
               kvtier_commit_result* result) {
    return LastError(kvtier_commit_report(c_, contract, lease, items.data(), items.size(), result));
  }
  // Lease 0 (a miss) is a no-op.
  Error Release(uint64_t lease) { return LastError(kvtier_release(c_, lease)); }
  Error Prefetch(uint64_t contract, Span<const kvtier_key> keys, kvtier_tier target) {
    return LastError(kvtier_prefetch(c_, contract, keys.data(), keys.size(), target));
  }
  Error Stats(std::vector<kvtier_tier_stats>* out) {
    out->resize(8);
    size_t n = 0;
    const kvtier_status s = kvtier_stats(c_, out->data(), out->size(), &n);
    out->resize(s == KVTIER_OK ? n : 0);
    return LastError(s);
  }
  Error Ping() { return LastError(kvtier_ping(c_)); }

 private:
  kvtier_client* c_ = nullptr;
};

// A lease that ends when it goes out of scope (move-only). It refers to its Client,
// which must outlive it. Release() ends it early and says how that went; Detach() hands
// the id over to the caller, who then releases it.
class ScopedLease {
 public:
  ScopedLease() = default;
  ScopedLease(Client* client, Lease lease) : client_(client), lease_(std::move(lease)) {}
  ~ScopedLease() { (void)Release(); }
  ScopedLease(const ScopedLease&) = delete;
  ScopedLease& operator=(const ScopedLease&) = delete;
  ScopedLease(ScopedLease&& o) noexcept
      : client_(std::exchange(o.client_, nullptr)), lease_(std::exchange(o.lease_, Lease{})) {}
  ScopedLease& operator=(ScopedLease&& o) noexcept {
    if (this != &o) {
      (void)Release();
      client_ = std::exchange(o.client_, nullptr);
      lease_ = std::exchange(o.lease_, Lease{});
    }
    return *this;
  }

  uint64_t id() const { return lease_.id; }
  const std::vector<kvtier_slot>& slots() const { return lease_.slots; }
  size_t size() const { return lease_.slots.size(); }
  bool empty() const { return lease_.id == 0; }
  explicit operator bool() const { return lease_.id != 0; }

  Error Release() {
    Error e;
    if (client_ != nullptr && lease_.id != 0) e = client_->Release(lease_.id);
    client_ = nullptr;
    lease_ = Lease{};
    return e;
  }
  uint64_t Detach() {
    client_ = nullptr;
    return std::exchange(lease_, Lease{}).id;
  }

 private:
  Client* client_ = nullptr;
  Lease lease_;
};

// An acquire in flight (move-only): fd() for an event loop (readable once finished),
// Ready() for the leading blocks usable now, Wait() and Result() for the end. Its
// destructor waits for the acquire and releases a lease that Result() did not hand out.
class AsyncAcquire {
 public:
  AsyncAcquire() = default;
  ~AsyncAcquire() { kvtier_acquire_async_free(op_); }
  AsyncAcquire(const AsyncAcquire&) = delete;
  AsyncAcquire& operator=(const AsyncAcquire&) = delete;
  AsyncAcquire(AsyncAcquire&& o) noexcept
      : client_(std::exchange(o.client_, nullptr)), op_(std::exchange(o.op_, nullptr)), n_(o.n_) {}
  AsyncAcquire& operator=(AsyncAcquire&& o) noexcept {
    if (this != &o) {
      kvtier_acquire_async_free(op_);
      client_ = std::exchange(o.client_, nullptr);
      op_ = std::exchange(o.op_, nullptr);
      n_ = o.n_;
    }
    return *this;
  }
  explicit operator bool() const { return op_ != nullptr; }
  int fd() const { return kvtier_acquire_async_fd(op_); }
  // The leading blocks usable now (only grows); their slots into *slots when given.
  Error Ready(size_t* ready, std::vector<kvtier_slot>* slots = nullptr) {
    if (slots != nullptr) slots->resize(n_);
    const kvtier_status s = kvtier_acquire_async_ready(op_, slots ? slots->data() : nullptr, slots ? n_ : 0, ready);
    if (slots != nullptr) slots->resize(s == KVTIER_OK ? *ready : 0);
    return LastError(s);
  }
  // OK once finished; RETRY while in flight after timeout_ms (-1: no limit).
  Error Wait(int timeout_ms = -1) { return LastError(kvtier_acquire_async_wait(op_, timeout_ms)); }
  // What Client::Acquire answers, into a lease that releases itself.
  Error Result(ScopedLease* l) {
    (void)l->Release();
    Lease lease;
    lease.slots.resize(n_);
    size_t n = 0;
    const kvtier_status s = kvtier_acquire_async_result(op_, &lease.id, lease.slots.data(), &n);
    lease.slots.resize(s == KVTIER_OK ? n : 0);
    if (s == KVTIER_OK) *l = ScopedLease(client_, std::move(lease));
    return LastError(s);
  }

 private:
  friend class Client;
  Client* client_ = nullptr;
  kvtier_acquire_op* op_ = nullptr;
  size_t n_ = 0;
};

inline Error Client::AcquireAsync(uint64_t contract, Span<const kvtier_key> keys, kvtier_tier target,
                                  AsyncAcquire* op, uint32_t chunk_blocks) {
  *op = AsyncAcquire();
  kvtier_acquire_op* h = nullptr;
  const kvtier_status s = kvtier_acquire_async(c_, contract, keys.data(), keys.size(), target, chunk_blocks, &h);
  if (s == KVTIER_OK) {
    op->client_ = this;
    op->op_ = h;
    op->n_ = keys.size();
  }
  return LastError(s);
}

inline Error Client::Acquire(uint64_t contract, Span<const kvtier_key> keys, kvtier_tier target,
                             ScopedLease* l) {
  (void)l->Release();
  Lease lease;
  Error e = Acquire(contract, keys, target, &lease);
  if (e) *l = ScopedLease(this, std::move(lease));
  return e;
}

inline Error Client::Alloc(uint64_t contract, size_t n, kvtier_tier target, ScopedLease* l) {
  (void)l->Release();
  Lease lease;
  Error e = Alloc(contract, n, target, &lease);
  if (e) *l = ScopedLease(this, std::move(lease));
  return e;
}

}  // namespace kvtier::client
