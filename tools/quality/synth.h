// Synthetic KV with the structure real caches have, for tests and for machines without a
// model. Every number below is a parameter of SynthOptions, documented at its field.
//
// For layer l, KV head h, token t (T tokens, head_dim D, pairs j < D/2 are the RoPE
// pairs (j, j + D/2) of the rotate-half convention, angle t * rope_theta^(-2j/D)):
//
//   K[t,h,:] = g_l * g_lh * f_t * s_t * RoPE_t( k_std * N(0, 1)^D + B_lh )
//   V[t,h,:] = g_l * g_lh * f_t * s_t * v_std * ( N(0, 1)^D + drift * (t / (T-1)) * m_lh )
//   Q[i,j,:] = RoPE_p( N(0, 1)^D + (q_outlier / outlier_scale / k_std) * B_l,h(j) )
//              / (g_l * g_l,h(j)),
//              p = T - queries + i (the last positions), h(j) = j / q_per_kv. Dividing by
//              the head's gain keeps the logits q.k/sqrt(D) in the same range in every
//              head (as trained models do), so heads differ in KV magnitude, not in how
//              peaked their attention is.
//
//   B_lh   outlier channels: `outlier_pairs` RoPE pairs, picked per (layer, head) among
//          the slow half (j in [D/4, D/2), where real caches have them), each carrying a
//          constant pre-RoPE vector of length outlier_scale * k_std at a random phase.
//          RoPE then rotates it with position, so the outlier moves between the two
//          channels of its pair, as in real keys.
//   g_l    per-layer scale, log-uniform in [layer_spread^-1/2, layer_spread^1/2].
//   g_lh   per-head scale, log-uniform in [head_spread^-1/2, head_spread^1/2].
//   f_t    position drift of the magnitude: 1 + drift * t / (T-1).
//   m_lh   a random unit-variance mean direction of V that grows with position (drift).
//   s_t    sink_scale for t == 0 (the attention-sink token, large norm), 1 otherwise.
//
// Deterministic for a given seed (std::mt19937_64; the normal distribution is libstdc++'s).
#pragma once

#include <cstdint>
#include <vector>

#include "formats/status.h"
#include "tools/quality/safetensors.h"

namespace kvtier::quality {

struct SynthOptions {
  uint32_t layers = 4;          // layers written. Default: 4
  uint32_t kv_heads = 8;        // KV heads. Default: 8
  uint32_t head_dim = 128;      // a multiple of 32 in [32, 1024]. Default: 128
  uint32_t tokens = 512;        // tokens per layer. Default: 512
  uint32_t queries = 16;        // queries written per layer as layers.{i}.q (0: none).
                                // Default: 16
  uint32_t q_per_kv = 4;        // query heads per KV head (GQA group). Default: 4
  uint64_t seed = 1;            // Default: 1
  float k_std = 1.0f;           // std of the Gaussian body of K. Default: 1.0
  float v_std = 0.25f;          // std of the Gaussian body of V. Default: 0.25
  uint32_t outlier_pairs = 4;   // RoPE pairs per head with a large component; at most
                                // head_dim / 4. Default: 4
  float outlier_scale = 12.0f;  // length of that component, in units of k_std. Default: 12
  float q_outlier = 1.0f;       // length of the queries' component in the same pairs
                                // (query body std is 1). Default: 1
  float rope_theta = 10000.0f;  // RoPE base. Default: 10000
  float sink_scale = 4.0f;      // factor on K and V of token 0. Default: 4
  float head_spread = 8.0f;     // largest / smallest head scale, >= 1. Default: 8
  float layer_spread = 4.0f;    // largest / smallest layer scale, >= 1. Default: 4
  float drift = 0.5f;           // position drift (magnitude and V mean), >= 0. Default: 0.5

  Status Validate() const;
};

struct SynthKv {
  KvShape shape;
  uint32_t q_heads = 0;
  uint32_t queries = 0;
  std::vector<std::vector<float>> k, v, q;  // per layer, [T, H, D] / [queries, q_heads, D]
};

StatusOr<SynthKv> GenerateSynthKv(const SynthOptions& o);

// The safetensors bytes (names layers.{i}.k/v/q), values converted to dtype.
StatusOr<std::vector<uint8_t>> SynthToSafetensors(const SynthKv& kv, DType dtype,
                                                  const SynthOptions& o);

}  // namespace kvtier::quality
