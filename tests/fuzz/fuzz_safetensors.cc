// Fuzz target: the safetensors reader (tools/quality/safetensors.h), which reads KV
// dumps from engines. Parsed tensors must lie inside the file; reading one converts it or
// refuses it; the KV-dump index accepts or refuses with a message.
#include <cstdint>
#include <span>
#include <vector>

#include "tests/fuzz/fuzz_util.h"
#include "tools/quality/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::quality;
  auto f = SafetensorsView::Parse(std::span<const uint8_t>(data, size));
  if (!f.ok()) {
    FUZZ_CHECK(!f.status().message().empty());
    return 0;
  }
  for (const auto& [name, t] : f->tensors()) {
    FUZZ_CHECK(t.begin <= t.end && t.end <= size);
    FUZZ_CHECK(t.end - t.begin == t.numel() * DTypeSize(t.dtype));
    if (t.numel() > (1u << 16)) continue;  // keep each run short
    std::vector<float> out;
    if (f->ReadFloat(t, &out).ok()) FUZZ_CHECK(out.size() == t.numel());
  }
  auto idx = IndexKvDump(*f);
  if (!idx.ok()) FUZZ_CHECK(!idx.status().message().empty());
  return 0;
}
