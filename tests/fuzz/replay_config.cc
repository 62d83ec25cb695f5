// The config fuzz target under another name, so that one gcc test binary can replay every
// target's corpus (tests/fuzz/replay_test.cc).
#define LLVMFuzzerTestOneInput KvtierFuzz_config
#include "tests/fuzz/fuzz_config.cc"
