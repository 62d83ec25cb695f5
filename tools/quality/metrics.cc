#include "tools/quality/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tools/quality/codecs.h"

namespace kvtier::quality {

void ErrorStats::Add(float x, float xq, uint8_t flags) {
  const double a = x, b = xq, d = a - b;
  ++n;
  sse += d * d;
  ref_sq += a * a;
  dq_sq += b * b;
  dot += a * b;
  max_abs = std::max(max_abs, std::fabs(d));
  if (xq == 0.0f) {
    ++zeros;
    if (x != 0.0f) ++flushed;
  }
  if (flags & kFlagClipped) ++clipped;
  if (flags & kFlagSaturated) ++saturated;
}

void ErrorStats::Merge(const ErrorStats& o) {
  n += o.n;
  zeros += o.zeros;
  flushed += o.flushed;
  clipped += o.clipped;
  saturated += o.saturated;
  sse += o.sse;
  ref_sq += o.ref_sq;
  dq_sq += o.dq_sq;
  dot += o.dot;
  max_abs = std::max(max_abs, o.max_abs);
}

double ErrorStats::mse() const { return n ? sse / static_cast<double>(n) : 0; }
double ErrorStats::rmse() const { return std::sqrt(mse()); }
double ErrorStats::nmse() const {
  if (ref_sq == 0) return sse == 0 ? 0 : std::numeric_limits<double>::infinity();
  return sse / ref_sq;
}
double ErrorStats::cosine() const {
  if (ref_sq == 0 && dq_sq == 0) return 1;
  if (ref_sq == 0 || dq_sq == 0) return 0;
  return dot / (std::sqrt(ref_sq) * std::sqrt(dq_sq));
}

void AttnStats::Add(double kl, double out_err_sq, double out_ref_sq) {
  const double rel = SafeRatio(out_err_sq, out_ref_sq);
  ++n;
  err_sq += out_err_sq;
  ref_sq += out_ref_sq;
  kl_sum += kl;
  rel_sum += rel;
  kl_max = std::max(kl_max, kl);
  rel_max = std::max(rel_max, rel);
}

void AttnStats::Merge(const AttnStats& o) {
  n += o.n;
  err_sq += o.err_sq;
  ref_sq += o.ref_sq;
  kl_sum += o.kl_sum;
  rel_sum += o.rel_sum;
  kl_max = std::max(kl_max, o.kl_max);
  rel_max = std::max(rel_max, o.rel_max);
}

void AttentionLogProbs(const float* q, const float* k, size_t tokens, size_t stride, size_t dim,
                       std::vector<double>* logp) {
  logp->resize(tokens);
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  double mx = -std::numeric_limits<double>::infinity();
  for (size_t t = 0; t < tokens; ++t) {
    const float* kt = k + t * stride;
    double s = 0;
    for (size_t d = 0; d < dim; ++d) s += static_cast<double>(q[d]) * kt[d];
    (*logp)[t] = s * scale;
    mx = std::max(mx, (*logp)[t]);
  }
  double sum = 0;
  for (size_t t = 0; t < tokens; ++t) sum += std::exp((*logp)[t] - mx);
  const double lse = mx + std::log(sum);
  for (size_t t = 0; t < tokens; ++t) (*logp)[t] -= lse;
}

void AttentionOutput(std::span<const double> logp, const float* v, size_t stride, size_t dim,
                     std::vector<double>* out) {
  out->assign(dim, 0.0);
  for (size_t t = 0; t < logp.size(); ++t) {
    const double p = std::exp(logp[t]);
    const float* vt = v + t * stride;
    for (size_t d = 0; d < dim; ++d) (*out)[d] += p * vt[d];
  }
}

double KlDivergence(std::span<const double> lp, std::span<const double> lq) {
  double kl = 0;
  for (size_t t = 0; t < lp.size(); ++t) kl += std::exp(lp[t]) * (lp[t] - lq[t]);
  return std::max(kl, 0.0);  // rounding may leave a tiny negative for identical inputs
}

double AttnStats::pooled_rel() const { return SafeRatio(err_sq, ref_sq); }

double SafeRatio(double num_sq, double den_sq) {
  if (den_sq == 0) return num_sq == 0 ? 0 : std::numeric_limits<double>::infinity();
  return std::sqrt(num_sq / den_sq);
}

double SquaredDistance(std::span<const double> a, std::span<const double> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return s;
}

double SquaredNorm(std::span<const double> a) {
  double s = 0;
  for (double v : a) s += v * v;
  return s;
}

double RelativeError(std::span<const double> a, std::span<const double> b) {
  return SafeRatio(SquaredDistance(a, b), SquaredNorm(a));
}

}  // namespace kvtier::quality
