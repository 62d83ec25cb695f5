// Calibration of the per-layer NVFP4 global scales (the contract's k_scales/v_scales).
//
// Which scale: the contract's scale is a *dequantization multiplier* (DESIGN.md section 3:
// value = e2m1(code) * e4m3(sf) * kv_scale, sf = E4M3(amax_block / 6 / kv_scale)). The
// largest value it can represent is 6 * 448 * kv_scale, so the scale that maps a layer's
// amax onto the top of the E4M3 x E2M1 range is
//
//     kv_scale = amax / (448 * 6) = amax / 2688        (nvfp4::GlobalScaleFromAmax)
//
// The "amax / 448" rule is the FP8 convention (one E4M3 per value: the top is 448
// * scale). Used as an NVFP4 multiplier, amax/448 leaves the top 6x of the block-scale
// range unused (block scales never exceed 74.7) and moves the bottom of the range 6x
// lower; both choices are lossless at the top and differ only for blocks 2^14 times
// smaller than the amax (`kvtier-bench quality` measures both). kvtier uses amax / 2688.
//
// With a percentile P < 100 the statistic is the P-th percentile (nearest rank) of |x|
// over the layer's K (or V) instead of its amax: values above it saturate (the block
// scale clamps at 448), in exchange for finer scales everywhere else.
//
// Scales file (TOML), read by `kvtierctl contract id --scales` and `kvtierctl analyze
// --scales`:
//   [contract]
//   num_layers = L
//   k_scales = [ ... L floats ... ]   # written with 9 significant digits: exact float32
//   v_scales = [ ... ]
//   [calibration]                     # informative only
//   source = "KV.safetensors"
//   statistic = "amax" | "p99.9" ...
//   k_stat = [ ... ]                  # the amax / percentile per layer
//   v_stat = [ ... ]
#pragma once

#include <string>
#include <vector>

#include "formats/status.h"
#include "tools/quality/safetensors.h"

namespace kvtier::quality {

struct CalibrateOptions {
  double percentile = 100.0;  // statistic of |x| per layer; 100 = amax. In (0, 100].
                              // Default: 100
  Status Validate() const;
};

struct Calibration {
  std::vector<float> k_stat, v_stat;      // amax or percentile of |x|, per layer
  std::vector<float> k_scales, v_scales;  // the global scales, per layer
  std::string statistic;                  // "amax" or "p99.9"
};

// Nearest-rank percentile of |x| (p in (0, 100]; 100 = max). 0 for an empty input.
float AbsPercentile(std::span<const float> x, double p);
// Scale for a statistic: GlobalScaleFromAmax(stat) (1.0 for an all-zero layer).
float GlobalScaleForStatistic(float stat);

// Needs layers 0..L-1 all present (a contract has one scale per layer).
StatusOr<Calibration> Calibrate(const SafetensorsView& f, const CalibrateOptions& o);

std::string CalibrationToToml(const Calibration& c, const std::string& source);

struct ScaleFile {
  std::vector<float> k_scales, v_scales;
};
// Parses a scales file's text; Invalid (naming the field) on anything malformed.
StatusOr<ScaleFile> ParseScalesToml(const std::string& text);
StatusOr<ScaleFile> LoadScalesToml(const std::string& path);

}  // namespace kvtier::quality
