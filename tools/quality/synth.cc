#include "tools/quality/synth.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

namespace kvtier::quality {

Status SynthOptions::Validate() const {
  auto bad = [](const std::string& m) { return Status::Invalid("synth: " + m); };
  if (layers < 1 || layers > 1024) return bad("layers must be in [1, 1024]");
  if (kv_heads < 1 || kv_heads > 256) return bad("kv_heads must be in [1, 256]");
  if (head_dim < 32 || head_dim > 1024 || head_dim % 32 != 0) {
    return bad("head_dim must be a multiple of 32 in [32, 1024]");
  }
  if (tokens < 2 || tokens > (1u << 20)) return bad("tokens must be in [2, 1048576]");
  if (queries > tokens) return bad("queries must not exceed tokens");
  if (q_per_kv < 1 || q_per_kv > 64) return bad("q_per_kv must be in [1, 64]");
  const double values = 2.0 * layers * kv_heads * head_dim * static_cast<double>(tokens);
  if (values > 4e9) return bad("the dump would hold more than 4e9 values");
  if (outlier_pairs > head_dim / 4) return bad("outlier_pairs must be at most head_dim / 4");
  auto pos = [](float v) { return std::isfinite(v) && v > 0.0f; };
  if (!pos(k_std) || !pos(v_std)) return bad("k_std and v_std must be finite and positive");
  if (!pos(outlier_scale) || !pos(rope_theta) || !pos(sink_scale)) {
    return bad("outlier_scale, rope_theta and sink_scale must be finite and positive");
  }
  if (!std::isfinite(q_outlier) || q_outlier < 0) return bad("q_outlier must be >= 0");
  if (!std::isfinite(head_spread) || head_spread < 1 || !std::isfinite(layer_spread) ||
      layer_spread < 1) {
    return bad("head_spread and layer_spread must be finite and >= 1");
  }
  if (!std::isfinite(drift) || drift < 0) return bad("drift must be finite and >= 0");
  return Status::Ok();
}

namespace {
// Rotate-half RoPE at position pos on one head vector x[D].
void Rope(float* x, uint32_t D, double pos, double theta) {
  const uint32_t half = D / 2;
  for (uint32_t j = 0; j < half; ++j) {
    const double ang = pos * std::pow(theta, -2.0 * j / D);
    const double c = std::cos(ang), s = std::sin(ang);
    const double a = x[j], b = x[j + half];
    x[j] = static_cast<float>(a * c - b * s);
    x[j + half] = static_cast<float>(a * s + b * c);
  }
}
}  // namespace

StatusOr<SynthKv> GenerateSynthKv(const SynthOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  const uint32_t L = o.layers, H = o.kv_heads, D = o.head_dim, T = o.tokens;
  SynthKv kv;
  kv.shape = {T, H, D};
  kv.queries = o.queries;
  kv.q_heads = H * o.q_per_kv;
  std::mt19937_64 rng(o.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uni(0.0, 1.0);
  const uint32_t half = D / 2;
  for (uint32_t l = 0; l < L; ++l) {
    const double g_l = std::pow(o.layer_spread, uni(rng) - 0.5);
    std::vector<float> K(static_cast<size_t>(T) * H * D), V(K.size());
    std::vector<std::vector<float>> bias(H, std::vector<float>(D, 0.0f));
    std::vector<double> gain(H);
    for (uint32_t h = 0; h < H; ++h) {
      const double g = g_l * std::pow(o.head_spread, uni(rng) - 0.5);
      gain[h] = g;
      // Outlier pairs: distinct j in [D/4, D/2), each a vector at a random phase.
      std::vector<uint32_t> slow;
      for (uint32_t j = D / 4; j < half; ++j) slow.push_back(j);
      std::shuffle(slow.begin(), slow.end(), rng);
      for (uint32_t p = 0; p < o.outlier_pairs; ++p) {
        const double phase = 2.0 * M_PI * uni(rng);
        const double len = static_cast<double>(o.outlier_scale) * o.k_std;
        bias[h][slow[p]] = static_cast<float>(len * std::cos(phase));
        bias[h][slow[p] + half] = static_cast<float>(len * std::sin(phase));
      }
      std::vector<double> mean(D);
      for (auto& m : mean) m = normal(rng);
      std::vector<float> x(D);
      for (uint32_t t = 0; t < T; ++t) {
        const double frac = static_cast<double>(t) / (T - 1);
        const double f = g * (1.0 + o.drift * frac) * (t == 0 ? o.sink_scale : 1.0f);
        for (uint32_t d = 0; d < D; ++d) x[d] = static_cast<float>(o.k_std * normal(rng) + bias[h][d]);
        Rope(x.data(), D, t, o.rope_theta);
        float* kt = &K[(static_cast<size_t>(t) * H + h) * D];
        float* vt = &V[(static_cast<size_t>(t) * H + h) * D];
        for (uint32_t d = 0; d < D; ++d) {
          kt[d] = static_cast<float>(f * x[d]);
          vt[d] = static_cast<float>(f * o.v_std * (normal(rng) + o.drift * frac * mean[d]));
        }
      }
    }
    std::vector<float> Q(static_cast<size_t>(o.queries) * kv.q_heads * D);
    const double qf = o.q_outlier / (static_cast<double>(o.outlier_scale) * o.k_std);
    for (uint32_t i = 0; i < o.queries; ++i) {
      const double pos = T - o.queries + i;
      for (uint32_t j = 0; j < kv.q_heads; ++j) {
        float* q = &Q[(static_cast<size_t>(i) * kv.q_heads + j) * D];
        const auto& b = bias[j / o.q_per_kv];
        const double inv = 1.0 / gain[j / o.q_per_kv];
        for (uint32_t d = 0; d < D; ++d) q[d] = static_cast<float>((normal(rng) + qf * b[d]) * inv);
        Rope(q, D, pos, o.rope_theta);
      }
    }
    kv.k.push_back(std::move(K));
    kv.v.push_back(std::move(V));
    kv.q.push_back(std::move(Q));
  }
  return kv;
}

StatusOr<std::vector<uint8_t>> SynthToSafetensors(const SynthKv& kv, DType dtype,
                                                  const SynthOptions& o) {
  std::vector<TensorOut> ts;
  const std::vector<uint64_t> shape = {kv.shape.tokens, kv.shape.kv_heads, kv.shape.head_dim};
  for (size_t l = 0; l < kv.k.size(); ++l) {
    const std::string p = "layers." + std::to_string(l);
    ts.push_back({p + ".k", dtype, shape, kv.k[l]});
    ts.push_back({p + ".v", dtype, shape, kv.v[l]});
    if (kv.queries > 0) {
      ts.push_back({p + ".q", dtype, {kv.queries, kv.q_heads, kv.shape.head_dim}, kv.q[l]});
    }
  }
  std::map<std::string, std::string> meta = {
      {"generator", "kvtierctl synth"},
      {"seed", std::to_string(o.seed)},
      {"outlier_pairs", std::to_string(o.outlier_pairs)},
      {"outlier_scale", std::to_string(o.outlier_scale)},
      {"sink_scale", std::to_string(o.sink_scale)},
      {"head_spread", std::to_string(o.head_spread)},
      {"layer_spread", std::to_string(o.layer_spread)},
      {"drift", std::to_string(o.drift)},
  };
  return SerializeSafetensors(ts, meta);
}

}  // namespace kvtier::quality
