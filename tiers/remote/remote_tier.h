// RemoteTier: blocks in a Redis Cluster shared by a fleet of daemons (docs/remote.md).
//
// Redis key of a block:   <prefix>[<namespace>:]{<contract id, 16 hex>:<block key, 32 hex>}
// prefix is RemoteOptions::key_prefix ("kvt:" by default); namespace is given per
// operation (GetItem/PutItem::ns, ExistsPrefix's ns: a tenant's), empty by default, which
// gives kvt:{<contract>:<key>}. The whole identity is the hash tag, so a block lives in
// exactly one slot, and blocks of different contracts or namespaces have different keys
// (neither prefix nor namespace may hold a brace, so the tag is always the block's; a
// namespace never holds "{", so two namespaces never make the same key).
//
// Redis value: a 32-byte envelope, then the record of formats/record.h (96-byte header
// with contract id, key, parent, payload length and XXH3 checksums, then the payload),
// zstd-compressed when that saves at least 1/8 of it:
//   off size field
//     0    4 magic        "KVRM" (0x4D52564B as u32 LE)
//     4    2 version      kRemoteFormatVersion
//     6    2 codec        0 = stored, 1 = zstd
//     8    8 body_len     bytes after the envelope (= value length - 32)
//    16    8 record_len   96 + payload_len once decoded
//    24    8 env_xxh3     XXH3-64 of bytes [0, 24)
// Every GET is verified before its bytes are used: envelope, lengths, decompression,
// record header checksum, contract id and key equal to the ones asked, payload length equal
// to the contract's block size, payload checksum. Anything else is Corrupt: a miss, counted.
// A node that is down or slow is IoError: a miss, counted, within the client's timeouts.
//
// Threading: thread-safe (the cluster client is; the counters are atomics).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "formats/keys.h"
#include "formats/status.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/remote_options.h"

namespace kvtier::remote {

inline constexpr uint32_t kRemoteMagic = 0x4D52564Bu;  // "KVRM"
inline constexpr uint16_t kRemoteFormatVersion = 1;
inline constexpr size_t kEnvelopeSize = 32;

// The key under the default prefix and no namespace: kvt:{<contract>:<key>}.
std::string RedisKey(uint64_t contract_id, const Key128& key);
std::string RedisKey(std::string_view prefix, std::string_view ns, uint64_t contract_id, const Key128& key);
// A key prefix or namespace: at most kMaxKeyPartBytes of printable ASCII without spaces
// or braces ("" is allowed). Invalid, naming `what`, otherwise.
inline constexpr size_t kMaxKeyPartBytes = 64;
Status CheckKeyPart(std::string_view part, const char* what);

struct PutItem {
  uint64_t contract_id = 0;
  Key128 key, parent;
  std::span<const uint8_t> payload;
  std::string_view ns = {};  // key namespace (CheckKeyPart); "" = none. Default: ""
};

struct GetItem {
  uint64_t contract_id = 0;
  Key128 key;
  // Receives the payload; its size is the expected block size. Scratch until status is
  // Ok: a refused value may have been written into it.
  std::span<uint8_t> out;
  // Results:
  Status status;  // Ok, NotFound (no value), Corrupt (refused), IoError (node down/slow),
                  // Invalid (a bad ns)
  Key128 parent;  // from the record, when Ok
  std::string_view ns = {};  // key namespace (CheckKeyPart); "" = none. Default: ""
};

struct RemoteStats {
  uint64_t hits = 0, misses = 0, errors = 0, corrupt = 0;
  uint64_t bytes_read = 0, bytes_written = 0, writes = 0, write_errors = 0;
  double read_gbps = 0.0;  // measured over GET batches (0 until one ran)
};

// Encodes one value (envelope + record, maybe compressed). Exposed for tests and tools.
std::string EncodeValue(const PutItem& item, bool compress);
// Verifies one value as described above and copies the payload into `out`.
Status DecodeValue(std::string_view value, uint64_t contract_id, const Key128& key,
                   std::span<uint8_t> out, Key128* parent);
// The same for a stored value whose payload the cluster client already wrote into `out`
// (Command::sink): `head` is its envelope and record header.
Status DecodeSunkValue(std::string_view head, uint64_t contract_id, const Key128& key,
                       std::span<const uint8_t> out, Key128* parent);

class RemoteTier {
 public:
  // Reads the password file, loads the TLS files and opens the cluster client. Invalid
  // for bad options or files (a password file open to others, a missing CA); Rejected
  // when the cluster answers but refuses us (wrong password, untrusted certificate).
  static StatusOr<std::unique_ptr<RemoteTier>> Open(const RemoteOptions& opts);

  // Pipelined GETs; each item gets its own status.
  void GetBatch(std::span<GetItem> items);
  // Pipelined SETs; returns how many were stored. Failures are counted, not returned.
  size_t PutBatch(std::span<const PutItem> items);
  // Pipelined EXISTS: how many leading keys have a value (a hint: the GET still verifies).
  size_t ExistsPrefix(uint64_t contract_id, std::span<const Key128> keys, std::string_view ns = {});
  // The key of a block under this tier's prefix.
  std::string KeyOf(std::string_view ns, uint64_t contract_id, const Key128& key) const {
    return RedisKey(opts_.key_prefix, ns, contract_id, key);
  }

  RemoteStats stats() const;
  const RemoteOptions& options() const { return opts_; }
  ClusterClient& client() { return *client_; }

 private:
  RemoteOptions opts_;
  std::unique_ptr<ClusterClient> client_;
  std::atomic<uint64_t> hits_{0}, misses_{0}, errors_{0}, corrupt_{0}, bytes_read_{0}, bytes_written_{0},
      writes_{0}, write_errors_{0};
  std::atomic<uint64_t> read_ns_{0}, read_bytes_timed_{0};
};

}  // namespace kvtier::remote
