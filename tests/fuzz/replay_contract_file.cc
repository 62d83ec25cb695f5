// The contract_file fuzz target under another name, so that one gcc test binary can replay
// every target's corpus (tests/fuzz/replay_test.cc).
#define LLVMFuzzerTestOneInput KvtierFuzz_contract_file
#include "tests/fuzz/fuzz_contract_file.cc"
