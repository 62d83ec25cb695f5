#include "tools/quality/analyze.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "formats/nvfp4.h"

namespace kvtier::quality {

namespace {
using Json = nlohmann::ordered_json;

// Runs fn(i) for i < n on up to hardware_concurrency threads (contiguous ranges).
template <typename Fn>
void ParallelFor(size_t n, Fn&& fn) {
  const size_t threads = std::min<size_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (size_t i = t * n / threads; i < (t + 1) * n / threads; ++i) fn(i);
    });
  }
  for (auto& th : pool) th.join();
}

std::string F(const char* fmt, double v) {
  char b[64];
  std::snprintf(b, sizeof b, fmt, v);
  return b;
}
}  // namespace

const char* ScaleSourceName(ScaleSource s) {
  switch (s) {
    case ScaleSource::kAmax: return "amax";
    case ScaleSource::kUnit: return "unit";
    case ScaleSource::kGiven: return "file";
  }
  return "?";
}

Status AnalyzeOptions::Validate() const {
  if (random_queries < 1 || random_queries > 4096) {
    return Status::Invalid("queries must be in [1, 4096]");
  }
  if (position_buckets < 1 || position_buckets > 1024) {
    return Status::Invalid("buckets must be in [1, 1024]");
  }
  if (worst > 1000) return Status::Invalid("worst must be at most 1000");
  if (scale_source == ScaleSource::kGiven) {
    if (k_scales.empty() || k_scales.size() != v_scales.size()) {
      return Status::Invalid("given scales need equal, non-empty k and v lists");
    }
    for (size_t i = 0; i < k_scales.size(); ++i) {
      if (!nvfp4::IsValidGlobalScale(k_scales[i]) || !nvfp4::IsValidGlobalScale(v_scales[i])) {
        return Status::Invalid("scale of layer " + std::to_string(i) + " is not valid");
      }
    }
  }
  return Status::Ok();
}

StatusOr<LayerResult> AnalyzeLayer(int layer, std::span<const float> k, std::span<const float> v,
                                   const KvShape& sh, std::span<const float> q, uint64_t q_heads,
                                   float k_scale, float v_scale, const AnalyzeOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  const size_t T = sh.tokens, H = sh.kv_heads, D = sh.head_dim, n = T * H * D;
  if (k.size() != n || v.size() != n) return Status::Invalid("k/v sizes do not match the shape");
  LayerResult r;
  r.layer = layer;
  r.k_scale = k_scale;
  r.v_scale = v_scale;
  const size_t B = std::min<size_t>(o.position_buckets, T);

  // Queries: supplied [Nq, Hq, D] or random per KV head.
  size_t nq;  // queries per KV head
  std::vector<float> rq;
  auto query = [&](size_t h, size_t i) -> const float* {
    if (!q.empty()) {
      const size_t group = q_heads / H;  // query heads per KV head
      const size_t per_tok = group;      // queries per token position for this KV head
      const size_t tok = i / per_tok, j = h * group + i % per_tok;
      return q.data() + (tok * q_heads + j) * D;
    }
    return rq.data() + (h * nq + i) * D;
  };
  if (!q.empty()) {
    if (q_heads == 0 || q_heads % H != 0 || q.size() % (q_heads * D) != 0) {
      return Status::Invalid("query tensor does not match [queries, q_heads, head_dim]");
    }
    nq = q.size() / (q_heads * D) * (q_heads / H);
  } else {
    nq = o.random_queries;
    rq.resize(H * nq * D);
    std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(layer));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& x : rq) x = normal(rng);
  }

  // Reference attention per head, all its queries at once: log-probabilities and
  // probabilities nq x T, outputs nq x D.
  std::vector<std::vector<const float*>> qptr(H);
  for (size_t h = 0; h < H; ++h) {
    for (size_t i = 0; i < nq; ++i) qptr[h].push_back(query(h, i));
  }
  std::vector<std::vector<double>> ref_lp(H), ref_p(H), ref_out(H);
  ParallelFor(H, [&](size_t h) {
    BatchAttentionLogProbs(qptr[h], k.data() + h * D, T, H * D, D, &ref_lp[h], &ref_p[h]);
    BatchAttentionOutput(ref_p[h], nq, v.data() + h * D, T, H * D, D, &ref_out[h]);
  });

  QuantResult qk, qv;
  std::vector<AttnStats> k_only(H), v_only(H);
  for (int ci = 0; ci < kNumCodecs; ++ci) {
    const Codec c = kAllCodecs[ci];
    KVTIER_RETURN_IF_ERROR(QuantizeDequantize(c, k, D, k_scale, &qk));
    KVTIER_RETURN_IF_ERROR(QuantizeDequantize(c, v, D, v_scale, &qv));
    for (int side = 0; side < 2; ++side) {
      SideResult& s = side ? r.v[ci] : r.k[ci];
      const std::span<const float> x = side ? v : k;
      const QuantResult& qr = side ? qv : qk;
      s.heads.assign(H, {});
      s.buckets.assign(B, {});
      s.scales = qr.scales;
      for (size_t t = 0; t < T; ++t) {
        ErrorStats& bucket = s.buckets[t * B / T];
        for (size_t h = 0; h < H; ++h) {
          ErrorStats row;
          const size_t base = (t * H + h) * D;
          for (size_t d = 0; d < D; ++d) row.Add(x[base + d], qr.dq[base + d], qr.flags[base + d]);
          s.heads[h].Merge(row);
          bucket.Merge(row);
        }
      }
      for (const auto& b : s.buckets) s.total.Merge(b);
    }
    r.attn_heads[ci].assign(H, {});
    k_only.assign(H, {});
    v_only.assign(H, {});
    // Heads are independent: one thread per group of heads, each writing only its own
    // per-head stats; they are merged in head order afterwards (deterministic).
    ParallelFor(H, [&](size_t h) {
      std::vector<double> lp, p, out, out_k, out_v;
      BatchAttentionLogProbs(qptr[h], qk.dq.data() + h * D, T, H * D, D, &lp, &p);
      BatchAttentionOutput(p, nq, qv.dq.data() + h * D, T, H * D, D, &out);      // K' and V'
      BatchAttentionOutput(p, nq, v.data() + h * D, T, H * D, D, &out_k);        // K' only
      BatchAttentionOutput(ref_p[h], nq, qv.dq.data() + h * D, T, H * D, D, &out_v);  // V' only
      for (size_t i = 0; i < nq; ++i) {
        auto row = [&](const std::vector<double>& m, size_t len) {
          return std::span<const double>(m.data() + i * len, len);
        };
        const double kl = KlDivergence(row(ref_lp[h], T), row(lp, T));
        const auto ro = row(ref_out[h], D);
        const double ref_sq = SquaredNorm(ro);
        r.attn_heads[ci][h].Add(kl, SquaredDistance(ro, row(out, D)), ref_sq);
        k_only[h].Add(kl, SquaredDistance(ro, row(out_k, D)), ref_sq);
        v_only[h].Add(0.0, SquaredDistance(ro, row(out_v, D)), ref_sq);
      }
    });
    for (size_t h = 0; h < H; ++h) {
      r.attn[ci].Merge(r.attn_heads[ci][h]);
      r.attn_k_only[ci].Merge(k_only[h]);
      r.attn_v_only[ci].Merge(v_only[h]);
    }
  }
  return r;
}

StatusOr<AnalyzeReport> Analyze(const SafetensorsView& f, const std::string& source,
                                const AnalyzeOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.Validate());
  auto idx = IndexKvDump(f, o.layers);
  if (!idx.ok()) return idx.status();
  AnalyzeReport rep;
  rep.source = source;
  rep.shape = idx->shape;
  rep.options = o;
  rep.supplied_queries = idx->has_queries && !o.force_random_queries;
  rep.queries_per_kv_head =
      rep.supplied_queries ? idx->queries * (idx->q_heads / idx->shape.kv_heads) : o.random_queries;
  std::vector<float> k, v, q;
  for (int l : idx->layers) {
    const std::string p = "layers." + std::to_string(l);
    KVTIER_RETURN_IF_ERROR(f.ReadFloat(*f.Find(p + ".k"), &k));
    KVTIER_RETURN_IF_ERROR(f.ReadFloat(*f.Find(p + ".v"), &v));
    q.clear();
    if (rep.supplied_queries) KVTIER_RETURN_IF_ERROR(f.ReadFloat(*f.Find(p + ".q"), &q));
    float ks = 1.0f, vs = 1.0f;
    if (o.scale_source == ScaleSource::kAmax) {
      float ka = 0, va = 0;
      for (float x : k) ka = std::max(ka, std::fabs(x));
      for (float x : v) va = std::max(va, std::fabs(x));
      ks = nvfp4::GlobalScaleFromAmax(ka);
      vs = nvfp4::GlobalScaleFromAmax(va);
    } else if (o.scale_source == ScaleSource::kGiven) {
      if (static_cast<size_t>(l) >= o.k_scales.size()) {
        return Status::Invalid("the scales file has " + std::to_string(o.k_scales.size()) +
                               " layers, the dump has layer " + std::to_string(l));
      }
      ks = o.k_scales[l];
      vs = o.v_scales[l];
    }
    auto lr = AnalyzeLayer(l, k, v, idx->shape, q, idx->q_heads, ks, vs, o);
    if (!lr.ok()) return lr.status();
    rep.layers.push_back(std::move(*lr));
  }
  const int rc = static_cast<int>(o.rank_codec);
  for (const auto& lr : rep.layers) {
    for (int ci = 0; ci < kNumCodecs; ++ci) {
      rep.k_total[ci].Merge(lr.k[ci].total);
      rep.v_total[ci].Merge(lr.v[ci].total);
      rep.attn_total[ci].Merge(lr.attn[ci]);
      rep.attn_k_only_total[ci].Merge(lr.attn_k_only[ci]);
      rep.attn_v_only_total[ci].Merge(lr.attn_v_only[ci]);
    }
    rep.worst_layers.push_back({lr.layer, -1, lr.attn[rc].pooled_rel()});
    for (size_t h = 0; h < lr.attn_heads[rc].size(); ++h) {
      rep.worst_heads.push_back({lr.layer, static_cast<int>(h), lr.attn_heads[rc][h].pooled_rel()});
    }
  }
  auto by_err = [](const WorstEntry& a, const WorstEntry& b) { return a.rel_err > b.rel_err; };
  std::stable_sort(rep.worst_layers.begin(), rep.worst_layers.end(), by_err);
  std::stable_sort(rep.worst_heads.begin(), rep.worst_heads.end(), by_err);
  rep.worst_layers.resize(std::min<size_t>(rep.worst_layers.size(), o.worst));
  rep.worst_heads.resize(std::min<size_t>(rep.worst_heads.size(), o.worst));
  return rep;
}

// ---- Output ---------------------------------------------------------------------------

namespace {

std::string ScaleSummary(const ScaleHistogram& s) {
  if (s.blocks == 0) return "-";
  const double nb = static_cast<double>(s.blocks);
  std::string o = std::to_string(s.QuantileLog2(0.01)) + "/" + std::to_string(s.QuantileLog2(0.5)) +
                  "/" + std::to_string(s.QuantileLog2(0.99));
  if (s.subnormal) o += " sub " + F("%.1f%%", 100.0 * s.subnormal / nb);
  if (s.clamped) o += " clamp " + F("%.1f%%", 100.0 * s.clamped / nb);
  if (s.zero) o += " zero " + F("%.1f%%", 100.0 * s.zero / nb);
  return o;
}

void ErrRow(std::ostringstream& o, const std::string& lead, const ErrorStats& e, const std::string& sc) {
  char b[512];
  std::snprintf(b, sizeof b, "%-28s %10.3e %10.3e %9.3e %9.6f %6.2f %6.2f %6.3f %6.3f  %s\n",
                lead.c_str(), e.mse(), e.nmse(), e.max_abs, e.cosine(), 100 * e.zero_ratio(),
                100 * e.flushed_ratio(), 100 * e.clip_ratio(), 100 * e.saturation_ratio(), sc.c_str());
  o << b;
}

const char* kErrHeader =
    "%-28s %10s %10s %9s %9s %6s %6s %6s %6s  %s\n";

Json ErrJson(const ErrorStats& e) {
  Json j;
  j["n"] = e.n;
  j["mse"] = e.mse();
  j["nmse"] = e.nmse();
  j["max_abs_err"] = e.max_abs;
  j["cosine"] = e.cosine();
  j["zero_ratio"] = e.zero_ratio();
  j["flushed_ratio"] = e.flushed_ratio();
  j["clip_ratio"] = e.clip_ratio();
  j["saturation_ratio"] = e.saturation_ratio();
  return j;
}

Json AttnJson(const AttnStats& a) {
  Json j;
  j["queries"] = a.n;
  j["kl_mean"] = a.kl_mean();
  j["kl_max"] = a.kl_max;
  j["out_rel_err"] = a.pooled_rel();
  j["out_rel_err_mean"] = a.rel_mean();
  j["out_rel_err_max"] = a.rel_max;
  return j;
}

Json ScalesJson(const ScaleHistogram& s) {
  Json j;
  j["blocks"] = s.blocks;
  j["zero"] = s.zero;
  j["subnormal"] = s.subnormal;
  j["clamped"] = s.clamped;
  Json bins = Json::array();
  for (const auto& [b, n] : s.log2_bins) bins.push_back({{"log2", b}, {"count", n}});
  j["log2_histogram"] = bins;
  return j;
}

std::string Nonfinite(double v) { return std::isfinite(v) ? "" : " (inf)"; }

}  // namespace

std::string ReportTable(const AnalyzeReport& r, bool detail) {
  std::ostringstream o;
  char b[512];
  o << "KV dump " << r.source << ": " << r.layers.size() << " layers, " << r.shape.tokens
    << " tokens, " << r.shape.kv_heads << " KV heads, head_dim " << r.shape.head_dim << "\n";
  o << "queries: " << r.queries_per_kv_head << " per KV head ("
    << (r.supplied_queries ? "supplied by the dump" : "random N(0,1)") << "); NVFP4 global scales: "
    << ScaleSourceName(r.options.scale_source)
    << (r.options.scale_source == ScaleSource::kAmax ? " (amax/2688 per layer and K/V)" : "")
    << "\n";
  o << "columns: mse, nmse, max abs err, cosine, zero %, flushed %, clip %, saturated %, block "
       "scales log2 p1/p50/p99\n\n";
  std::snprintf(b, sizeof b, kErrHeader, "layer side codec", "mse", "nmse", "max_abs", "cosine",
                "zero%", "flush%", "clip%", "sat%", "scales");
  o << b;
  for (const auto& lr : r.layers) {
    for (int side = 0; side < 2; ++side) {
      for (int ci = 0; ci < kNumCodecs; ++ci) {
        const SideResult& s = side ? lr.v[ci] : lr.k[ci];
        std::snprintf(b, sizeof b, "%-5d %s %s", lr.layer, side ? "V" : "K", CodecName(kAllCodecs[ci]));
        ErrRow(o, b, s.total, ScaleSummary(s.scales));
        if (detail) {
          for (size_t h = 0; h < s.heads.size(); ++h) {
            ErrRow(o, "      head " + std::to_string(h), s.heads[h], "");
          }
          const size_t B = s.buckets.size();
          for (size_t bi = 0; bi < B; ++bi) {
            const uint64_t t0 = bi * r.shape.tokens / B, t1 = (bi + 1) * r.shape.tokens / B;
            ErrRow(o, "      tokens [" + std::to_string(t0) + "," + std::to_string(t1) + ")",
                   s.buckets[bi], "");
          }
        }
      }
    }
  }
  o << "\nattention (p = softmax(qK^T/sqrt(D)); KL(p||p') in nats; |o-o'|/|o| with K and V "
       "quantized;\n"
       " out_rel = sqrt(sum |o-o'|^2 / sum |o|^2) over the queries, then mean and max of the per-query ratio)\n";
  std::snprintf(b, sizeof b, "%-28s %10s %10s %12s %12s %12s\n", "layer codec", "kl_mean", "kl_max",
                "out_rel", "out_rel_mean", "out_rel_max");
  o << b;
  for (const auto& lr : r.layers) {
    for (int ci = 0; ci < kNumCodecs; ++ci) {
      const AttnStats& a = lr.attn[ci];
      std::snprintf(b, sizeof b, "%-5d %-22s %10.3e %10.3e %12.3e %12.3e %12.3e\n", lr.layer,
                    CodecName(kAllCodecs[ci]), a.kl_mean(), a.kl_max, a.pooled_rel(), a.rel_mean(),
                    a.rel_max);
      o << b;
      if (detail) {
        for (size_t h = 0; h < lr.attn_heads[ci].size(); ++h) {
          const AttnStats& ah = lr.attn_heads[ci][h];
          std::snprintf(b, sizeof b, "      head %-17zu %10.3e %10.3e %12.3e %12.3e %12.3e\n", h,
                        ah.kl_mean(), ah.kl_max, ah.pooled_rel(), ah.rel_mean(), ah.rel_max);
          o << b;
        }
      }
    }
  }
  o << "\nall layers\n";
  std::snprintf(b, sizeof b, "%-16s %6s %10s %10s %10s %10s %12s %12s %12s\n", "codec", "bits",
                "K nmse", "V nmse", "K cosine", "attn kl", "attn out rel", "K-only rel", "V-only rel");
  o << b;
  for (int ci = 0; ci < kNumCodecs; ++ci) {
    std::snprintf(b, sizeof b, "%-16s %6.3f %10.3e %10.3e %10.6f %10.3e %12.3e %12.3e %12.3e\n",
                  CodecName(kAllCodecs[ci]), CodecBitsPerValue(kAllCodecs[ci], r.shape.head_dim),
                  r.k_total[ci].nmse(), r.v_total[ci].nmse(), r.k_total[ci].cosine(),
                  r.attn_total[ci].kl_mean(), r.attn_total[ci].pooled_rel(),
                  r.attn_k_only_total[ci].pooled_rel(), r.attn_v_only_total[ci].pooled_rel());
    o << b;
  }
  o << "\nworst layers by " << CodecName(r.options.rank_codec) << " attention output error:";
  for (const auto& w : r.worst_layers) {
    o << "  layer " << w.layer << " " << F("%.3e", w.rel_err) << Nonfinite(w.rel_err);
  }
  o << "\nworst heads:";
  for (const auto& w : r.worst_heads) {
    o << "  L" << w.layer << "/H" << w.head << " " << F("%.3e", w.rel_err) << Nonfinite(w.rel_err);
  }
  o << "\n";
  return o.str();
}

std::string ReportJson(const AnalyzeReport& r) {
  Json j;
  j["source"] = r.source;
  j["shape"] = {{"tokens", r.shape.tokens}, {"kv_heads", r.shape.kv_heads}, {"head_dim", r.shape.head_dim}};
  j["queries"] = {{"source", r.supplied_queries ? "supplied" : "random"},
                  {"per_kv_head", r.queries_per_kv_head}};
  j["global_scales"] = ScaleSourceName(r.options.scale_source);
  j["position_buckets"] = r.layers.empty() ? 0 : r.layers[0].k[0].buckets.size();
  Json codecs = Json::array();
  for (Codec c : kAllCodecs) {
    codecs.push_back({{"name", CodecName(c)}, {"bits_per_value", CodecBitsPerValue(c, r.shape.head_dim)}});
  }
  j["codecs"] = codecs;
  Json layers = Json::array();
  for (const auto& lr : r.layers) {
    Json L;
    L["layer"] = lr.layer;
    L["k_scale"] = lr.k_scale;
    L["v_scale"] = lr.v_scale;
    for (int side = 0; side < 2; ++side) {
      Json S;
      for (int ci = 0; ci < kNumCodecs; ++ci) {
        const SideResult& s = side ? lr.v[ci] : lr.k[ci];
        Json c = ErrJson(s.total);
        c["scales"] = ScalesJson(s.scales);
        Json heads = Json::array(), buckets = Json::array();
        for (const auto& h : s.heads) heads.push_back(ErrJson(h));
        for (const auto& bk : s.buckets) buckets.push_back(ErrJson(bk));
        c["heads"] = heads;
        c["buckets"] = buckets;
        S[CodecName(kAllCodecs[ci])] = c;
      }
      L[side ? "v" : "k"] = S;
    }
    Json A;
    for (int ci = 0; ci < kNumCodecs; ++ci) {
      Json a = AttnJson(lr.attn[ci]);
      Json heads = Json::array();
      for (const auto& h : lr.attn_heads[ci]) heads.push_back(AttnJson(h));
      a["heads"] = heads;
      a["out_rel_err_k_only"] = lr.attn_k_only[ci].pooled_rel();
      a["out_rel_err_v_only"] = lr.attn_v_only[ci].pooled_rel();
      A[CodecName(kAllCodecs[ci])] = a;
    }
    L["attention"] = A;
    layers.push_back(L);
  }
  j["layers"] = layers;
  Json sum;
  for (int ci = 0; ci < kNumCodecs; ++ci) {
    sum[CodecName(kAllCodecs[ci])] = {{"k", ErrJson(r.k_total[ci])},
                                      {"v", ErrJson(r.v_total[ci])},
                                      {"attention", AttnJson(r.attn_total[ci])},
                                      {"out_rel_err_k_only", r.attn_k_only_total[ci].pooled_rel()},
                                      {"out_rel_err_v_only", r.attn_v_only_total[ci].pooled_rel()}};
  }
  j["summary"] = sum;
  Json wl = Json::array(), wh = Json::array();
  for (const auto& w : r.worst_layers) wl.push_back({{"layer", w.layer}, {"out_rel_err", w.rel_err}});
  for (const auto& w : r.worst_heads) {
    wh.push_back({{"layer", w.layer}, {"head", w.head}, {"out_rel_err", w.rel_err}});
  }
  j["worst"] = {{"codec", CodecName(r.options.rank_codec)}, {"layers", wl}, {"heads", wh}};
  // Non-finite numbers become null in JSON (nlohmann's rule); the table prints "inf".
  return j.dump(1) + "\n";
}

std::string ReportSvg(const AnalyzeReport& r, Codec codec) {
  const int ci = static_cast<int>(codec);
  const size_t H = r.shape.kv_heads, L = r.layers.size();
  const int cw = 36, ch = 22, left = 70, top = 50;
  const int width = std::max(left + static_cast<int>(H) * cw + 200, 640);
  const int height = top + static_cast<int>(L) * ch + 60;
  auto is_worst = [&](int layer, size_t h) {
    if (codec != r.options.rank_codec) return false;
    for (const auto& w : r.worst_heads) {
      if (w.layer == layer && w.head == static_cast<int>(h)) return true;
    }
    return false;
  };
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& lr : r.layers) {
    for (const auto& a : lr.attn_heads[ci]) {
      const double v = a.pooled_rel();
      if (v > 0 && std::isfinite(v)) {
        lo = std::min(lo, std::log10(v));
        hi = std::max(hi, std::log10(v));
      }
    }
  }
  if (!(lo <= hi)) lo = hi = 0;
  if (hi - lo < 1e-9) hi = lo + 1;
  auto colour = [&](double v) {
    // Blue (small error) -> yellow -> red (large), on log10.
    double t = (v > 0 && std::isfinite(v)) ? (std::log10(v) - lo) / (hi - lo) : (v > 0 ? 1.0 : 0.0);
    t = std::clamp(t, 0.0, 1.0);
    int R, G, B;
    if (t < 0.5) {
      const double u = t / 0.5;
      R = static_cast<int>(40 + u * 215);
      G = static_cast<int>(80 + u * 175);
      B = static_cast<int>(200 - u * 160);
    } else {
      const double u = (t - 0.5) / 0.5;
      R = 255;
      G = static_cast<int>(255 - u * 215);
      B = static_cast<int>(40 - u * 20);
    }
    char b[16];
    std::snprintf(b, sizeof b, "#%02x%02x%02x", R, G, B);
    return std::string(b);
  };
  std::ostringstream o;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" font-family=\"monospace\" font-size=\"11\">\n";
  o << "<text x=\"10\" y=\"18\" font-size=\"13\">attention output relative error, " << CodecName(codec)
    << " (log10 colour, layer x KV head)</text>\n";
  for (size_t h = 0; h < H; ++h) {
    o << "<text x=\"" << left + static_cast<int>(h) * cw + 8 << "\" y=\"" << top - 6 << "\">h" << h
      << "</text>\n";
  }
  for (size_t li = 0; li < L; ++li) {
    const auto& lr = r.layers[li];
    const int y = top + static_cast<int>(li) * ch;
    o << "<text x=\"10\" y=\"" << y + 15 << "\">layer " << lr.layer << "</text>\n";
    for (size_t h = 0; h < lr.attn_heads[ci].size(); ++h) {
      const double v = lr.attn_heads[ci][h].pooled_rel();
      o << "<rect x=\"" << left + static_cast<int>(h) * cw << "\" y=\"" << y << "\" width=\"" << cw - 2
        << "\" height=\"" << ch - 2 << "\" fill=\"" << colour(v) << "\""
        << (is_worst(lr.layer, h) ? " stroke=\"black\" stroke-width=\"2\"" : "") << "><title>layer "
        << lr.layer << " head " << h << ": " << F("%.3e", v) << "</title></rect>\n";
    }
  }
  const int lx = left + static_cast<int>(H) * cw + 20;
  o << "<text x=\"" << lx << "\" y=\"" << top + 10 << "\">low  " << F("%.3g", std::pow(10, lo)) << "</text>\n";
  o << "<rect x=\"" << lx << "\" y=\"" << top + 16 << "\" width=\"20\" height=\"12\" fill=\"" << colour(std::pow(10, lo)) << "\"/>\n";
  o << "<text x=\"" << lx << "\" y=\"" << top + 46 << "\">high " << F("%.3g", std::pow(10, hi)) << "</text>\n";
  if (codec == r.options.rank_codec && !r.worst_heads.empty()) {
    o << "<text x=\"" << lx << "\" y=\"" << top + 86 << "\">outlined: worst " << r.worst_heads.size()
      << "</text>\n";
  }
  o << "<rect x=\"" << lx << "\" y=\"" << top + 52 << "\" width=\"20\" height=\"12\" fill=\"" << colour(std::pow(10, hi)) << "\"/>\n";
  o << "</svg>\n";
  return o.str();
}

}  // namespace kvtier::quality
