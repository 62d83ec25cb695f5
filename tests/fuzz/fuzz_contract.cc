// Fuzz target: the scale contract deserializer (formats/contract.h), which reads what a
// client sends in kRegisterContract. Whatever it accepts must be a valid contract whose
// canonical serialization is exactly the input (one contract, one byte string, one id).
#include <cstdint>
#include <span>
#include <vector>

#include "formats/contract.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto c = kvtier::ScaleContract::Deserialize(std::span<const uint8_t>(data, size));
  if (!c.ok()) {
    FUZZ_CHECK(!c.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(c->Validate().ok());
  const std::vector<uint8_t> again = c->Serialize();
  FUZZ_CHECK(again.size() == size && std::equal(again.begin(), again.end(), data));
  FUZZ_CHECK(c->block_bytes() > 0);
  auto c2 = kvtier::ScaleContract::Deserialize(again);
  FUZZ_CHECK(c2.ok() && *c2 == *c && c2->Id() == c->Id());
  return 0;
}
