// `kvtierctl analyze`: the error each codec (codecs.h) makes on a KV dump, per layer, K
// and V, head and position bucket, at tensor level and at attention level (metrics.h),
// with the worst layers and heads flagged. Output as a text table, JSON or an SVG heat
// map (layer x head). The metrics are defined in metrics.h, the codecs in codecs.h.
//
// Queries: the dump's layers.{i}.q when present (query head j scores against KV head
// j / (q_heads / kv_heads)), otherwise `random_queries` per KV head drawn N(0, 1) per
// dimension (seeded). Attention is full (every query sees every token), softmax scale
// 1/sqrt(head_dim), in double.
//
// Position buckets: `position_buckets` equal ranges of tokens, bucket b = [b*T/B, (b+1)*T/B).
//
// NVFP4 global scales: per layer and K/V, from the layer's own amax (amax / 2688, what
// `kvtierctl calibrate` writes), 1.0 (uncalibrated), or a scales file.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "formats/status.h"
#include "tools/quality/codecs.h"
#include "tools/quality/metrics.h"
#include "tools/quality/safetensors.h"

namespace kvtier::quality {

enum class ScaleSource : uint8_t { kAmax = 0, kUnit = 1, kGiven = 2 };
const char* ScaleSourceName(ScaleSource s);  // "amax", "unit", "file"

struct AnalyzeOptions {
  std::vector<int> layers;           // layers to analyze; empty = all. Default: all
  uint32_t random_queries = 16;      // per KV head when the dump has no queries, or
                                     // force_random_queries. In [1, 4096]. Default: 16
  bool force_random_queries = false; // ignore the dump's queries. Default: false
  uint64_t seed = 1;                 // for the random queries. Default: 1
  uint32_t position_buckets = 8;     // in [1, 1024] (capped at the token count). Default: 8
  ScaleSource scale_source = ScaleSource::kAmax;  // NVFP4 global scales. Default: amax
  std::vector<float> k_scales, v_scales;  // kGiven: indexed by layer id. Default: empty
  uint32_t worst = 5;                // worst heads / layers listed. Default: 5
  Codec rank_codec = Codec::kNvfp4Max6;  // codec whose attention error ranks the worst.
                                         // Default: nvfp4-max6
  Status Validate() const;
};

struct SideResult {  // one layer, K or V, one codec
  ErrorStats total;
  std::vector<ErrorStats> heads;
  std::vector<ErrorStats> buckets;
  ScaleHistogram scales;
};

struct LayerResult {
  int layer = 0;
  float k_scale = 1.0f, v_scale = 1.0f;  // NVFP4 global scales used
  std::array<SideResult, kNumCodecs> k, v;
  std::array<AttnStats, kNumCodecs> attn;
  std::array<std::vector<AttnStats>, kNumCodecs> attn_heads;  // per KV head
  // Which side drives the output error: only K quantized (p' V) and only V quantized (p V').
  std::array<AttnStats, kNumCodecs> attn_k_only, attn_v_only;
};

struct WorstEntry {
  int layer = 0;
  int head = -1;  // -1 for a layer entry
  double rel_err = 0;
};

struct AnalyzeReport {
  std::string source;
  KvShape shape;
  AnalyzeOptions options;
  bool supplied_queries = false;
  uint64_t queries_per_kv_head = 0;
  std::vector<LayerResult> layers;
  std::vector<WorstEntry> worst_layers, worst_heads;
  // Totals over layers per codec.
  std::array<ErrorStats, kNumCodecs> k_total, v_total;
  std::array<AttnStats, kNumCodecs> attn_total, attn_k_only_total, attn_v_only_total;
};

// Analyzes one layer from float32 tensors: k, v [T, H, D]; q [Nq, Hq, D] or empty (then
// random queries are drawn from `seed`).
StatusOr<LayerResult> AnalyzeLayer(int layer, std::span<const float> k, std::span<const float> v,
                                   const KvShape& shape, std::span<const float> q, uint64_t q_heads,
                                   float k_scale, float v_scale, const AnalyzeOptions& o);

StatusOr<AnalyzeReport> Analyze(const SafetensorsView& f, const std::string& source,
                                const AnalyzeOptions& o);

std::string ReportTable(const AnalyzeReport& r, bool detail);
std::string ReportJson(const AnalyzeReport& r);
// Heat map, rows = layers, columns = KV heads, colour = log10 of the attention output
// relative error of `codec`.
std::string ReportSvg(const AnalyzeReport& r, Codec codec);

}  // namespace kvtier::quality
