// Shared pieces of the reliability suite (tests/reliability): real kvtierd processes
// (tests/daemon/harness.h's DaemonProcess, started from KVTIER_BIN_DIR), a client that
// writes and checks blocks whose bytes derive from their keys (so any process can tell
// a wrong block from a right one), and the reporting of the suite's figures.
//
// Figures: every test prints one "RELIABILITY ..." line per figure and builds a
// bench::Report table; the table is appended to the file named by the environment
// variable KVTIER_RELIABILITY_RESULTS (e.g. bench/history/results.md) when it is set, and only
// printed otherwise (ctest runs must not edit the source tree).
#pragma once

#include <cstdlib>
#include <string>
#include <unordered_set>
#include <vector>

#include "kvtier/kvtier.h"
#include "tests/daemon/harness.h"
#include "tools/bench/report.h"

namespace kvtier::reliability {

using testing::CheckBlock;
using testing::FillBlock;

// Sets an environment variable for the lifetime of the object (the daemon child of a
// fork inherits it); restores the old value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) ::setenv(name_, old_.c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

inline std::string ResultsPath() {
  const char* p = std::getenv("KVTIER_RELIABILITY_RESULTS");
  return p ? p : "";
}

inline void EmitReport(const bench::Report& r) { (void)r.Emit(ResultsPath()); }

// An integer from the environment (for the long runs: KVTIER_CRASH_CYCLES etc.).
inline long EnvInt(const char* name, long dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : dflt;
}

struct KeyHash {
  size_t operator()(const kvtier_key& k) const noexcept { return k.hi * 31 + k.lo; }
};
struct KeyEq {
  bool operator()(const kvtier_key& a, const kvtier_key& b) const noexcept {
    return a.hi == b.hi && a.lo == b.lo;
  }
};
using KeySet = std::unordered_set<kvtier_key, KeyHash, KeyEq>;

// Unique, never-zero key for (run, n).
inline kvtier_key MakeKey(uint64_t run, uint64_t n) {
  uint64_t x = (run << 40) ^ n ^ 0x5DEECE66Dull;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return kvtier_key{(run << 40) | n | (uint64_t{1} << 63), x | 1};
}

// The run of a MakeKey key.
inline uint64_t RunOf(const kvtier_key& k) { return (k.hi & ~(uint64_t{1} << 63)) >> 40; }

// A connected libkvtier client with the small test contract registered, and optionally a
// second contract (`second`, e.g. one of larger blocks in another slot class): keys of
// run 2 (MakeKey(2, n)) are that contract's blocks, every other key the first's. A slot
// is at kvtier_host_slot (slot x granule with several slot classes).
struct Conn {
  kvtier_client* c = nullptr;
  uint64_t contract = 0, contract2 = 0;
  uint64_t block_bytes = 0, block_bytes2 = 0, slot_bytes = 0;
  uint8_t* host = nullptr;

  uint64_t ContractOf(const kvtier_key& k) const { return contract2 != 0 && RunOf(k) == 2 ? contract2 : contract; }
  uint64_t BytesOf(const kvtier_key& k) const { return contract2 != 0 && RunOf(k) == 2 ? block_bytes2 : block_bytes; }

  ~Conn() { Close(); }
  void Close() {
    if (c) kvtier_close(c);
    c = nullptr;
  }
  kvtier_status Open(const std::string& socket, uint32_t timeout_ms = 5000, const char* name = "reliability",
                     const kvtier_contract_desc* second = nullptr) {
    kvtier_connect_options o{};
    o.name = name;
    o.timeout_ms = timeout_ms;
    kvtier_status s = kvtier_connect(socket.c_str(), &o, &c);
    if (s != KVTIER_OK) return s;
    kvtier_contract_desc d = testing::SmallContract();
    s = kvtier_register_contract(c, &d, &contract);
    if (s != KVTIER_OK) return s;
    (void)kvtier_contract_block_bytes(&d, &block_bytes);
    if (second) {
      s = kvtier_register_contract(c, second, &contract2);
      if (s != KVTIER_OK) return s;
      (void)kvtier_contract_block_bytes(second, &block_bytes2);
    }
    slot_bytes = kvtier_slot_bytes(c);
    uint64_t hb = 0;
    host = static_cast<uint8_t*>(kvtier_host_arena(c, &hb));
    return host ? KVTIER_OK : KVTIER_UNSUPPORTED;
  }

  // Stores keys (each a first block, all of one contract): alloc, fill, commit, release.
  // `on_commit_sent` is called for every key just before its commit goes out.
  template <typename F>
  kvtier_status Store(const std::vector<kvtier_key>& keys, F&& on_commit_sent, size_t* committed) {
    *committed = 0;
    uint64_t lease = 0;
    std::vector<kvtier_slot> slots(keys.size());
    const uint64_t cid = ContractOf(keys[0]);
    kvtier_status s = kvtier_alloc(c, cid, keys.size(), KVTIER_TIER_HOST, &lease, slots.data());
    if (s != KVTIER_OK) return s;
    std::vector<kvtier_commit_item> items(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c, slots[i].slot)), BytesOf(keys[i]), cid, keys[i]);
      items[i].slot = slots[i];
      items[i].key = keys[i];
      items[i].parent = kvtier_key{0, 0};
      on_commit_sent(keys[i]);
    }
    s = kvtier_commit(c, cid, lease, items.data(), items.size(), committed);
    const kvtier_status r = kvtier_release(c, lease);
    return s != KVTIER_OK ? s : r;
  }

  // Fills slots for keys (all of one contract) and releases the lease without committing.
  kvtier_status Abandon(const std::vector<kvtier_key>& keys) {
    uint64_t lease = 0;
    std::vector<kvtier_slot> slots(keys.size());
    const uint64_t cid = ContractOf(keys[0]);
    kvtier_status s = kvtier_alloc(c, cid, keys.size(), KVTIER_TIER_HOST, &lease, slots.data());
    if (s != KVTIER_OK) return s;
    for (size_t i = 0; i < keys.size(); ++i) {
      FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c, slots[i].slot)), BytesOf(keys[i]), cid, keys[i]);
    }
    return kvtier_release(c, lease);
  }

  // Looks one key up; when it hits, acquires it into host and checks its bytes.
  // *served: the daemon handed the block out; *wrong: its bytes were not the key's.
  kvtier_status Check(const kvtier_key& k, bool* served, bool* wrong) {
    *served = *wrong = false;
    kvtier_lookup_result lr{};
    const uint64_t cid = ContractOf(k);
    kvtier_status s = kvtier_lookup(c, cid, &k, 1, &lr, nullptr);
    if (s != KVTIER_OK) return s;
    uint64_t lease = 0;
    kvtier_slot slot{};
    size_t n = 0;
    s = kvtier_acquire(c, cid, &k, 1, KVTIER_TIER_HOST, &lease, &slot, &n);
    if (s != KVTIER_OK) return s;
    if (n == 1) {
      *served = true;
      *wrong = !CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c, slot.slot)), BytesOf(k), cid, k);
      return kvtier_release(c, lease);
    }
    return KVTIER_OK;
  }
};

}  // namespace kvtier::reliability
