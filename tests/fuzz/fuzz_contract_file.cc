// Fuzz target: the contract file parser (daemon/contract_store.h, ParseContractFile), which
// reads <tiers.nvme.dir>/contracts.kvc at start. Whatever it accepts is a prefix of the
// input whose every contract is valid; parsing that prefix again gives the same prefix and
// the same contracts (the torn tail it cuts off holds nothing it kept).
#include <cstdint>
#include <span>
#include <unordered_set>
#include <vector>

#include "daemon/contract_store.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  std::vector<kvtier::ScaleContract> got;
  auto r = kvtier::daemon::ParseContractFile(in, "contracts.kvc", &got);
  if (!r.ok()) {
    FUZZ_CHECK(got.empty());
    FUZZ_CHECK(r.status().message().find("contracts.kvc") != std::string::npos);
    return 0;
  }
  FUZZ_CHECK(*r <= size);
  FUZZ_CHECK(*r == 0 ? got.empty() : *r >= sizeof(kvtier::daemon::ContractFileHeader));
  std::unordered_set<uint64_t> ids;
  for (const auto& c : got) {
    FUZZ_CHECK(c.Validate().ok());
    FUZZ_CHECK(ids.insert(c.Id()).second);  // one contract per id
  }
  std::vector<kvtier::ScaleContract> again;
  auto r2 = kvtier::daemon::ParseContractFile(in.first(*r), "contracts.kvc", &again);
  FUZZ_CHECK(r2.ok() && *r2 == *r && again == got);
  return 0;
}
