// kvtierctl calibrate: per-layer NVFP4 global scales from a KV dump, written as a scales
// file (tools/quality/calibrate.h) that a scale contract takes.
// kvtierctl contract id: the contract id of a geometry, with or without such scales, so
// that one sees calibration give a new id (old blocks stay apart).
#include <cstdio>

#include "formats/contract.h"
#include "tools/cli.h"
#include "tools/quality/calibrate.h"

namespace kvtier::cli {
namespace {

constexpr const char* kCalibrateUsage =
    "usage: kvtierctl calibrate --in KV.safetensors --out scales.toml [--percentile P]\n"
    "  Per-layer K and V global scales = statistic / (448 * 6), where the statistic is the\n"
    "  layer's amax of |x| (default) or its P-th percentile (0 < P <= 100). The dump needs\n"
    "  layers 0..L-1.\n";

int Calibrate(const std::vector<std::string>& argv) {
  auto args = Args::Parse(argv, {"help"});
  if (!args.ok()) return Fail("calibrate: " + args.status().message(), 2);
  if (args->Has("help")) {
    std::fputs(kCalibrateUsage, stdout);
    return 0;
  }
  if (auto s = args->CheckKnown({"in", "out", "percentile", "help"}); !s.ok()) {
    return Fail("calibrate: " + s.message(), 2);
  }
  if (!args->positional().empty()) {
    return Fail("calibrate: unexpected argument '" + args->positional()[0] + "'", 2);
  }
  auto in = args->Require("in");
  auto out = args->Require("out");
  auto pct = args->GetDouble("percentile", 100.0);
  for (const auto* s : {&in.status(), &out.status(), &pct.status()}) {
    if (!s->ok()) return Fail("calibrate: " + s->message(), 2);
  }
  quality::CalibrateOptions o;
  o.percentile = *pct;
  if (auto s = o.Validate(); !s.ok()) return Fail("calibrate: --" + s.message(), 2);
  auto file = quality::MappedFile::Open(*in);
  if (!file.ok()) return Fail("calibrate: " + file.status().message());
  auto view = quality::SafetensorsView::Parse((*file)->bytes());
  if (!view.ok()) return Fail("calibrate: " + *in + ": " + view.status().message());
  auto cal = quality::Calibrate(*view, o);
  if (!cal.ok()) return Fail("calibrate: " + *in + ": " + cal.status().message());
  const std::string toml = quality::CalibrationToToml(*cal, *in);
  if (auto s = WriteFileAtomic(*out, toml.data(), toml.size()); !s.ok()) {
    return Fail("calibrate: " + s.message());
  }
  std::printf("calibrate: %zu layers, statistic %s, wrote %s\n", cal->k_scales.size(),
              cal->statistic.c_str(), out->c_str());
  for (size_t l = 0; l < cal->k_scales.size(); ++l) {
    std::printf("  layer %-4zu K %-10s %.6g -> scale %.9g   V %-10s %.6g -> scale %.9g\n", l,
                cal->statistic.c_str(), static_cast<double>(cal->k_stat[l]),
                static_cast<double>(cal->k_scales[l]), cal->statistic.c_str(),
                static_cast<double>(cal->v_stat[l]), static_cast<double>(cal->v_scales[l]));
  }
  return 0;
}

constexpr const char* kContractUsage =
    "usage: kvtierctl contract id --model M --layers L --kv-heads H --head-dim D\n"
    "                             --block-tokens T [--scales scales.toml]\n"
    "                             [--rule max6|4over6] [--format nvfp4|fp8|bf16]\n"
    "                             [--model-revision R] [--tokenizer-revision R]\n"
    "                             [--tp-rank N --tp-size N]\n"
    "  Prints the contract id (16 hex digits). Without --scales every global scale is 1.0.\n";

int Contract(const std::vector<std::string>& argv) {
  auto args = Args::Parse(argv, {"help"});
  if (!args.ok()) return Fail("contract: " + args.status().message(), 2);
  if (args->Has("help") || args->positional().empty()) {
    std::fputs(kContractUsage, args->Has("help") ? stdout : stderr);
    return args->Has("help") ? 0 : 2;
  }
  if (args->positional().size() != 1 || args->positional()[0] != "id") {
    return Fail("contract: unknown subcommand '" + args->positional()[0] + "' (expected: id)", 2);
  }
  if (auto s = args->CheckKnown({"model", "layers", "kv-heads", "head-dim", "block-tokens",
                                 "scales", "rule", "format", "model-revision",
                                 "tokenizer-revision", "tp-rank", "tp-size", "help"});
      !s.ok()) {
    return Fail("contract: " + s.message(), 2);
  }
  ScaleContract c;
  auto model = args->Require("model");
  if (!model.ok()) return Fail("contract: " + model.status().message(), 2);
  c.model_id = *model;
  c.model_revision = args->Get("model-revision").value_or("");
  c.tokenizer_revision = args->Get("tokenizer-revision").value_or("");
  struct U32Opt {
    const char* name;
    uint32_t* dst;
    std::optional<int64_t> def;
  } u32s[] = {{"layers", &c.geometry.num_layers, std::nullopt},
              {"kv-heads", &c.geometry.num_kv_heads, std::nullopt},
              {"head-dim", &c.geometry.head_dim, std::nullopt},
              {"block-tokens", &c.geometry.block_tokens, std::nullopt},
              {"tp-rank", &c.tp_rank, 0},
              {"tp-size", &c.tp_size, 1}};
  for (auto& u : u32s) {
    auto v = args->GetInt(u.name, u.def);
    if (!v.ok()) return Fail("contract: " + v.status().message(), 2);
    if (*v < 0 || *v > 0xFFFFFFFFll) return Fail(std::string("contract: --") + u.name + " out of range", 2);
    *u.dst = static_cast<uint32_t>(*v);
  }
  if (auto f = args->Get("format"); f && !ParseKvFormat(f->c_str(), &c.format)) {
    return Fail("contract: --format must be nvfp4, fp8 or bf16", 2);
  }
  const std::string rule = args->Get("rule").value_or("max6");
  if (rule == "max6") c.scale_rule = nvfp4::ScaleRule::kMax6;
  else if (rule == "4over6") c.scale_rule = nvfp4::ScaleRule::k4over6;
  else return Fail("contract: --rule must be max6 or 4over6", 2);
  c.SetUnitScales();
  if (auto sp = args->Get("scales")) {
    auto sf = quality::LoadScalesToml(*sp);
    if (!sf.ok()) return Fail("contract: " + sf.status().message());
    if (sf->k_scales.size() != c.geometry.num_layers) {
      return Fail("contract: " + *sp + " has scales for " + std::to_string(sf->k_scales.size()) +
                  " layers, --layers is " + std::to_string(c.geometry.num_layers));
    }
    c.k_scales = sf->k_scales;
    c.v_scales = sf->v_scales;
  }
  if (auto s = c.Validate(); !s.ok()) return Fail("contract: " + s.message(), 2);
  std::printf("%s\n", ContractIdHex(c.Id()).c_str());
  return 0;
}

const CommandRegistrar kCalibrate("calibrate",
                                  "per-layer NVFP4 global scales from a KV dump (scales TOML)",
                                  Calibrate);
const CommandRegistrar kContract("contract", "contract id of a geometry and scales file",
                                 Contract, "", {"id"});

}  // namespace
}  // namespace kvtier::cli
