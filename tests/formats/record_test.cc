// NVMe record header: round trip, every malformation refused with a reason, and the
// compatibility files under tests/data/.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include <xxhash.h>

#include "formats/record.h"

namespace kvtier {
namespace {

RecordHeader Sample() {
  RecordHeader h;
  h.contract_id = 0x1046e2d6e69eae7aull;
  h.key = Key128{0x1111222233334444ull, 0x5555666677778888ull};
  h.parent = Key128{0x9999aaaabbbbccccull, 0xddddeeeeffff0000ull};
  h.payload_len = 64;
  std::vector<uint8_t> payload(64);
  for (size_t i = 0; i < 64; ++i) payload[i] = static_cast<uint8_t>(i * 3);
  h.payload_xxh3 = PayloadChecksum(payload);
  h.sequence = 42;
  return h;
}

std::vector<uint8_t> ReadData(const std::string& name) {
  std::ifstream in(std::string(KVTIER_TEST_DATA_DIR) + "/" + name, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Re-seals a modified header so that only the field under test is wrong.
void Reseal(uint8_t* p) {
  const uint64_t sum = XXH3_64bits(p, kRecordHeaderChecksummed);
  std::memcpy(p + 88, &sum, 8);
}

TEST(Record, RoundTrip) {
  uint8_t buf[kRecordHeaderSize];
  Sample().Encode(buf);
  auto back = RecordHeader::Decode(buf);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, Sample());
  EXPECT_EQ(std::memcmp(buf, "KVTR", 4), 0);
}

TEST(Record, EveryTruncationRefused) {
  uint8_t buf[kRecordHeaderSize];
  Sample().Encode(buf);
  for (size_t n = 0; n < kRecordHeaderSize; ++n) {
    auto r = RecordHeader::Decode(std::span<const uint8_t>(buf, n));
    EXPECT_TRUE(r.status().IsCorrupt()) << n;
  }
}

TEST(Record, EveryFlippedBitRefused) {
  uint8_t buf[kRecordHeaderSize];
  Sample().Encode(buf);
  for (size_t byte = 0; byte < kRecordHeaderSize; ++byte) {
    for (int bit = 0; bit < 8; ++bit) {
      uint8_t copy[kRecordHeaderSize];
      std::memcpy(copy, buf, sizeof copy);
      copy[byte] ^= static_cast<uint8_t>(1u << bit);
      auto r = RecordHeader::Decode(copy);
      EXPECT_FALSE(r.ok()) << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(Record, ResealedMalformationsRefusedWithReason) {
  uint8_t buf[kRecordHeaderSize];
  struct Case {
    size_t off;
    std::vector<uint8_t> bytes;
    StatusCode code;
    const char* reason;
  };
  const std::vector<Case> cases = {
      {0, {'X', 'V', 'T', 'R'}, StatusCode::kCorrupt, "magic"},
      {4, {2, 0}, StatusCode::kUnsupported, "version 2"},
      {4, {0, 0}, StatusCode::kUnsupported, "version 0"},
      {6, {64, 0}, StatusCode::kCorrupt, "header_size"},
      {72, {1, 0, 0, 0}, StatusCode::kCorrupt, "flags"},
      {80, {1}, StatusCode::kCorrupt, "reserved"},
      {48, {0, 0, 0, 0, 0, 0, 0, 0}, StatusCode::kCorrupt, "payload_len"},
      {48, {1, 0, 0, 0, 1, 0, 0, 0}, StatusCode::kCorrupt, "payload_len"},
  };
  for (const auto& c : cases) {
    Sample().Encode(buf);
    std::memcpy(buf + c.off, c.bytes.data(), c.bytes.size());
    Reseal(buf);
    auto r = RecordHeader::Decode(buf);
    ASSERT_FALSE(r.ok()) << c.reason;
    EXPECT_EQ(r.status().code(), c.code) << c.reason;
    EXPECT_NE(r.status().message().find(c.reason), std::string::npos)
        << r.status().message() << " should name " << c.reason;
  }
}

TEST(Record, PayloadVerification) {
  std::vector<uint8_t> payload(64);
  for (size_t i = 0; i < 64; ++i) payload[i] = static_cast<uint8_t>(i * 3);
  EXPECT_TRUE(VerifyPayload(Sample(), payload).ok());
  payload[10] ^= 0x10;
  EXPECT_TRUE(VerifyPayload(Sample(), payload).IsCorrupt());
  payload.pop_back();
  EXPECT_TRUE(VerifyPayload(Sample(), payload).IsCorrupt());
}

// tests/data/record_v1.bin was written by format version 1 (header + 64-byte payload);
// every later version must keep reading it or refuse it by name.
TEST(Record, ReadsVersion1File) {
  const auto file = ReadData("record_v1.bin");
  ASSERT_EQ(file.size(), kRecordHeaderSize + 64) << "missing tests/data/record_v1.bin";
  auto h = RecordHeader::Decode(file);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(*h, Sample());
  EXPECT_TRUE(VerifyPayload(*h, std::span(file).subspan(kRecordHeaderSize)).ok());
}

TEST(Record, RefusesFutureVersionFileByName) {
  const auto file = ReadData("record_v2_future.bin");
  ASSERT_EQ(file.size(), kRecordHeaderSize + 64) << "missing tests/data/record_v2_future.bin";
  auto h = RecordHeader::Decode(file);
  EXPECT_EQ(h.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(h.status().message().find("version 2"), std::string::npos) << h.status().message();
}

}  // namespace
}  // namespace kvtier
