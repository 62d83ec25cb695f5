// kvtierctl synth: writes synthetic KV with the structure of real caches (outlier RoPE
// pairs, an attention sink, head/layer scale spread, position drift) as a safetensors
// KV dump, so that analyze and calibrate can be tried without a model.
// Parameters: tools/quality/synth.h.
#include <cstdio>

#include "tools/cli.h"
#include "tools/quality/synth.h"

namespace kvtier::cli {
namespace {

constexpr const char* kUsage =
    "usage: kvtierctl synth --out KV.safetensors [options]\n"
    "  --dtype bf16|f16|f32   (default: bf16)\n"
    "  --layers N --kv-heads N --head-dim N --tokens N   (default: 4, 8, 128, 512)\n"
    "  --queries N --q-per-kv N   queries written as layers.{i}.q (default: 16, 4)\n"
    "  --seed N --k-std X --v-std X --outlier-pairs N --outlier-scale X --q-outlier X\n"
    "  --rope-theta X --sink-scale X --head-spread X --layer-spread X --drift X\n"
    "  (meaning and defaults: tools/quality/synth.h, docs/quality.md)\n";

int Run(const std::vector<std::string>& argv) {
  auto args = Args::Parse(argv, {"help"});
  if (!args.ok()) return Fail("synth: " + args.status().message(), 2);
  if (args->Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (auto s = args->CheckKnown({"out", "dtype", "layers", "kv-heads", "head-dim", "tokens",
                                 "queries", "q-per-kv", "seed", "k-std", "v-std", "outlier-pairs",
                                 "outlier-scale", "q-outlier", "rope-theta", "sink-scale",
                                 "head-spread", "layer-spread", "drift", "help"});
      !s.ok()) {
    return Fail("synth: " + s.message(), 2);
  }
  if (!args->positional().empty()) {
    return Fail("synth: unexpected argument '" + args->positional()[0] + "'", 2);
  }
  auto out = args->Require("out");
  if (!out.ok()) return Fail("synth: " + out.status().message(), 2);
  quality::DType dtype = quality::DType::kBF16;
  if (auto d = args->Get("dtype"); d && !quality::ParseDType(*d, &dtype)) {
    return Fail("synth: --dtype must be bf16, f16 or f32", 2);
  }
  quality::SynthOptions o;
  struct IntOpt {
    const char* name;
    uint32_t* dst;
  } ints[] = {{"layers", &o.layers},   {"kv-heads", &o.kv_heads}, {"head-dim", &o.head_dim},
              {"tokens", &o.tokens},   {"queries", &o.queries},   {"q-per-kv", &o.q_per_kv},
              {"outlier-pairs", &o.outlier_pairs}};
  for (auto& i : ints) {
    auto v = args->GetInt(i.name, *i.dst);
    if (!v.ok()) return Fail("synth: " + v.status().message(), 2);
    if (*v < 0 || *v > 0xFFFFFFFFll) return Fail(std::string("synth: --") + i.name + " out of range", 2);
    *i.dst = static_cast<uint32_t>(*v);
  }
  auto seed = args->GetInt("seed", 1);
  if (!seed.ok() || *seed < 0) return Fail("synth: --seed must be a non-negative integer", 2);
  o.seed = static_cast<uint64_t>(*seed);
  struct FloatOpt {
    const char* name;
    float* dst;
  } floats[] = {{"k-std", &o.k_std},           {"v-std", &o.v_std},
                {"outlier-scale", &o.outlier_scale}, {"q-outlier", &o.q_outlier},
                {"rope-theta", &o.rope_theta}, {"sink-scale", &o.sink_scale},
                {"head-spread", &o.head_spread}, {"layer-spread", &o.layer_spread},
                {"drift", &o.drift}};
  for (auto& f : floats) {
    auto v = args->GetDouble(f.name, *f.dst);
    if (!v.ok()) return Fail("synth: " + v.status().message(), 2);
    *f.dst = static_cast<float>(*v);
  }
  if (auto s = o.Validate(); !s.ok()) return Fail(s.message(), 2);
  auto kv = quality::GenerateSynthKv(o);
  if (!kv.ok()) return Fail(kv.status().message());
  auto bytes = quality::SynthToSafetensors(*kv, dtype, o);
  if (!bytes.ok()) return Fail("synth: " + bytes.status().message());
  if (auto s = WriteFileAtomic(*out, bytes->data(), bytes->size()); !s.ok()) {
    return Fail("synth: " + s.message());
  }
  std::printf("synth: wrote %s (%u layers, %u tokens, %u KV heads, head_dim %u, %s, %zu bytes)\n",
              out->c_str(), o.layers, o.tokens, o.kv_heads, o.head_dim, quality::DTypeName(dtype),
              bytes->size());
  return 0;
}

const CommandRegistrar kSynth("synth", "write synthetic structured KV as a safetensors dump", Run);

}  // namespace
}  // namespace kvtier::cli
