// The registered contracts, kept in a file next to the NVMe tier's data and index
// (<tiers.nvme.dir>/contracts.kvc), so that after a restart the blocks restored from NVMe
// are reachable and manageable (lookup, evict --contract, list) before any client
// registers their contract again.
//
// File layout (little-endian; see kFormatVersion):
//   ContractFileHeader                 magic "KVCS", version, reserved
//   records, appended one per new contract:
//     ContractRecordHeader             magic "KVCR", payload length, XXH3-64 of payload
//     payload                          ScaleContract::Serialize() bytes (canonical form)
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
inline constexpr uint32_t kContractFileMagic = 0x5343564Bu;    // "KVCS" as u32 LE
inline constexpr uint32_t kContractRecordMagic = 0x5243564Bu;  // "KVCR" as u32 LE
inline constexpr uint32_t kContractFileVersion = 1;
inline constexpr uint32_t kMaxContractRecordBytes = 1u << 20;

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
// another version Unsupported, each naming `name`. Otherwise it appends every intact record's
// contract to *out (in file order, the first of each id only) and returns the length of the
// intact prefix: the header and every whole record before the first torn or unreadable one
// (or the end). A file shorter than its header returns 0. Touches nothing else, so it is
// safe on any input (tests/fuzz/fuzz_contract_file.cc).
StatusOr<size_t> ParseContractFile(std::span<const uint8_t> bytes, const std::string& name,
                                   std::vector<ScaleContract>* out);

class ContractStore {
 public:
  // Opens (creating when absent) the file at `path` and reads every intact record into
  // *out. *dropped_bytes (may be NULL) gets the size of a torn tail it cut off.
  static StatusOr<std::unique_ptr<ContractStore>> Open(const std::string& path,
                                                       std::vector<ScaleContract>* out,
                                                       uint64_t* dropped_bytes = nullptr);
  ~ContractStore();

  // Appends c (durably: fdatasync) unless a contract with its id is stored already.
  // Thread-safe.
  Status Add(const ScaleContract& c);

  const std::string& path() const { return path_; }

 private:
  ContractStore(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  const std::string path_;
  const int fd_;
  std::mutex mu_;                        // protects ids_ and appends
  std::unordered_set<uint64_t> ids_;
};

}  // namespace kvtier::daemon
