// The record fuzz target under another name, so that one gcc test binary can replay every
// target's corpus (tests/fuzz/replay_test.cc).
#define LLVMFuzzerTestOneInput KvtierFuzz_record
#include "tests/fuzz/fuzz_record.cc"
