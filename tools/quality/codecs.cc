// Compiled with -ffp-contract=off (tools/quality/CMakeLists.txt).
#include "tools/quality/codecs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "formats/nvfp4.h"

namespace kvtier::quality {

namespace nv = kvtier::nvfp4;

const char* CodecName(Codec c) {
  switch (c) {
    case Codec::kNvfp4Max6: return "nvfp4-max6";
    case Codec::kNvfp4FourOverSix: return "nvfp4-4over6";
    case Codec::kFp8Tensor: return "fp8-tensor";
    case Codec::kFp8TokenHead: return "fp8-token-head";
    case Codec::kMxfp4: return "mxfp4";
  }
  return "?";
}

bool ParseCodec(std::string_view s, Codec* out) {
  for (Codec c : kAllCodecs) {
    if (s == CodecName(c)) {
      *out = c;
      return true;
    }
  }
  return false;
}

double CodecBitsPerValue(Codec c, size_t head_dim) {
  switch (c) {
    case Codec::kNvfp4Max6:
    case Codec::kNvfp4FourOverSix: return 4.0 + 8.0 / 16.0;
    case Codec::kFp8Tensor: return 8.0;
    case Codec::kFp8TokenHead: return 8.0 + 32.0 / static_cast<double>(head_dim);
    case Codec::kMxfp4: return 4.0 + 8.0 / 32.0;
  }
  return 0;
}

void ScaleHistogram::Add(double scale, bool is_subnormal, bool is_clamped) {
  ++blocks;
  if (is_subnormal) ++subnormal;
  if (is_clamped) ++clamped;
  if (scale == 0.0) {
    ++zero;
    return;
  }
  ++log2_bins[static_cast<int>(std::floor(std::log2(scale)))];
}

void ScaleHistogram::Merge(const ScaleHistogram& o) {
  for (const auto& [b, n] : o.log2_bins) log2_bins[b] += n;
  blocks += o.blocks;
  zero += o.zero;
  subnormal += o.subnormal;
  clamped += o.clamped;
}

int ScaleHistogram::QuantileLog2(double q) const {
  uint64_t total = 0;
  for (const auto& [b, n] : log2_bins) total += n;
  if (total == 0) return 0;
  const double want = q * static_cast<double>(total);
  uint64_t seen = 0;
  for (const auto& [b, n] : log2_bins) {
    seen += n;
    if (static_cast<double>(seen) >= want) return b;
  }
  return log2_bins.rbegin()->first;
}

float Fp8RoundTrip(float x, float s, uint8_t* code) {
  const uint8_t q = nv::FloatToE4M3(x / s);
  *code = q;
  return nv::E4M3ToFloat(q) * s;
}

uint8_t Mxfp4ScaleByte(float amax) {
  if (!(amax > 0.0f)) return 0;  // all-zero block: smallest scale, every code 0
  int e2;
  std::frexp(amax, &e2);  // amax = m * 2^e2, m in [0.5, 1): floor(log2(amax)) = e2 - 1
  const int e = std::clamp(e2 - 1 - 2, -127, 127);
  return static_cast<uint8_t>(e + 127);
}

float E8M0ToFloat(uint8_t byte) { return std::ldexp(1.0f, static_cast<int>(byte) - 127); }

uint8_t Mxfp4QuantizeBlock(const float* x, size_t n, uint8_t* codes) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const uint8_t sb = Mxfp4ScaleByte(amax);
  const int e = static_cast<int>(sb) - 127;
  for (size_t i = 0; i < n; ++i) codes[i] = nv::FloatToE2M1(std::ldexp(x[i], -e));  // exact
  return sb;
}

namespace {

Status CheckInput(std::span<const float> x, size_t dim) {
  if (dim == 0 || dim % 32 != 0) {
    return Status::Invalid("row length " + std::to_string(dim) + " is not a multiple of 32");
  }
  if (x.size() % dim != 0) {
    return Status::Invalid(std::to_string(x.size()) + " values are not whole rows of " +
                           std::to_string(dim));
  }
  return nv::CheckFinite(x);
}

void Nvfp4(std::span<const float> x, float kv, nv::ScaleRule rule, QuantResult* r) {
  const size_t n = x.size(), groups = n / nv::kGroupSize;
  std::vector<uint8_t> data(n / 2), sf(groups);
  nv::QuantizeUnchecked(x.data(), n, kv, rule, data.data(), sf.data());
  nv::DequantizeUnchecked(data.data(), sf.data(), n, kv, r->dq.data());
  for (size_t g = 0; g < groups; ++g) {
    const double s = static_cast<double>(nv::E4M3ToFloat(sf[g])) * kv;
    float amax = 0.0f;
    for (size_t i = g * 16; i < g * 16 + 16; ++i) {
      amax = std::max(amax, std::fabs(x[i]));
      const uint8_t code = (data[i / 2] >> ((i & 1) * 4)) & 0xF;
      uint8_t f = 0;
      if ((code & 7) == 7) f |= kFlagSaturated;
      if (s > 0 && std::fabs(static_cast<double>(x[i])) > 6.0 * s) f |= kFlagClipped;
      r->flags[i] = f;
    }
    const bool sub = (sf[g] & 0x78) == 0 && (sf[g] & 7) != 0;
    // Clamped: the wanted scale lies beyond 464, the midpoint between 448 and the next
    // E4M3 step (480) that the format lacks; below that, RNE gives 448 anyway.
    const bool clamped = static_cast<double>(amax) / 6.0 / kv > 464.0;
    r->scales.Add(s, sub, clamped);
  }
}

void Fp8Rows(std::span<const float> x, size_t row_len, QuantResult* r) {
  for (size_t base = 0; base < x.size(); base += row_len) {
    float amax = 0.0f;
    for (size_t i = base; i < base + row_len; ++i) amax = std::max(amax, std::fabs(x[i]));
    // s = amax / 448 maps the row's amax onto E4M3's largest finite value. A row so
    // small that s would be subnormal uses the smallest normal float instead.
    float s = amax / nv::kE4M3Max;
    if (amax > 0.0f && !std::isnormal(s)) s = std::numeric_limits<float>::min();
    r->scales.Add(s, false, false);
    for (size_t i = base; i < base + row_len; ++i) {
      if (s == 0.0f) {
        r->dq[i] = 0.0f;
        r->flags[i] = 0;
        continue;
      }
      uint8_t q;
      r->dq[i] = Fp8RoundTrip(x[i], s, &q);
      uint8_t f = 0;
      if ((q & 0x7F) == nv::kE4M3MaxCode) f |= kFlagSaturated;
      if (std::fabs(static_cast<double>(x[i])) > 448.0 * s) f |= kFlagClipped;
      r->flags[i] = f;
    }
  }
}

void Mxfp4(std::span<const float> x, QuantResult* r) {
  uint8_t codes[32];
  for (size_t base = 0; base < x.size(); base += 32) {
    const uint8_t sb = Mxfp4QuantizeBlock(x.data() + base, 32, codes);
    const float X = E8M0ToFloat(sb);
    bool any = false;
    for (size_t i = 0; i < 32; ++i) {
      r->dq[base + i] = nv::E2M1ToFloat(codes[i]) * X;
      any |= x[base + i] != 0.0f;
      uint8_t f = 0;
      if ((codes[i] & 7) == 7) f |= kFlagSaturated;
      if (std::fabs(static_cast<double>(x[base + i])) > 6.0 * static_cast<double>(X)) f |= kFlagClipped;
      r->flags[base + i] = f;
    }
    r->scales.Add(any ? static_cast<double>(X) : 0.0, false, false);
  }
}

}  // namespace

Status QuantizeDequantize(Codec c, std::span<const float> x, size_t dim, float global_scale,
                          QuantResult* out) {
  KVTIER_RETURN_IF_ERROR(CheckInput(x, dim));
  if ((c == Codec::kNvfp4Max6 || c == Codec::kNvfp4FourOverSix) &&
      !nv::IsValidGlobalScale(global_scale)) {
    return Status::Invalid("NVFP4 global scale must be a finite positive normal float, got " +
                           std::to_string(global_scale));
  }
  out->dq.assign(x.size(), 0.0f);
  out->flags.assign(x.size(), 0);
  out->scales = ScaleHistogram{};
  switch (c) {
    case Codec::kNvfp4Max6: Nvfp4(x, global_scale, nv::ScaleRule::kMax6, out); break;
    case Codec::kNvfp4FourOverSix: Nvfp4(x, global_scale, nv::ScaleRule::k4over6, out); break;
    case Codec::kFp8Tensor:
      if (!x.empty()) Fp8Rows(x, x.size(), out);
      break;
    case Codec::kFp8TokenHead: Fp8Rows(x, dim, out); break;
    case Codec::kMxfp4: Mxfp4(x, out); break;
  }
  return Status::Ok();
}

}  // namespace kvtier::quality
