// Thin C++ wrapper over the C ABI (kvtier.h): RAII for the client handle and for leases,
// std::vector/std::span in place of pointer+count pairs. No exceptions: every call
// returns a Result with the C status and the error line, so it can sit on a data path.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvtier/kvtier.h"

namespace kvtier::client {

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

struct Lease {
  uint64_t id = 0;                 // 0: no lease (nothing acquired)
  std::vector<kvtier_slot> slots;
};

// Key chain of a prompt (pure computation; identical to the daemon's and Python's).
inline std::vector<kvtier_key> KeyChain(uint64_t contract_id, std::span<const uint32_t> tokens,
                                        uint32_t block_tokens) {
  std::vector<kvtier_key> keys(block_tokens ? tokens.size() / block_tokens : 0);
  size_t n = 0;
  if (kvtier_key_chain(contract_id, tokens.data(), tokens.size(), block_tokens, keys.data(),
                       keys.size(), &n) != KVTIER_OK) {
    keys.clear();
  }
  return keys;
}

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
  void Close() {
    if (c_) kvtier_close(c_);
    c_ = nullptr;
  }
  bool connected() const { return c_ != nullptr; }
  kvtier_client* get() const { return c_; }
  uint64_t slot_bytes() const { return kvtier_slot_bytes(c_); }
  uint8_t* host_slot(uint32_t slot) const {
    uint64_t bytes = 0;
    auto* base = static_cast<uint8_t*>(kvtier_host_arena(c_, &bytes));
    if (base == nullptr || uint64_t{slot + 1ull} * slot_bytes() > bytes) return nullptr;
    return base + uint64_t{slot} * slot_bytes();
  }
  Error SetTransport(kvtier_transport t) { return LastError(kvtier_set_transport(c_, t)); }

  Error RegisterContract(const kvtier_contract_desc& d, uint64_t* id) {
    return LastError(kvtier_register_contract(c_, &d, id));
  }
  Error Lookup(uint64_t contract, std::span<const kvtier_key> keys, LookupResult* r) {
    r->tiers.assign(keys.size(), KVTIER_TIER_NONE);
    kvtier_lookup_result lr{};
    const kvtier_status s = kvtier_lookup(c_, contract, keys.data(), keys.size(), &lr, r->tiers.data());
    r->hit_blocks = lr.hit_blocks;
    r->est_seconds_to_hbm = lr.est_seconds_to_hbm;
    return LastError(s);
  }
  Error Acquire(uint64_t contract, std::span<const kvtier_key> keys, kvtier_tier target, Lease* l) {
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
  Error Commit(uint64_t contract, uint64_t lease, std::span<const kvtier_commit_item> items,
               size_t* committed = nullptr) {
    return LastError(kvtier_commit(c_, contract, lease, items.data(), items.size(), committed));
  }
  Error Release(uint64_t lease) { return LastError(kvtier_release(c_, lease)); }
  Error Prefetch(uint64_t contract, std::span<const kvtier_key> keys, kvtier_tier target) {
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

}  // namespace kvtier::client
