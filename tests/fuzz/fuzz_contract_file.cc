// Fuzz target: the contract file parser (daemon/contract_store.h, ParseContractRecords), which
// reads <tiers.nvme.dir>/contracts.kvc at start. Whatever it accepts is a prefix of the
// input whose every contract is valid, one per (namespace, id), each namespace name empty
// or at most kMaxContractNsBytes; parsing that prefix again gives the same prefix and the
// same records (the torn tail it cuts off holds nothing it kept).
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "daemon/contract_store.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  std::vector<kvtier::daemon::StoredContract> got;
  auto r = kvtier::daemon::ParseContractRecords(in, "contracts.kvc", &got);
  if (!r.ok()) {
    FUZZ_CHECK(got.empty());
    FUZZ_CHECK(r.status().message().find("contracts.kvc") != std::string::npos);
    return 0;
  }
  FUZZ_CHECK(*r <= size);
  FUZZ_CHECK(*r == 0 ? got.empty() : *r >= sizeof(kvtier::daemon::ContractFileHeader));
  std::set<std::pair<std::string, uint64_t>> keys;
  for (const auto& sc : got) {
    FUZZ_CHECK(sc.contract.Validate().ok());
    FUZZ_CHECK(sc.ns.size() <= kvtier::daemon::kMaxContractNsBytes);
    FUZZ_CHECK(keys.insert({sc.ns, sc.contract.Id()}).second);  // one record per (namespace, id)
  }
  std::vector<kvtier::daemon::StoredContract> again;
  auto r2 = kvtier::daemon::ParseContractRecords(in.first(*r), "contracts.kvc", &again);
  FUZZ_CHECK(r2.ok() && *r2 == *r && again == got);
  return 0;
}
