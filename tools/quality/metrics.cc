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
    // Four partial sums (the same order as BatchAttentionLogProbs).
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t d = 0;
    for (; d + 4 <= dim; d += 4) {
      s0 += static_cast<double>(q[d]) * static_cast<double>(kt[d]);
      s1 += static_cast<double>(q[d + 1]) * static_cast<double>(kt[d + 1]);
      s2 += static_cast<double>(q[d + 2]) * static_cast<double>(kt[d + 2]);
      s3 += static_cast<double>(q[d + 3]) * static_cast<double>(kt[d + 3]);
    }
    for (; d < dim; ++d) s0 += static_cast<double>(q[d]) * static_cast<double>(kt[d]);
    (*logp)[t] = ((s0 + s1) + (s2 + s3)) * scale;
    mx = std::max(mx, (*logp)[t]);
  }
  double sum = 0;
  for (size_t t = 0; t < tokens; ++t) sum += std::exp((*logp)[t] - mx);
  const double lse = mx + std::log(sum);
  for (size_t t = 0; t < tokens; ++t) (*logp)[t] -= lse;
}

void AttentionOutput(std::span<const double> logp, const float* v, size_t stride, size_t dim,
                     std::vector<double>* out) {
  std::vector<double> p(logp.size());
  for (size_t t = 0; t < logp.size(); ++t) p[t] = std::exp(logp[t]);
  AttentionOutputFromProbs(p, v, stride, dim, out);
}

void AttentionOutputFromProbs(std::span<const double> probs, const float* v, size_t stride,
                              size_t dim, std::vector<double>* out) {
  out->assign(dim, 0.0);
  double* __restrict o = out->data();
  for (size_t t = 0; t < probs.size(); ++t) {
    const double p = probs[t];
    if (p == 0.0) continue;  // underflowed: contributes exactly nothing
    const float* __restrict vt = v + t * stride;
    size_t d = 0;
    for (; d + 4 <= dim; d += 4) {
      o[d] += p * vt[d];
      o[d + 1] += p * vt[d + 1];
      o[d + 2] += p * vt[d + 2];
      o[d + 3] += p * vt[d + 3];
    }
    for (; d < dim; ++d) o[d] += p * vt[d];
  }
}

namespace {
// q . k with four partial sums, the order AttentionLogProbs uses.
inline double Dot4(const double* q, const double* k, size_t dim) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t d = 0;
  for (; d + 4 <= dim; d += 4) {
    s0 += q[d] * k[d];
    s1 += q[d + 1] * k[d + 1];
    s2 += q[d + 2] * k[d + 2];
    s3 += q[d + 3] * k[d + 3];
  }
  for (; d < dim; ++d) s0 += q[d] * k[d];
  return (s0 + s1) + (s2 + s3);
}
}  // namespace

void BatchAttentionLogProbs(const std::vector<const float*>& queries, const float* k, size_t tokens,
                            size_t stride, size_t dim, std::vector<double>* logp,
                            std::vector<double>* probs) {
  const size_t nq = queries.size();
  const double scale = 1.0 / std::sqrt(static_cast<double>(dim));
  std::vector<double> qd(nq * dim), kd(dim);
  for (size_t i = 0; i < nq; ++i) {
    for (size_t d = 0; d < dim; ++d) qd[i * dim + d] = queries[i][d];
  }
  logp->resize(nq * tokens);
  probs->resize(nq * tokens);
  double* lp = logp->data();
  for (size_t t = 0; t < tokens; ++t) {
    const float* kt = k + t * stride;
    for (size_t d = 0; d < dim; ++d) kd[d] = kt[d];
    for (size_t i = 0; i < nq; ++i) lp[i * tokens + t] = Dot4(&qd[i * dim], kd.data(), dim) * scale;
  }
  for (size_t i = 0; i < nq; ++i) {
    double* row = lp + i * tokens;
    double mx = -std::numeric_limits<double>::infinity();
    for (size_t t = 0; t < tokens; ++t) mx = std::max(mx, row[t]);
    double sum = 0;
    for (size_t t = 0; t < tokens; ++t) sum += std::exp(row[t] - mx);
    const double lse = mx + std::log(sum);
    for (size_t t = 0; t < tokens; ++t) {
      row[t] -= lse;
      (*probs)[i * tokens + t] = std::exp(row[t]);
    }
  }
}

void BatchAttentionOutput(const std::vector<double>& probs, size_t nq, const float* v, size_t tokens,
                          size_t stride, size_t dim, std::vector<double>* out) {
  out->assign(nq * dim, 0.0);
  std::vector<double> vd(dim);
  for (size_t t = 0; t < tokens; ++t) {
    const float* vt = v + t * stride;
    for (size_t d = 0; d < dim; ++d) vd[d] = vt[d];
    for (size_t i = 0; i < nq; ++i) {
      const double p = probs[i * tokens + t];
      if (p == 0.0) continue;
      double* __restrict o = out->data() + i * dim;
      for (size_t d = 0; d < dim; ++d) o[d] += p * vd[d];
    }
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
