#include "formats/record.h"

#include <xxhash.h>

#include <cstring>
#include <string>

#include "formats/bytes.h"

namespace kvtier {

void RecordHeader::Encode(uint8_t out[kRecordHeaderSize]) const {
  std::memset(out, 0, kRecordHeaderSize);
  PutAt<uint32_t>(out, 0, kRecordMagic);
  PutAt<uint16_t>(out, 4, kRecordFormatVersion);
  PutAt<uint16_t>(out, 6, static_cast<uint16_t>(kRecordHeaderSize));
  PutAt<uint64_t>(out, 8, contract_id);
  key.ToCanonical(out + 16);
  parent.ToCanonical(out + 32);
  PutAt<uint64_t>(out, 48, payload_len);
  PutAt<uint64_t>(out, 56, payload_xxh3);
  PutAt<uint64_t>(out, 64, sequence);
  // flags (72) and reserved (76..88) stay zero.
  PutAt<uint64_t>(out, 88, XXH3_64bits(out, kRecordHeaderChecksummed));
}

StatusOr<RecordHeader> RecordHeader::Decode(std::span<const uint8_t> bytes) {
  if (bytes.size() < kRecordHeaderSize) {
    return Status::Corrupt("record header truncated: " + std::to_string(bytes.size()) +
                           " of 96 bytes");
  }
  const uint8_t* p = bytes.data();
  if (GetAt<uint32_t>(p, 0) != kRecordMagic) return Status::Corrupt("record header: bad magic");
  const uint16_t version = GetAt<uint16_t>(p, 4);
  if (version != kRecordFormatVersion) {
    return Status::Unsupported("record format version " + std::to_string(version) +
                               " (this build reads version " +
                               std::to_string(kRecordFormatVersion) + ")");
  }
  if (GetAt<uint16_t>(p, 6) != kRecordHeaderSize) {
    return Status::Corrupt("record header: header_size " + std::to_string(GetAt<uint16_t>(p, 6)) +
                           " is not 96");
  }
  if (GetAt<uint64_t>(p, 88) != XXH3_64bits(p, kRecordHeaderChecksummed)) {
    return Status::Corrupt("record header: checksum mismatch");
  }
  if (GetAt<uint32_t>(p, 72) != 0) return Status::Corrupt("record header: unknown flags");
  for (size_t i = 76; i < 88; ++i) {
    if (p[i] != 0) return Status::Corrupt("record header: reserved bytes are not zero");
  }
  RecordHeader h;
  h.contract_id = GetAt<uint64_t>(p, 8);
  h.key = Key128::FromCanonical(p + 16);
  h.parent = Key128::FromCanonical(p + 32);
  h.payload_len = GetAt<uint64_t>(p, 48);
  h.payload_xxh3 = GetAt<uint64_t>(p, 56);
  h.sequence = GetAt<uint64_t>(p, 64);
  if (h.payload_len == 0 || h.payload_len > kMaxRecordPayload) {
    return Status::Corrupt("record header: payload_len " + std::to_string(h.payload_len) +
                           " out of range");
  }
  return h;
}

uint64_t PayloadChecksum(std::span<const uint8_t> payload) {
  return XXH3_64bits(payload.data(), payload.size());
}

Status VerifyPayload(const RecordHeader& h, std::span<const uint8_t> payload) {
  if (payload.size() != h.payload_len) {
    return Status::Corrupt("payload length " + std::to_string(payload.size()) +
                           " does not match header " + std::to_string(h.payload_len));
  }
  if (PayloadChecksum(payload) != h.payload_xxh3) {
    return Status::Corrupt("payload checksum mismatch");
  }
  return Status::Ok();
}

}  // namespace kvtier
