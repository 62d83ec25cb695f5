// Helpers shared by the tiers tests: temp folders under /tmp, aligned buffers, patterns.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include "formats/keys.h"

namespace kvtier::tiers::testing {

// A fresh folder under /tmp, removed with its contents when the object dies.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/kvtier-tiers-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuf = std::unique_ptr<uint8_t, FreeDeleter>;
inline AlignedBuf Aligned(size_t n) {
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
  std::memset(p, 0, (n + 4095) / 4096 * 4096);
  return AlignedBuf(p);
}

// Deterministic bytes for block `seed`, different for every seed.
inline void Fill(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}
inline bool Matches(const uint8_t* p, size_t n, uint64_t seed) {
  std::unique_ptr<uint8_t[]> want(new uint8_t[n]);
  Fill(want.get(), n, seed);
  return std::memcmp(p, want.get(), n) == 0;
}

inline Key128 K(uint64_t i) { return Key128{0xABCDull << 32 | i, i * 7919 + 1}; }

}  // namespace kvtier::tiers::testing
