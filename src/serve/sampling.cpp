// Greedy / temperature / top-k / top-p sampling and logit adjustments.
#include "serve/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"

namespace zaya {

int32_t sample_token(const float* logits, int64_t vocab, const SamplingParams& p, Rng& rng) {
  if (p.temperature < 0) fail("sampling", "temperature must be >= 0");
  if (p.top_p <= 0 || p.top_p > 1) fail("sampling", "top-p must be in (0, 1]");
  if (p.temperature == 0.0f) return int32_t(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  int64_t keep = vocab;
  if (p.top_k > 0 && p.top_k < vocab) {
    keep = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + keep, idx.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  } else {
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  }
  std::vector<double> prob(static_cast<size_t>(keep));
  const double mx = logits[idx[0]];
  double sum = 0;
  for (int64_t i = 0; i < keep; ++i) sum += prob[size_t(i)] = std::exp((logits[idx[size_t(i)]] - mx) / p.temperature);
  if (p.top_p < 1.0f) {  // smallest prefix whose mass reaches top_p
    double acc = 0;
    int64_t cut = keep;
    for (int64_t i = 0; i < keep; ++i) {
      acc += prob[size_t(i)] / sum;
      if (acc >= p.top_p) { cut = i + 1; break; }
    }
    keep = cut;
    sum = std::accumulate(prob.begin(), prob.begin() + keep, 0.0);
  }
  double r = rng.uniform() * sum;
  for (int64_t i = 0; i < keep; ++i) {
    r -= prob[size_t(i)];
    if (r < 0) return idx[size_t(i)];
  }
  return idx[size_t(keep - 1)];
}

TokenSampler::TokenSampler(const SamplingParams& params, int64_t vocab, uint64_t seed)
    : params_(params), vocab_(vocab), rng_(seed) {
  if (params.adjusts_logits()) {
    adjusted_.resize(size_t(vocab));
    counts_.assign(size_t(vocab), 0);
  }
}

int32_t TokenSampler::next(const float* logits) {
  if (adjusted_.empty()) return sample_token(logits, vocab_, params_, rng_);
  std::copy_n(logits, vocab_, adjusted_.begin());
  adjust_logits(adjusted_.data(), vocab_, params_, counts_);
  const int32_t id = sample_token(adjusted_.data(), vocab_, params_, rng_);
  ++counts_[size_t(id)];
  return id;
}

void adjust_logits(float* logits, int64_t vocab, const SamplingParams& p,
                   const std::vector<int32_t>& counts) {
  if (p.presence_penalty != 0 || p.frequency_penalty != 0) {
    if (int64_t(counts.size()) != vocab)
      fail("sampling", "penalties need one token count per vocabulary entry");
    for (int64_t j = 0; j < vocab; ++j)
      if (const int32_t c = counts[size_t(j)]; c > 0)
        logits[j] -= p.frequency_penalty * float(c) + p.presence_penalty;
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab)
      fail("sampling", "logit_bias names token id " + std::to_string(id) + ", outside the vocabulary [0, " +
                           std::to_string(vocab) + ")");
    logits[id] += bias;
  }
}

}  // namespace zaya
