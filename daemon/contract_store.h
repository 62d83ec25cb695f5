// The registered contracts, kept in a file next to the NVMe tier's data and index
// (<tiers.nvme.dir>/contracts.kvc), so that after a restart the blocks restored from NVMe
// are reachable and manageable (lookup, evict --contract, list) before any client
// registers their contract again. Each record is one contract in one namespace: the
// implicit tenant's (the contract's own id), a [[tenants]] table's (by the tenant's name;
// the TierManager's id is derived from it) or the shared namespace's ("shared"). A
// contract the daemon forgets (its last registrant detached, or a sweep found no block of
// it cached) gets a deletion record appended; once the dead records (deleted ones and
// deletion records) outnumber the live ones (and kCompactAfterDeadRecords), the file is
// compacted: rewritten with the live records only (a temp file renamed over it). A forget
// costs one append, never a rewrite of the whole file.
//
// File layout (little-endian; see kContractFileVersion):
//   ContractFileHeader                 magic "KVCS", version, reserved
//   records, appended one per new contract or forgotten one:
//     ContractRecordHeader             magic "KVCR" (the implicit tenant's), "KVCN" (a
//                                      namespace's) or "KVCD" (a deletion), payload
//                                      length, XXH3-64 of payload
//     payload                          KVCR: ScaleContract::Serialize() bytes (canonical form)
//                                      KVCN: u32 name length, the namespace's name, then
//                                      the contract's bytes as in KVCR
//                                      KVCD: u32 name length (0: the implicit tenant's),
//                                      the namespace's name, u64 contract id: the record
//                                      of that (namespace, id) before it no longer counts
// Version 1 has KVCR records only, version 2 KVCR and KVCN, version 3 all three. A file
// is written with the lowest version its records need (a header's version is raised in
// place before the first record that needs it), so an older daemon reads what it can and
// refuses the rest by name.
// A record that does not hold (its header or its checksum) with an intact record after it
// is corruption: it is skipped (counted, the caller logs it) and the records after it are
// kept; the file is compacted at open without it. One with no intact record after it is
// the tail of an append cut short by a crash: it and everything after it are dropped (the
// file is truncated there). A file whose header is not this format is refused by name at
// start. Deletion records are appended without fdatasync: one lost in a crash brings a
// forgotten contract back, which the daemon forgets again.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "formats/contract.h"
#include "formats/status.h"

namespace kvtier::daemon {

// When you change ContractFileHeader or ContractRecordHeader, bump kContractFileVersion.
// tests/data/contracts_v1.kvc and contracts_v2.kvc are files of versions 1 and 2: every
// later version reads them or refuses them by name (tests/daemon/contract_store_test.cc).
inline constexpr uint32_t kContractFileMagic = 0x5343564Bu;      // "KVCS" as u32 LE
inline constexpr uint32_t kContractRecordMagic = 0x5243564Bu;    // "KVCR" as u32 LE
inline constexpr uint32_t kContractNsRecordMagic = 0x4E43564Bu;  // "KVCN" as u32 LE
inline constexpr uint32_t kContractDelRecordMagic = 0x4443564Bu;  // "KVCD" as u32 LE
inline constexpr uint32_t kContractFileVersion = 3;
// Dead records (deleted ones and deletion records) a file holds before a compaction is
// considered; past it, a compaction runs once they outnumber the live records.
inline constexpr uint64_t kCompactAfterDeadRecords = 1024;
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

// What a parse met besides the records it returns.
struct ContractParseReport {
  uint64_t corrupt_records = 0;  // runs of bytes skipped between intact records
  uint64_t corrupt_bytes = 0;    // their bytes
  uint64_t dead_records = 0;     // deletion records and the records they deleted
};

// Parses the bytes of a whole contract file: a header of another magic is Corrupt, one of
// a version this build does not read (1 to 3) Unsupported, each naming `name`. Otherwise
// it appends the live records to *out (in file order of the record that made each live,
// one per (namespace, id): a record deleted by a later deletion record is not returned,
// one added again after it is) and returns the length of the readable part: the header
// and every record up to the last intact one (or the end). Bytes between intact records
// that are no record of the header's version are skipped and counted in *report (may be
// NULL); the bytes after the last intact record are a torn tail. A file shorter than its
// header returns 0. Touches nothing else, so it is safe on any input
// (tests/fuzz/fuzz_contract_file.cc).
StatusOr<size_t> ParseContractRecords(std::span<const uint8_t> bytes, const std::string& name,
                                      std::vector<StoredContract>* out, ContractParseReport* report = nullptr);
// The same, the contracts only (every namespace's).
StatusOr<size_t> ParseContractFile(std::span<const uint8_t> bytes, const std::string& name,
                                   std::vector<ScaleContract>* out);

class ContractStore {
 public:
  // Opens (creating when absent) the file at `path` and reads every live record into
  // *out. *dropped_bytes (may be NULL) gets the size of a torn tail it cut off; *report
  // (may be NULL) what else the parse met. A file with corrupt records, or with more dead
  // records than live ones, is compacted here.
  static StatusOr<std::unique_ptr<ContractStore>> Open(const std::string& path,
                                                       std::vector<StoredContract>* out,
                                                       uint64_t* dropped_bytes = nullptr,
                                                       ContractParseReport* report = nullptr);
  // The same, the contracts only.
  static StatusOr<std::unique_ptr<ContractStore>> Open(const std::string& path,
                                                       std::vector<ScaleContract>* out,
                                                       uint64_t* dropped_bytes = nullptr);
  ~ContractStore();

  // Appends c in namespace `ns` (durably: fdatasync) unless it is stored there already.
  // The first namespace record in a file of version 1 raises its header to version 2.
  // Thread-safe.
  Status Add(const ScaleContract& c, const std::string& ns = "");
  // Forgets the contracts of ids (contract ids, as ScaleContract::Id) in namespace ns:
  // one deletion record each that is stored, appended in one write (the first in a file
  // of version 1 or 2 raises its header to version 3); then a compaction when the dead
  // records outnumber the live ones. Thread-safe.
  Status Remove(const std::string& ns, std::span<const uint64_t> ids);

  const std::string& path() const { return path_; }
  size_t size() const {
    std::lock_guard<std::mutex> l(mu_);
    return live_.size();
  }
  // Dead records the file holds (deleted records and deletion records).
  uint64_t dead_records() const {
    std::lock_guard<std::mutex> l(mu_);
    return dead_;
  }
  // Compactions since Open (at open included).
  uint64_t compactions() const {
    std::lock_guard<std::mutex> l(mu_);
    return compactions_;
  }

 private:
  ContractStore(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  // Writes every live record, in file order, to <path>.tmp (version 1 when none has a namespace,
  // else 2), fdatasyncs it, renames it over the file, syncs the folder and appends to it
  // from then.
  Status RewriteLocked();
  // Raises the header's version in place (fdatasync) to at least v.
  Status RaiseVersionLocked(uint32_t v);
  bool ShouldCompactLocked() const { return dead_ >= kCompactAfterDeadRecords && dead_ > live_.size(); }

  const std::string path_;
  int fd_;
  uint32_t version_ = kContractFileVersion;  // the file's header version
  mutable std::mutex mu_;                    // protects the fields below, fd_ and the file
  // The live records by Key(ns, id), each with its place in the file's order.
  std::unordered_map<std::string, std::pair<uint64_t, StoredContract>> live_;
  uint64_t next_seq_ = 0;
  uint64_t dead_ = 0;                        // dead records in the file
  uint64_t compactions_ = 0;
  static std::string Key(const std::string& ns, uint64_t id) { return ns + '\0' + std::to_string(id); }
};

}  // namespace kvtier::daemon
