// The on-disk (NVMe) and on-wire (remote tier, export file) record of one block.
//
// A record is a fixed 96-byte header followed by the payload (the block's bytes, in the
// layout of layout.h). On NVMe the header sits alone in the first 4 KiB of the record
// so that the payload starts 4 KiB-aligned for O_DIRECT; see tiers/nvme.
//
// Header, little-endian, 96 bytes:
//   off size field
//     0    4 magic            "KVTR" (0x5254564B as u32 LE)
//     4    2 version          kRecordFormatVersion
//     6    2 header_size      96
//     8    8 contract_id      XXH3-64 of the scale contract
//    16   16 key              block key, canonical (big-endian) form
//    32   16 parent           parent block key, canonical form; all-zero for a first block
//    48    8 payload_len      bytes of payload (> 0, <= kMaxRecordPayload)
//    56    8 payload_xxh3     XXH3-64 of the payload
//    64    8 sequence         writer's monotonically increasing sequence number
//    72    4 flags            must be 0 in version 1
//    76   12 reserved         must be 0
//    88    8 header_xxh3      XXH3-64 of bytes [0, 88)
//
// When you modify this layout, bump kRecordFormatVersion and keep a file written by the
// old version under tests/data/ with a test that reads it or refuses it by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "formats/keys.h"
#include "formats/status.h"

namespace kvtier {

inline constexpr uint32_t kRecordMagic = 0x5254564Bu;  // "KVTR"
inline constexpr uint16_t kRecordFormatVersion = 1;
inline constexpr size_t kRecordHeaderSize = 96;
inline constexpr size_t kRecordHeaderChecksummed = 88;
inline constexpr uint64_t kMaxRecordPayload = uint64_t{1} << 32;  // 4 GiB

struct RecordHeader {
  uint64_t contract_id = 0;
  Key128 key;
  Key128 parent;
  uint64_t payload_len = 0;
  uint64_t payload_xxh3 = 0;
  uint64_t sequence = 0;

  // Writes the 96 header bytes, with header_xxh3 computed.
  void Encode(uint8_t out[kRecordHeaderSize]) const;

  // Parses and checks a header: size, magic, version, header_size, header checksum,
  // flags, reserved bytes and payload_len. Every refusal says why (Corrupt for bytes
  // that fail their checksum or magic, Unsupported for another version).
  static StatusOr<RecordHeader> Decode(std::span<const uint8_t> bytes);

  bool operator==(const RecordHeader&) const = default;
};

// XXH3-64 of a payload.
uint64_t PayloadChecksum(std::span<const uint8_t> payload);

// Checks a payload against its header (length and checksum). Corrupt on mismatch.
Status VerifyPayload(const RecordHeader& h, std::span<const uint8_t> payload);

}  // namespace kvtier
