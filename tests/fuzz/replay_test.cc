// Corpus replay: runs every seed of every fuzz target (tests/fuzz/corpus/<target>/)
// through its LLVMFuzzerTestOneInput, built with the normal compiler (gcc in CI), plus
// deterministic mutations of each seed: every truncation up to 512 bytes, every single
// bit flip in the first 256 bytes, and a few byte-value substitutions (0x00, 0xFF, 0x7F,
// 0x80, '"', '\n') at each of the first 256 positions. A target aborts on a broken
// promise, which fails the test. The libFuzzer binaries (scripts/fuzz.sh) explore further.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int KvtierFuzz_wire(const uint8_t*, size_t);
extern "C" int KvtierFuzz_record(const uint8_t*, size_t);
extern "C" int KvtierFuzz_contract(const uint8_t*, size_t);
extern "C" int KvtierFuzz_contract_file(const uint8_t*, size_t);
extern "C" int KvtierFuzz_config(const uint8_t*, size_t);
extern "C" int KvtierFuzz_safetensors(const uint8_t*, size_t);
extern "C" int KvtierFuzz_trace(const uint8_t*, size_t);
extern "C" int KvtierFuzz_export(const uint8_t*, size_t);

namespace {

using Target = int (*)(const uint8_t*, size_t);

uint64_t Replay(const std::string& name, Target fn) {
  const std::filesystem::path dir = std::filesystem::path(KVTIER_FUZZ_CORPUS_DIR) / name;
  EXPECT_TRUE(std::filesystem::is_directory(dir)) << dir;
  uint64_t inputs = 0, seeds = 0;
  for (const auto& ent : std::filesystem::directory_iterator(dir)) {
    if (!ent.is_regular_file()) continue;
    std::ifstream in(ent.path(), std::ios::binary);
    std::vector<uint8_t> seed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ++seeds;
    fn(seed.data(), seed.size());
    ++inputs;
    for (size_t n = 0; n < seed.size() && n < 512; ++n) {
      std::vector<uint8_t> t(seed.begin(), seed.begin() + static_cast<long>(n));
      fn(t.data(), t.size());
      ++inputs;
    }
    std::vector<uint8_t> m = seed;
    for (size_t i = 0; i < m.size() && i < 256; ++i) {
      const uint8_t keep = m[i];
      for (int b = 0; b < 8; ++b) {
        m[i] = static_cast<uint8_t>(keep ^ (1u << b));
        fn(m.data(), m.size());
        ++inputs;
      }
      for (int v : {0x00, 0xFF, 0x7F, 0x80, 0x22, 0x0A}) {  // ... '"', '\n'
        m[i] = static_cast<uint8_t>(v);
        fn(m.data(), m.size());
        ++inputs;
      }
      m[i] = keep;
    }
  }
  EXPECT_GT(seeds, 0u) << "no seeds in " << dir;
  std::printf("RELIABILITY fuzz replay %s: %llu seeds, %llu inputs\n", name.c_str(),
              (unsigned long long)seeds, (unsigned long long)inputs);
  return inputs;
}

TEST(FuzzCorpus, Wire) { Replay("wire", KvtierFuzz_wire); }
TEST(FuzzCorpus, Record) { Replay("record", KvtierFuzz_record); }
TEST(FuzzCorpus, Contract) { Replay("contract", KvtierFuzz_contract); }
TEST(FuzzCorpus, ContractFile) { Replay("contract_file", KvtierFuzz_contract_file); }
TEST(FuzzCorpus, Config) { Replay("config", KvtierFuzz_config); }
TEST(FuzzCorpus, Safetensors) { Replay("safetensors", KvtierFuzz_safetensors); }
TEST(FuzzCorpus, Trace) { Replay("trace", KvtierFuzz_trace); }
TEST(FuzzCorpus, Export) { Replay("export", KvtierFuzz_export); }

}  // namespace
