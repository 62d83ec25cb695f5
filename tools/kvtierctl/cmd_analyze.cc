// kvtierctl analyze: what each codec's 4 (or 8) bits cost on a KV dump, per layer, K/V,
// head and position bucket, at tensor and attention level (tools/quality/analyze.h).
#include <cstdio>
#include <iostream>

#include "tools/cli.h"
#include "tools/quality/analyze.h"
#include "tools/quality/calibrate.h"

namespace kvtier::cli {
namespace {

constexpr const char* kUsage =
    "usage: kvtierctl analyze --in KV.safetensors [options]\n"
    "  --layers LIST       layers to analyze, e.g. 0,2,5-7 (default: all)\n"
    "  --json              JSON instead of the table\n"
    "  --detail            table: also every head and position bucket\n"
    "  --plot FILE.svg     heat map layer x KV head of the attention output error\n"
    "  --plot-codec C      codec of the heat map (default: nvfp4-max6)\n"
    "  --queries N         random queries per KV head when the dump has none (default: 16)\n"
    "  --random-queries    use random queries even when the dump has layers.{i}.q\n"
    "  --seed N            seed of the random queries (default: 1)\n"
    "  --buckets N         position buckets (default: 8)\n"
    "  --scales FILE.toml  NVFP4 global scales from `kvtierctl calibrate`\n"
    "  --unit-scales       NVFP4 global scales 1.0 (uncalibrated)\n"
    "                      (default: each layer's own amax / 2688)\n"
    "  --worst N           worst layers/heads listed (default: 5)\n"
    "  --rank-codec C      codec whose attention error ranks the worst (default: nvfp4-max6)\n"
    "codecs: nvfp4-max6 nvfp4-4over6 fp8-tensor fp8-token-head mxfp4\n"
    "Dump convention: layers.{i}.k / layers.{i}.v [tokens, kv_heads, head_dim] in BF16, F16\n"
    "or F32; optional layers.{i}.q [queries, q_heads, head_dim] (docs/quality.md).\n";

int Run(const std::vector<std::string>& argv) {
  auto args = Args::Parse(argv, {"json", "detail", "random-queries", "unit-scales", "help"});
  if (!args.ok()) return Fail("analyze: " + args.status().message(), 2);
  if (args->Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (auto s = args->CheckKnown({"in", "layers", "json", "detail", "plot", "plot-codec", "queries",
                                 "random-queries", "seed", "buckets", "scales", "unit-scales",
                                 "worst", "rank-codec", "help"});
      !s.ok()) {
    return Fail("analyze: " + s.message(), 2);
  }
  if (!args->positional().empty()) {
    return Fail("analyze: unexpected argument '" + args->positional()[0] + "'", 2);
  }
  auto in = args->Require("in");
  if (!in.ok()) return Fail("analyze: " + in.status().message(), 2);
  quality::AnalyzeOptions o;
  if (auto l = args->Get("layers")) {
    auto v = quality::ParseLayerList(*l);
    if (!v.ok()) return Fail("analyze: " + v.status().message(), 2);
    o.layers = *v;
  }
  auto queries = args->GetInt("queries", 16);
  auto seed = args->GetInt("seed", 1);
  auto buckets = args->GetInt("buckets", 8);
  auto worst = args->GetInt("worst", 5);
  for (const auto* s : {&queries.status(), &seed.status(), &buckets.status(), &worst.status()}) {
    if (!s->ok()) return Fail("analyze: " + s->message(), 2);
  }
  if (*queries < 1 || *queries > 4096) return Fail("analyze: --queries must be in [1, 4096]", 2);
  if (*buckets < 1 || *buckets > 1024) return Fail("analyze: --buckets must be in [1, 1024]", 2);
  if (*worst < 0 || *worst > 1000) return Fail("analyze: --worst must be in [0, 1000]", 2);
  if (*seed < 0) return Fail("analyze: --seed must be non-negative", 2);
  o.random_queries = static_cast<uint32_t>(*queries);
  o.position_buckets = static_cast<uint32_t>(*buckets);
  o.worst = static_cast<uint32_t>(*worst);
  o.seed = static_cast<uint64_t>(*seed);
  o.force_random_queries = args->Has("random-queries");
  quality::Codec plot_codec = quality::Codec::kNvfp4Max6;
  for (auto [opt, dst] : {std::pair{"rank-codec", &o.rank_codec}, std::pair{"plot-codec", &plot_codec}}) {
    if (auto c = args->Get(opt); c && !quality::ParseCodec(*c, dst)) {
      return Fail(std::string("analyze: --") + opt + " '" + *c +
                      "' is not one of nvfp4-max6 nvfp4-4over6 fp8-tensor fp8-token-head mxfp4",
                  2);
    }
  }
  if (args->Has("scales") && args->Has("unit-scales")) {
    return Fail("analyze: --scales and --unit-scales exclude each other", 2);
  }
  if (args->Has("unit-scales")) o.scale_source = quality::ScaleSource::kUnit;
  if (auto sp = args->Get("scales")) {
    auto sf = quality::LoadScalesToml(*sp);
    if (!sf.ok()) return Fail("analyze: " + sf.status().message());
    o.scale_source = quality::ScaleSource::kGiven;
    o.k_scales = sf->k_scales;
    o.v_scales = sf->v_scales;
  }
  auto file = quality::MappedFile::Open(*in);
  if (!file.ok()) return Fail("analyze: " + file.status().message());
  auto view = quality::SafetensorsView::Parse((*file)->bytes());
  if (!view.ok()) return Fail("analyze: " + *in + ": " + view.status().message());
  auto rep = quality::Analyze(*view, *in, o);
  if (!rep.ok()) return Fail("analyze: " + *in + ": " + rep.status().message());
  if (auto plot = args->Get("plot")) {
    const std::string svg = quality::ReportSvg(*rep, plot_codec);
    if (auto s = WriteFileAtomic(*plot, svg.data(), svg.size()); !s.ok()) {
      return Fail("analyze: " + s.message());
    }
  }
  const std::string out = args->Has("json") ? quality::ReportJson(*rep)
                                            : quality::ReportTable(*rep, args->Has("detail"));
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

const CommandRegistrar kAnalyze("analyze",
                                "quantization error of a KV dump per layer/head/position (table, "
                                "JSON, SVG)",
                                Run);

}  // namespace
}  // namespace kvtier::cli
