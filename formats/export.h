// The export file (.kvt): a self-describing, portable copy of one contract's blocks.
//
//   file    = FileHeader contract_bytes Frame* Trailer
//   FileHeader (48 bytes, little-endian):
//      0  4 magic "KVTX"          4  2 version (kExportFormatVersion)   6  2 flags (0)
//      8  4 contract_len          12 4 reserved (0)
//     16  8 contract_id (XXH3-64 of the contract bytes that follow)
//     24  8 created_unix_s       32  8 reserved (0)
//     40  8 xxh3 of bytes [0, 40) and of the contract bytes (seeded chain, see .cc)
//   contract_bytes: ScaleContract::Serialize() (canonical, carries its own version)
//   Frame   = FrameHeader(24) RecordHeader(96, formats/record.h) stored_bytes
//     FrameHeader: 0 4 magic "KVXR" | 4 4 flags (bit 0: stored bytes are a zstd frame)
//                  | 8 8 stored_len | 16 8 xxh3 of (record header || stored bytes)
//   Trailer (32 bytes): 0 4 magic "KVTE" | 4 4 reserved (0) | 8 8 frame count
//                  | 16 8 xxh3 of the concatenated frame checksums | 24 8 xxh3 of [0, 24)
//
// Every frame is checked on its own (frame checksum, then the record header's own
// checksum, then after decompression the payload's XXH3 against the record header), and
// the trailer proves that no frame was cut off or dropped. A reader can therefore refuse
// a corrupt or truncated file *before* anything is stored: verify the whole file, then
// import. Compression is per payload and only where it pays (a zstd frame is kept only
// when it is at least kMinSavingPercent smaller than the raw payload).
//
// When you modify this layout, bump kExportFormatVersion and keep an old file under
// tests/data/ with a test that reads it or refuses it by name.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "formats/contract.h"
#include "formats/record.h"
#include "formats/status.h"

namespace kvtier::exportfile {

inline constexpr uint16_t kExportFormatVersion = 1;
inline constexpr size_t kFileHeaderSize = 48;
inline constexpr size_t kFrameHeaderSize = 24;
inline constexpr size_t kTrailerSize = 32;
inline constexpr uint32_t kFlagZstd = 1u;
inline constexpr int kMinSavingPercent = 3;
inline constexpr uint32_t kMaxContractBytes = 64 * 1024;

struct FileHeader {
  uint64_t contract_id = 0;
  uint64_t created_unix_s = 0;
};

// Header + contract bytes, ready to write.
std::vector<uint8_t> EncodeFileHeader(const ScaleContract& c, uint64_t created_unix_s);

// Parses the fixed header; *contract_len gets the contract byte count that follows.
Status DecodeFixedHeader(std::span<const uint8_t> fixed, uint32_t* contract_len,
                         FileHeader* out);
// Checks the header checksum over fixed + contract bytes, parses and validates the
// contract, and checks that its id matches the header.
StatusOr<ScaleContract> DecodeContract(std::span<const uint8_t> fixed,
                                       std::span<const uint8_t> contract_bytes,
                                       const FileHeader& h);

// Encodes one block as a frame (compressing the payload when it pays, zstd level
// `level`). The record header's payload fields are filled from the payload.
// *frame_checksum receives the frame's checksum for the trailer.
std::vector<uint8_t> EncodeFrame(uint64_t contract_id, const Key128& key, const Key128& parent,
                                 std::span<const uint8_t> payload, int level,
                                 uint64_t* frame_checksum, bool* compressed);

struct FrameHeader {
  uint32_t flags = 0;
  uint64_t stored_len = 0;
  uint64_t checksum = 0;
};
Status DecodeFrameHeader(std::span<const uint8_t> bytes, FrameHeader* out);

// Checks a frame body (record header || stored bytes) against its frame header and
// returns the record header and the decoded (decompressed, verified) payload.
// max_payload bounds the decompressed size (a corrupt length must not allocate GiBs).
Status DecodeFrameBody(const FrameHeader& fh, std::span<const uint8_t> body,
                       uint64_t contract_id, uint64_t max_payload, RecordHeader* rec,
                       std::vector<uint8_t>* payload);

// Trailer over the frame checksums written.
std::vector<uint8_t> EncodeTrailer(const std::vector<uint64_t>& frame_checksums);
Status CheckTrailer(std::span<const uint8_t> bytes, const std::vector<uint64_t>& frame_checksums);

// True when the bytes at the start of a frame position are a trailer.
bool IsTrailer(std::span<const uint8_t> bytes);

}  // namespace kvtier::exportfile
