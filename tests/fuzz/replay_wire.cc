// The wire fuzz target under another name, so that one gcc test binary can replay every
// target's corpus (tests/fuzz/replay_test.cc).
#define LLVMFuzzerTestOneInput KvtierFuzz_wire
#include "tests/fuzz/fuzz_wire.cc"
