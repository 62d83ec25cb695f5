// kvtierctl codec encode|decode|roundtrip: the CPU NVFP4 codec on raw files.
//
//   encode    --rule max6|4over6 --kv-scale F --in IN.f32 --out OUT.bin
//   decode    --kv-scale F --in IN.bin --out OUT.f32
//   roundtrip --rule max6|4over6 --kv-scale F --in IN.f32 --out OUT.f32
//
// IN.f32 / OUT.f32: raw little-endian float32, a multiple of 16 values.
// OUT.bin / IN.bin: all packed data bytes (n/2), then all E4M3 scale bytes (n/16).
#include <cstring>
#include <string>
#include <vector>

#include "formats/nvfp4.h"
#include "tools/cli.h"

namespace kvtier {
namespace {

using cli::Fail;

constexpr const char* kUsage =
    "usage: kvtierctl codec encode --rule max6|4over6 --kv-scale F --in IN.f32 --out OUT.bin\n"
    "       kvtierctl codec decode --kv-scale F --in IN.bin --out OUT.f32\n"
    "       kvtierctl codec roundtrip --rule max6|4over6 --kv-scale F --in IN.f32 --out OUT.f32\n";

StatusOr<std::vector<float>> ReadFloats(const std::string& path) {
  auto bytes = cli::ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  if (bytes->empty()) return Status::Invalid(path + " is empty");
  if (bytes->size() % (16 * sizeof(float)) != 0) {
    return Status::Invalid(path + ": " + std::to_string(bytes->size()) +
                           " bytes is not a whole number of float32 groups of 16");
  }
  std::vector<float> x(bytes->size() / sizeof(float));
  std::memcpy(x.data(), bytes->data(), bytes->size());
  if (auto s = nvfp4::CheckFinite(x); !s.ok()) return Status::Invalid(path + ": " + s.message());
  return x;
}

StatusOr<float> ParseKvScale(const cli::Args& a) {
  auto d = a.GetDouble("kv-scale", std::nullopt);
  if (!d.ok()) return d.status();
  const float f = static_cast<float>(*d);
  if (!nvfp4::IsValidGlobalScale(f)) {
    return Status::Invalid("--kv-scale must be a finite positive normal float32, got " +
                           std::to_string(*d));
  }
  return f;
}

StatusOr<nvfp4::ScaleRule> ParseRule(const cli::Args& a) {
  const std::string r = a.Get("rule").value_or("max6");
  if (r == "max6") return nvfp4::ScaleRule::kMax6;
  if (r == "4over6") return nvfp4::ScaleRule::k4over6;
  return Status::Invalid("--rule must be max6 or 4over6, got '" + r + "'");
}

int Run(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help") {
    std::fputs(kUsage, argv.empty() ? stderr : stdout);
    return argv.empty() ? 2 : 0;
  }
  const std::string mode = argv[0];
  auto args = cli::Args::Parse(std::vector<std::string>(argv.begin() + 1, argv.end()));
  if (!args.ok()) return Fail("codec: " + args.status().message(), 2);
  const bool has_rule = mode != "decode";
  std::vector<std::string> known = {"kv-scale", "in", "out"};
  if (has_rule) known.push_back("rule");
  if (mode != "encode" && mode != "decode" && mode != "roundtrip") {
    return Fail("codec: unknown mode '" + mode + "' (encode, decode, roundtrip)", 2);
  }
  if (auto s = args->CheckKnown(known); !s.ok()) return Fail("codec " + mode + ": " + s.message(), 2);
  if (!args->positional().empty()) {
    return Fail("codec " + mode + ": unexpected argument '" + args->positional()[0] + "'", 2);
  }
  auto in = args->Require("in");
  auto out = args->Require("out");
  auto kv = ParseKvScale(*args);
  auto rule = ParseRule(*args);
  for (const Status* s : {&in.status(), &out.status(), &kv.status(), &rule.status()}) {
    if (!s->ok()) return Fail("codec " + mode + ": " + s->message(), 2);
  }

  if (mode == "decode") {
    auto bytes = cli::ReadFile(*in);
    if (!bytes.ok()) return Fail("codec decode: " + bytes.status().message());
    // n/2 + n/16 = 9n/16 bytes, n a positive multiple of 16: a multiple of 9.
    if (bytes->empty() || bytes->size() % 9 != 0) {
      return Fail("codec decode: " + *in + ": " + std::to_string(bytes->size()) +
                  " bytes is not n/2 data + n/16 scale bytes for any n multiple of 16");
    }
    const size_t n = bytes->size() / 9 * 16;
    std::span<const uint8_t> all(*bytes);
    std::vector<float> y(n);
    if (auto s = nvfp4::Dequantize(all.subspan(0, n / 2), all.subspan(n / 2), *kv, y); !s.ok()) {
      return Fail("codec decode: " + *in + ": " + s.message());
    }
    if (auto s = cli::WriteFileAtomic(*out, y.data(), y.size() * 4); !s.ok()) {
      return Fail("codec decode: " + s.message());
    }
    return 0;
  }

  auto x = ReadFloats(*in);
  if (!x.ok()) return Fail("codec " + mode + ": " + x.status().message());
  const size_t n = x->size();
  std::vector<uint8_t> packed(n / 2 + n / 16);
  std::span<uint8_t> all(packed);
  if (auto s = nvfp4::Quantize(*x, *kv, *rule, all.subspan(0, n / 2), all.subspan(n / 2)); !s.ok()) {
    return Fail("codec " + mode + ": " + s.message());
  }
  Status s;
  if (mode == "encode") {
    s = cli::WriteFileAtomic(*out, packed.data(), packed.size());
  } else {
    std::vector<float> y(n);
    s = nvfp4::Dequantize(all.subspan(0, n / 2), all.subspan(n / 2), *kv, y);
    if (s.ok()) s = cli::WriteFileAtomic(*out, y.data(), y.size() * 4);
  }
  if (!s.ok()) return Fail("codec " + mode + ": " + s.message());
  return 0;
}

cli::CommandRegistrar reg("codec", "NVFP4 encode/decode/roundtrip of raw float32 files", Run, "",
                          {"encode", "decode", "roundtrip"});

}  // namespace
}  // namespace kvtier
