#include "formats/export.h"

#include <xxhash.h>
#include <zstd.h>

#include <cstring>
#include <string>

namespace kvtier::exportfile {

namespace {

constexpr uint32_t kFileMagic = 0x5854564Bu;   // "KVTX"
constexpr uint32_t kFrameMagic = 0x5258564Bu;  // "KVXR"
constexpr uint32_t kTrailerMagic = 0x4554564Bu;  // "KVTE"

template <typename T>
void Put(uint8_t* p, size_t off, T v) { std::memcpy(p + off, &v, sizeof(T)); }
template <typename T>
T Get(const uint8_t* p, size_t off) {
  T v;
  std::memcpy(&v, p + off, sizeof(T));
  return v;
}

uint64_t HeaderChecksum(const uint8_t* fixed, std::span<const uint8_t> contract) {
  const uint64_t a = XXH3_64bits(fixed, 40);
  return XXH3_64bits_withSeed(contract.data(), contract.size(), a);
}

uint64_t FrameChecksum(std::span<const uint8_t> record_header, std::span<const uint8_t> stored) {
  const uint64_t a = XXH3_64bits(record_header.data(), record_header.size());
  return XXH3_64bits_withSeed(stored.data(), stored.size(), a);
}

}  // namespace

std::vector<uint8_t> EncodeFileHeader(const ScaleContract& c, uint64_t created_unix_s) {
  const auto contract = c.Serialize();
  std::vector<uint8_t> out(kFileHeaderSize + contract.size(), 0);
  uint8_t* p = out.data();
  Put<uint32_t>(p, 0, kFileMagic);
  Put<uint16_t>(p, 4, kExportFormatVersion);
  Put<uint32_t>(p, 8, static_cast<uint32_t>(contract.size()));
  Put<uint64_t>(p, 16, c.Id());
  Put<uint64_t>(p, 24, created_unix_s);
  std::memcpy(p + kFileHeaderSize, contract.data(), contract.size());
  Put<uint64_t>(p, 40, HeaderChecksum(p, contract));
  return out;
}

Status DecodeFixedHeader(std::span<const uint8_t> fixed, uint32_t* contract_len, FileHeader* out) {
  if (fixed.size() < kFileHeaderSize) return Status::Corrupt("export file: header truncated");
  const uint8_t* p = fixed.data();
  if (Get<uint32_t>(p, 0) != kFileMagic) return Status::Invalid("not a kvtier export file (bad magic)");
  const uint16_t version = Get<uint16_t>(p, 4);
  if (version != kExportFormatVersion) {
    return Status::Unsupported("export file format version " + std::to_string(version) +
                               " (this build reads version " + std::to_string(kExportFormatVersion) + ")");
  }
  if (Get<uint16_t>(p, 6) != 0 || Get<uint32_t>(p, 12) != 0 || Get<uint64_t>(p, 32) != 0) {
    return Status::Corrupt("export file: header flags/reserved bytes are not zero");
  }
  *contract_len = Get<uint32_t>(p, 8);
  if (*contract_len == 0 || *contract_len > kMaxContractBytes) {
    return Status::Corrupt("export file: contract length " + std::to_string(*contract_len) + " out of range");
  }
  out->contract_id = Get<uint64_t>(p, 16);
  out->created_unix_s = Get<uint64_t>(p, 24);
  return Status::Ok();
}

StatusOr<ScaleContract> DecodeContract(std::span<const uint8_t> fixed,
                                       std::span<const uint8_t> contract_bytes,
                                       const FileHeader& h) {
  if (Get<uint64_t>(fixed.data(), 40) != HeaderChecksum(fixed.data(), contract_bytes)) {
    return Status::Corrupt("export file: header checksum mismatch");
  }
  auto c = ScaleContract::Deserialize(contract_bytes);
  if (!c.ok()) return Status::Corrupt("export file: contract: " + c.status().message());
  if (c->Id() != h.contract_id) return Status::Corrupt("export file: contract id does not match its contract");
  return c;
}

std::vector<uint8_t> EncodeFrame(uint64_t contract_id, const Key128& key, const Key128& parent,
                                 std::span<const uint8_t> payload, int level,
                                 uint64_t* frame_checksum, bool* compressed) {
  RecordHeader rec;
  rec.contract_id = contract_id;
  rec.key = key;
  rec.parent = parent;
  rec.payload_len = payload.size();
  rec.payload_xxh3 = PayloadChecksum(payload);
  std::vector<uint8_t> z(ZSTD_compressBound(payload.size()));
  size_t zn = ZSTD_compress(z.data(), z.size(), payload.data(), payload.size(), level);
  const bool use_z = !ZSTD_isError(zn) && zn * 100 <= payload.size() * (100 - kMinSavingPercent);
  std::span<const uint8_t> stored = use_z ? std::span<const uint8_t>(z.data(), zn) : payload;
  std::vector<uint8_t> out(kFrameHeaderSize + kRecordHeaderSize + stored.size());
  uint8_t* p = out.data();
  rec.Encode(p + kFrameHeaderSize);
  std::memcpy(p + kFrameHeaderSize + kRecordHeaderSize, stored.data(), stored.size());
  const uint64_t sum = FrameChecksum(std::span(p + kFrameHeaderSize, kRecordHeaderSize), stored);
  Put<uint32_t>(p, 0, kFrameMagic);
  Put<uint32_t>(p, 4, use_z ? kFlagZstd : 0u);
  Put<uint64_t>(p, 8, stored.size());
  Put<uint64_t>(p, 16, sum);
  *frame_checksum = sum;
  *compressed = use_z;
  return out;
}

Status DecodeFrameHeader(std::span<const uint8_t> bytes, FrameHeader* out) {
  if (bytes.size() < kFrameHeaderSize) return Status::Corrupt("export file: truncated frame header");
  const uint8_t* p = bytes.data();
  if (Get<uint32_t>(p, 0) != kFrameMagic) return Status::Corrupt("export file: bad frame magic");
  out->flags = Get<uint32_t>(p, 4);
  out->stored_len = Get<uint64_t>(p, 8);
  out->checksum = Get<uint64_t>(p, 16);
  if ((out->flags & ~kFlagZstd) != 0) return Status::Corrupt("export file: unknown frame flags");
  if (out->stored_len == 0 || out->stored_len > kMaxRecordPayload + (kMaxRecordPayload >> 7)) {
    return Status::Corrupt("export file: frame length out of range");
  }
  return Status::Ok();
}

Status DecodeFrameBody(const FrameHeader& fh, std::span<const uint8_t> body, uint64_t contract_id,
                       uint64_t max_payload, RecordHeader* rec, std::vector<uint8_t>* payload) {
  if (body.size() != kRecordHeaderSize + fh.stored_len) return Status::Corrupt("export file: truncated frame");
  const auto rh = body.subspan(0, kRecordHeaderSize);
  const auto stored = body.subspan(kRecordHeaderSize);
  if (FrameChecksum(rh, stored) != fh.checksum) return Status::Corrupt("export file: frame checksum mismatch");
  auto h = RecordHeader::Decode(rh);
  if (!h.ok()) return Status::Corrupt("export file: " + h.status().message());
  if (h->contract_id != contract_id) return Status::Corrupt("export file: record of another contract");
  if (h->payload_len > max_payload) {
    return Status::Corrupt("export file: payload of " + std::to_string(h->payload_len) +
                           " bytes exceeds the contract's block size");
  }
  if (fh.flags & kFlagZstd) {
    const unsigned long long content = ZSTD_getFrameContentSize(stored.data(), stored.size());
    if (content != h->payload_len) return Status::Corrupt("export file: zstd frame size does not match the record");
    payload->resize(h->payload_len);
    const size_t n = ZSTD_decompress(payload->data(), payload->size(), stored.data(), stored.size());
    if (ZSTD_isError(n) || n != h->payload_len) return Status::Corrupt("export file: zstd frame does not decode");
  } else {
    if (stored.size() != h->payload_len) return Status::Corrupt("export file: stored length does not match the record");
    payload->assign(stored.begin(), stored.end());
  }
  KVTIER_RETURN_IF_ERROR(VerifyPayload(*h, *payload));
  *rec = *h;
  return Status::Ok();
}

std::vector<uint8_t> EncodeTrailer(const std::vector<uint64_t>& sums) {
  std::vector<uint8_t> out(kTrailerSize, 0);
  uint8_t* p = out.data();
  Put<uint32_t>(p, 0, kTrailerMagic);
  Put<uint64_t>(p, 8, sums.size());
  Put<uint64_t>(p, 16, XXH3_64bits(sums.data(), sums.size() * 8));
  Put<uint64_t>(p, 24, XXH3_64bits(p, 24));
  return out;
}

bool IsTrailer(std::span<const uint8_t> bytes) {
  return bytes.size() >= 4 && Get<uint32_t>(bytes.data(), 0) == kTrailerMagic;
}

Status CheckTrailer(std::span<const uint8_t> bytes, const std::vector<uint64_t>& sums) {
  if (bytes.size() != kTrailerSize) return Status::Corrupt("export file: truncated trailer");
  const uint8_t* p = bytes.data();
  if (Get<uint32_t>(p, 0) != kTrailerMagic || Get<uint32_t>(p, 4) != 0) {
    return Status::Corrupt("export file: bad trailer");
  }
  if (Get<uint64_t>(p, 24) != XXH3_64bits(p, 24)) return Status::Corrupt("export file: trailer checksum mismatch");
  if (Get<uint64_t>(p, 8) != sums.size()) {
    return Status::Corrupt("export file: trailer counts " + std::to_string(Get<uint64_t>(p, 8)) +
                           " records, file holds " + std::to_string(sums.size()));
  }
  if (Get<uint64_t>(p, 16) != XXH3_64bits(sums.data(), sums.size() * 8)) {
    return Status::Corrupt("export file: records do not match the trailer");
  }
  return Status::Ok();
}

}  // namespace kvtier::exportfile
