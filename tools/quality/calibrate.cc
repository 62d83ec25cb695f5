#include "tools/quality/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <toml++/toml.h>

#include "formats/nvfp4.h"
#include "tools/cli.h"

namespace kvtier::quality {

Status CalibrateOptions::Validate() const {
  if (!(percentile > 0.0 && percentile <= 100.0)) {
    return Status::Invalid("percentile must be in (0, 100], got " + std::to_string(percentile));
  }
  return Status::Ok();
}

float AbsPercentile(std::span<const float> x, double p) {
  if (x.empty()) return 0.0f;
  if (p >= 100.0) {
    float m = 0.0f;
    for (float v : x) m = std::max(m, std::fabs(v));
    return m;
  }
  std::vector<float> a(x.size());
  for (size_t i = 0; i < x.size(); ++i) a[i] = std::fabs(x[i]);
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(a.size())));
  rank = std::clamp<size_t>(rank, 1, a.size());
  std::nth_element(a.begin(), a.begin() + (rank - 1), a.end());
  return a[rank - 1];
}

float GlobalScaleForStatistic(float stat) { return nvfp4::GlobalScaleFromAmax(stat); }

StatusOr<Calibration> Calibrate(const SafetensorsView& f, const CalibrateOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  auto idx = IndexKvDump(f);
  if (!idx.ok()) return idx.status();
  const auto& layers = idx->layers;
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i] != static_cast<int>(i)) {
      return Status::Invalid("layer " + std::to_string(i) +
                             " is missing: a contract needs scales for layers 0..L-1");
    }
  }
  Calibration c;
  char buf[32];
  if (o.percentile >= 100.0) {
    c.statistic = "amax";
  } else {
    std::snprintf(buf, sizeof buf, "p%g", o.percentile);
    c.statistic = buf;
  }
  std::vector<float> x;
  for (int l : layers) {
    for (int side = 0; side < 2; ++side) {
      const std::string name = "layers." + std::to_string(l) + (side ? ".v" : ".k");
      KVTIER_RETURN_IF_ERROR(f.ReadFloat(*f.Find(name), &x));
      const float stat = AbsPercentile(x, o.percentile);
      (side ? c.v_stat : c.k_stat).push_back(stat);
      (side ? c.v_scales : c.k_scales).push_back(GlobalScaleForStatistic(stat));
    }
  }
  return c;
}

namespace {
std::string FloatList(const std::vector<float>& v) {
  std::string s = "[";
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v[i]));
    s += (i ? ", " : "") + std::string(buf);
  }
  return s + "]";
}
}  // namespace

std::string CalibrationToToml(const Calibration& c, const std::string& source) {
  std::string s;
  s += "# NVFP4 global scales (dequantization multipliers) per layer, written by\n";
  s += "# `kvtierctl calibrate`: scale = statistic / (448 * 6), see tools/quality/calibrate.h.\n";
  s += "[contract]\n";
  s += "num_layers = " + std::to_string(c.k_scales.size()) + "\n";
  s += "k_scales = " + FloatList(c.k_scales) + "\n";
  s += "v_scales = " + FloatList(c.v_scales) + "\n\n";
  s += "[calibration]\n";
  s += "source = \"";
  for (char ch : source) {
    if (ch == '"' || ch == '\\') s += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) s += ch;
  }
  s += "\"\n";
  s += "statistic = \"" + c.statistic + "\"\n";
  s += "k_stat = " + FloatList(c.k_stat) + "\n";
  s += "v_stat = " + FloatList(c.v_stat) + "\n";
  return s;
}

StatusOr<ScaleFile> ParseScalesToml(const std::string& text) {
  toml::table tbl;
  try {
    tbl = toml::parse(text);
  } catch (const toml::parse_error& e) {
    return Status::Invalid("scales file: " + std::string(e.description()) + " at line " +
                           std::to_string(e.source().begin.line));
  }
  const toml::table* c = tbl["contract"].as_table();
  if (!c) return Status::Invalid("scales file: no [contract] table");
  ScaleFile out;
  for (int side = 0; side < 2; ++side) {
    const char* key = side ? "v_scales" : "k_scales";
    const toml::array* a = (*c)[key].as_array();
    if (!a) return Status::Invalid(std::string("scales file: [contract] ") + key + " is not an array");
    auto& dst = side ? out.v_scales : out.k_scales;
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node& n = *a->get(i);
      std::optional<double> d = n.value<double>();
      if (!d || !n.is_number()) {
        return Status::Invalid(std::string("scales file: ") + key + "[" + std::to_string(i) +
                               "] is not a number");
      }
      const float f = static_cast<float>(*d);
      if (!nvfp4::IsValidGlobalScale(f)) {
        return Status::Invalid(std::string("scales file: ") + key + "[" + std::to_string(i) +
                               "] = " + std::to_string(*d) +
                               " is not a finite positive normal float");
      }
      dst.push_back(f);
    }
  }
  if (out.k_scales.empty() || out.k_scales.size() != out.v_scales.size() ||
      out.k_scales.size() > 1024) {
    return Status::Invalid("scales file: k_scales and v_scales need the same length, 1..1024");
  }
  if (auto nl = (*c)["num_layers"].value<int64_t>();
      nl && *nl != static_cast<int64_t>(out.k_scales.size())) {
    return Status::Invalid("scales file: num_layers " + std::to_string(*nl) + " but " +
                           std::to_string(out.k_scales.size()) + " scales");
  }
  return out;
}

StatusOr<ScaleFile> LoadScalesToml(const std::string& path) {
  auto bytes = cli::ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  std::string text(bytes->begin(), bytes->end());
  auto r = ParseScalesToml(text);
  if (!r.ok()) return Status(r.status().code(), path + ": " + r.status().message());
  return r;
}

}  // namespace kvtier::quality
