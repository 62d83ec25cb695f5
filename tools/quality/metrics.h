// Error metrics of a quantize -> dequantize round trip, at tensor level and at attention
// level. Definitions (x the original values, x' the dequantized ones, n values):
//
//   MSE             sum (x - x')^2 / n
//   NMSE            sum (x - x')^2 / sum x^2            (0 when both sums are 0)
//   max abs error   max |x - x'|
//   cosine          sum x x' / (|x| |x'|)               (1 when both are all zero,
//                                                        0 when only one is)
//   zero ratio      fraction of values with x' == 0
//   flushed ratio   fraction of values with x != 0 but x' == 0
//   clip ratio      fraction of values the codec flagged kFlagClipped (|x| above the
//                   largest value its scale block could represent)
//   saturation      fraction encoded with the largest code magnitude (kFlagSaturated)
//
// Attention level, one query q against one KV head (keys k_t, values v_t, t < T):
//   logit_t = q . k_t / sqrt(D),  p = softmax(logit),  o = sum_t p_t v_t
// with p', o' the same over the dequantized keys and values (p' from K', o' from p' and V'):
//   KL              sum_t p_t (log p_t - log p'_t)      (nats; computed from log-softmax,
//                                                        so it stays finite)
//   out rel error   |o - o'| / |o| per query            (0 when both are 0); reported
//                   as mean and max over queries
//   pooled out rel  sqrt(sum_q |o - o'|^2 / sum_q |o|^2)  over the queries of a head,
//                   layer or dump: the headline attention number. Unlike the mean of
//                   per-query ratios it is not dominated by the few queries whose output
//                   is near zero (attention spread over many zero-mean values).
// Everything accumulates in double.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::quality {

struct ErrorStats {
  uint64_t n = 0, zeros = 0, flushed = 0, clipped = 0, saturated = 0;
  double sse = 0, ref_sq = 0, dq_sq = 0, dot = 0, max_abs = 0;

  void Add(float x, float xq, uint8_t flags);
  void Merge(const ErrorStats& o);
  double mse() const;
  double rmse() const;
  double nmse() const;
  double cosine() const;
  double zero_ratio() const { return Ratio(zeros); }
  double flushed_ratio() const { return Ratio(flushed); }
  double clip_ratio() const { return Ratio(clipped); }
  double saturation_ratio() const { return Ratio(saturated); }

 private:
  double Ratio(uint64_t k) const { return n ? static_cast<double>(k) / static_cast<double>(n) : 0; }
};

struct AttnStats {
  uint64_t n = 0;  // queries
  double kl_sum = 0, kl_max = 0, rel_sum = 0, rel_max = 0;
  double err_sq = 0, ref_sq = 0;  // sum over queries of |o - o'|^2 and |o|^2
  // One query: KL, |o - o'|^2 and |o|^2.
  void Add(double kl, double out_err_sq, double out_ref_sq);
  void Merge(const AttnStats& o);
  double kl_mean() const { return n ? kl_sum / static_cast<double>(n) : 0; }
  double rel_mean() const { return n ? rel_sum / static_cast<double>(n) : 0; }
  double pooled_rel() const;
};

// log softmax(q . k_t / sqrt(dim)) for t < tokens; key t starts at k + t * stride.
void AttentionLogProbs(const float* q, const float* k, size_t tokens, size_t stride, size_t dim,
                       std::vector<double>* logp);
// o = sum_t exp(logp_t) v_t; value t starts at v + t * stride.
void AttentionOutput(std::span<const double> logp, const float* v, size_t stride, size_t dim,
                     std::vector<double>* out);
// The same from probabilities p_t = exp(logp_t) computed once by the caller.
void AttentionOutputFromProbs(std::span<const double> probs, const float* v, size_t stride,
                              size_t dim, std::vector<double>* out);
// Batched forms for nq queries against one KV head: every key and value row is read once
// for all queries (rows of one head are strided through the cache, so per-query passes
// are bound by memory traffic). Results are bit-identical to the single-query forms.
//   logp, probs: nq x tokens, row-major (probs = exp(logp)); out: nq x dim.
void BatchAttentionLogProbs(const std::vector<const float*>& queries, const float* k, size_t tokens,
                            size_t stride, size_t dim, std::vector<double>* logp,
                            std::vector<double>* probs);
void BatchAttentionOutput(const std::vector<double>& probs, size_t nq, const float* v, size_t tokens,
                          size_t stride, size_t dim, std::vector<double>* out);

// sum_t exp(lp_t) (lp_t - lq_t) over log-probabilities.
double KlDivergence(std::span<const double> lp, std::span<const double> lq);
// |a - b| / |a|; 0 when both are 0, +inf when only a is.
double RelativeError(std::span<const double> a, std::span<const double> b);
// sqrt(num / den) with the same conventions (0/0 = 0, x/0 = +inf).
double SafeRatio(double num_sq, double den_sq);
// |a - b|^2 and |a|^2.
double SquaredDistance(std::span<const double> a, std::span<const double> b);
double SquaredNorm(std::span<const double> a);

}  // namespace kvtier::quality
