// Fuzz target: the kvtierd config parser (config/): TOML text (toml++ behind it), sizes,
// and --set overrides. No exception may escape; an accepted config must validate; every
// refusal has a message.
#include <cstdint>
#include <string>
#include <string_view>

#include "config/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // Input: TOML text, optionally followed by "\n#--set " and one override.
  std::vector<kvtier::config::Override> ov;
  std::string_view toml = text;
  const size_t cut = text.find("\n#--set ");
  if (cut != std::string_view::npos) {
    toml = text.substr(0, cut);
    auto o = kvtier::config::ParseOverride(text.substr(cut + 8));
    if (o.ok()) ov.push_back(*o);
  }
  try {
    auto c = kvtier::config::LoadString(toml, ov, "fuzz.toml");
    if (c.ok()) {
      FUZZ_CHECK(c->Validate().ok());
    } else {
      FUZZ_CHECK(!c.status().message().empty());
    }
    auto s = kvtier::config::ParseSize(text.substr(0, 64));
    if (s.ok()) FUZZ_CHECK(!kvtier::config::FormatSize(*s).empty());
  } catch (...) {
    FUZZ_CHECK(!"an exception escaped the config library");
  }
  return 0;
}
