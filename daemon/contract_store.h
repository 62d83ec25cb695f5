// The registered contracts, kept in a file next to the NVMe tier's data and index
// (<tiers.nvme.dir>/contracts.kvc), so that after a restart the blocks restored from NVMe
// are reachable and manageable (lookup, evict --contract, list) before any client
// registers their contract again. Each record is one contract in one namespace: the
// implicit tenant's (the contract's own id), a [[tenants]] table's (by the tenant's name;
// the TierManager's id is derived from it) or the shared namespace's ("shared"). A
// contract the daemon forgets (its last registrant detached, no block of it cached) is
// removed: the file is rewritten without it (a temp file renamed over it).
//
// File layout (little-endian; see kContractFileVersion):
//   ContractFileHeader                 magic "KVCS", version, reserved
//   records, appended one per new contract:
//     ContractRecordHeader             magic "KVCR" (the implicit tenant's) or "KVCN"
//                                      (a namespace's), payload length, XXH3-64 of payload
//     payload                          KVCR: ScaleContract::Serialize() bytes (canonical form)
//                                      KVCN: u32 name length, the namespace's name, then
//                                      the contract's bytes as in KVCR
// Version 1 has KVCR records only; a file is written as version 2 once it holds a KVCN
// record (version 1 stays as it is otherwise, so an older daemon still reads it).
// A record whose header or checksum does not hold is the tail of an append cut short
// by a crash: it and everything after it are dropped (the file is truncated there).
// A file whose header is not this format is refused by name at start.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "formats/contract.h"
#include "formats/status.h"

namespace kvtier::daemon {

// When you change ContractFileHeader or ContractRecordHeader, bump kContractFileVersion.
// tests/data/contracts_v1.kvc is a file of version 1: every later version reads it or
// refuses it by name (tests/daemon/contract_store_test.cc).
inline constexpr uint32_t kContractFileMagic = 0x5343564Bu;      // "KVCS" as u32 LE
inline constexpr uint32_t kContractRecordMagic = 0x5243564Bu;    // "KVCR" as u32 LE
inline constexpr uint32_t kContractNsRecordMagic = 0x4E43564Bu;  // "KVCN" as u32 LE
inline constexpr uint32_t kContractFileVersion = 2;
inline constexpr uint32_t kMaxContractRecordBytes = 1u << 20;
inline constexpr uint32_t kMaxContractNsBytes = 256;

// One stored registration: a contract and the namespace it was registered in.
struct StoredContract {
  ScaleContract contract;
  // "": the implicit tenant's; "shared": the shared namespace; else a tenant's name.
  std::string ns;
  bool operator==(const StoredContract&) const = default;
};

struct ContractFileHeader {
  uint32_t magic = kContractFileMagic;
  uint32_t version = kContractFileVersion;
  uint64_t reserved = 0;
};
static_assert(sizeof(ContractFileHeader) == 16);

struct ContractRecordHeader {
  uint32_t magic = kContractRecordMagic;
  uint32_t length = 0;  // payload bytes, <= kMaxContractRecordBytes
  uint64_t xxh3 = 0;    // XXH3-64 of the payload
};
static_assert(sizeof(ContractRecordHeader) == 16);

// Parses the bytes of a whole contract file: a header of another magic is Corrupt, one of
// a version this build does not read (1 and 2) Unsupported, each naming `name`. Otherwise
// it appends every intact record to *out (in file order, the first of each (namespace,
// id) only) and returns the length of the intact prefix: the header and every whole
// record before the first torn or unreadable one (or the end; a KVCN record in a file of
// version 1 is unreadable). A file shorter than its header returns 0. Touches nothing
// else, so it is safe on any input (tests/fuzz/fuzz_contract_file.cc).
StatusOr<size_t> ParseContractRecords(std::span<const uint8_t> bytes, const std::string& name,
                                      std::vector<StoredContract>* out);
// The same, the contracts only (every namespace's).
StatusOr<size_t> ParseContractFile(std::span<const uint8_t> bytes, const std::string& name,
                                   std::vector<ScaleContract>* out);

class ContractStore {
 public:
  // Opens (creating when absent) the file at `path` and reads every intact record into
  // *out. *dropped_bytes (may be NULL) gets the size of a torn tail it cut off.
  static StatusOr<std::unique_ptr<ContractStore>> Open(const std::string& path,
                                                       std::vector<StoredContract>* out,
                                                       uint64_t* dropped_bytes = nullptr);
  // The same, the contracts only.
  static StatusOr<std::unique_ptr<ContractStore>> Open(const std::string& path,
                                                       std::vector<ScaleContract>* out,
                                                       uint64_t* dropped_bytes = nullptr);
  ~ContractStore();

  // Appends c in namespace `ns` (durably: fdatasync) unless it is stored there already.
  // The first namespace record in a file of version 1 rewrites it as version 2 (Rewrite).
  // Thread-safe.
  Status Add(const ScaleContract& c, const std::string& ns = "");
  // Removes the contracts of ids (contract ids, as ScaleContract::Id) from namespace ns:
  // the file is rewritten without them (Rewrite) when one of them was stored. Thread-safe.
  Status Remove(const std::string& ns, std::span<const uint64_t> ids);

  const std::string& path() const { return path_; }
  size_t size() const {
    std::lock_guard<std::mutex> l(mu_);
    return records_.size();
  }

 private:
  ContractStore(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  // Writes every record of records_ to <path>.tmp (version 1 when none has a namespace),
  // fdatasyncs it, renames it over the file, syncs the folder and appends to it from then.
  Status RewriteLocked();

  const std::string path_;
  int fd_;
  uint32_t version_ = kContractFileVersion;  // the file's header version
  mutable std::mutex mu_;                    // protects the fields below, fd_ and the file
  std::vector<StoredContract> records_;      // what the file holds, in its order
  std::unordered_set<std::string> keys_;     // Key(ns, id) of every record
  static std::string Key(const std::string& ns, uint64_t id) { return ns + '\0' + std::to_string(id); }
};

}  // namespace kvtier::daemon
