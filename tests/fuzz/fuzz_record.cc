// Fuzz target: the NVMe/export record header parser (formats/record.h). Whatever
// RecordHeader::Decode accepts must encode back to the same 96 bytes (no field is read
// loosely), and VerifyPayload must agree with PayloadChecksum on the rest of the input.
#include <cstdint>
#include <cstring>
#include <span>

#include "formats/record.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto h = kvtier::RecordHeader::Decode(std::span<const uint8_t>(data, size));
  if (!h.ok()) {
    FUZZ_CHECK(!h.status().message().empty());  // every refusal says why
    return 0;
  }
  FUZZ_CHECK(size >= kvtier::kRecordHeaderSize);
  uint8_t again[kvtier::kRecordHeaderSize];
  h->Encode(again);
  FUZZ_CHECK(std::memcmp(again, data, kvtier::kRecordHeaderSize) == 0);
  FUZZ_CHECK(h->payload_len > 0 && h->payload_len <= kvtier::kMaxRecordPayload);
  std::span<const uint8_t> payload(data + kvtier::kRecordHeaderSize, size - kvtier::kRecordHeaderSize);
  const bool ok = kvtier::VerifyPayload(*h, payload).ok();
  const bool want = payload.size() == h->payload_len && kvtier::PayloadChecksum(payload) == h->payload_xxh3;
  FUZZ_CHECK(ok == want);
  return 0;
}
