// The codecs `kvtierctl analyze` and `kvtier-bench quality` compare, as quantize ->
// dequantize round trips on float32 KV tensors, with what each one clipped, saturated
// and chose as block scales.
//
//   nvfp4-max6      kvtier's codec (formats/nvfp4.h), DESIGN.md rule, 16-value blocks
//                   along head_dim, E4M3 block scale, FP32 global scale per layer and K/V.
//   nvfp4-4over6    the same with the 4over6 scale rule.
//   fp8-tensor      E4M3 (e4m3fn, RNE, saturating) with one FP32 scale per tensor
//                   (per layer and K/V): s = amax / 448, q = E4M3(x / s), x' = e4m3(q) * s.
//   fp8-token-head  the same with one FP32 scale per (token, head) row of head_dim values.
//   mxfp4           OCP Microscaling Formats (MX) v1.0, MXFP4: blocks of 32 along head_dim,
//                   shared scale X = 2^(floor(log2(amax)) - 2) stored as E8M0 (exponent
//                   clamped to [-127, 127]; an all-zero block uses 2^-127), elements
//                   E2M1 = RNE(x / X) saturated to +-6. The "- 2" is emax of E2M1 (6 =
//                   1.5 * 2^2), so amax / X lies in [4, 8): values in (6, 8) * X clip.
//
// Tensors are rows x dim float32, row-major (a KV tensor [tokens, heads, head_dim] is
// tokens*heads rows of head_dim); dim must be a multiple of 32.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "formats/status.h"

namespace kvtier::quality {

enum class Codec : uint8_t {
  kNvfp4Max6 = 0,
  kNvfp4FourOverSix = 1,
  kFp8Tensor = 2,
  kFp8TokenHead = 3,
  kMxfp4 = 4,
};
inline constexpr int kNumCodecs = 5;
inline constexpr Codec kAllCodecs[kNumCodecs] = {Codec::kNvfp4Max6, Codec::kNvfp4FourOverSix,
                                                 Codec::kFp8Tensor, Codec::kFp8TokenHead,
                                                 Codec::kMxfp4};
const char* CodecName(Codec c);  // "nvfp4-max6", "nvfp4-4over6", "fp8-tensor", ...
bool ParseCodec(std::string_view s, Codec* out);
// Storage cost in bits per value, scales included (global FP32 scales ignored).
double CodecBitsPerValue(Codec c, size_t head_dim);

// Per-element flags.
inline constexpr uint8_t kFlagClipped = 1;    // |x| exceeded the largest value its scale
                                              // can represent (the error is not rounding)
inline constexpr uint8_t kFlagSaturated = 2;  // encoded with the largest code magnitude
                                              // (E2M1 6, E4M3 448)

// Distribution of the effective scales (what one code step is multiplied by): one entry
// per scale block (NVFP4 16 values, MXFP4 32, FP8 per-token-head one row, FP8 per-tensor
// the whole tensor).
struct ScaleHistogram {
  std::map<int, uint64_t> log2_bins;  // floor(log2(scale)) -> blocks (non-zero scales)
  uint64_t blocks = 0;
  uint64_t zero = 0;       // scale 0 (an all-zero block, or a scale that underflowed)
  uint64_t subnormal = 0;  // E4M3 block scale in the subnormal range (NVFP4 only)
  uint64_t clamped = 0;    // the wanted scale was above the format's largest (NVFP4:
                           // amax / 6 / kv_scale > 464, beyond what rounds to 448) and
                           // got clamped: the global scale is too small
  void Add(double scale, bool is_subnormal, bool is_clamped);
  void Merge(const ScaleHistogram& o);
  // The log2 bin below which fraction q of the non-zero scales lie (q in [0, 1]).
  int QuantileLog2(double q) const;
};

struct QuantResult {
  std::vector<float> dq;       // dequantized values, same shape as the input
  std::vector<uint8_t> flags;  // kFlag* per value
  ScaleHistogram scales;
};

// Round trip of x (rows x dim). global_scale is the NVFP4 kv_scale (a finite positive
// normal float; ignored by the other codecs). Invalid on a bad dim, size or scale, or a
// non-finite value.
Status QuantizeDequantize(Codec c, std::span<const float> x, size_t dim, float global_scale,
                          QuantResult* out);

// ---- The comparison codecs' definitions, one value or block at a time (for tests) ----

// FP8 E4M3 with scale s > 0: the dequantized value, and the E4M3 code.
float Fp8RoundTrip(float x, float s, uint8_t* code);
// The E8M0 byte (biased exponent, 127 = 2^0) MXFP4 uses for a block with this amax.
uint8_t Mxfp4ScaleByte(float amax);
// 2^(byte - 127); byte 255 (NaN) is never produced.
float E8M0ToFloat(uint8_t byte);
// Quantizes one block of n values (n <= 32): returns the E8M0 byte, writes E2M1 codes.
uint8_t Mxfp4QuantizeBlock(const float* x, size_t n, uint8_t* codes);

}  // namespace kvtier::quality
