// The expert-balancing controller of spec §B / decision 4: per MoE layer, an Adam-style update
// of the selection biases (`model.layers.k.mlp.gate.balancing_biases`, [E+1], last = skip)
// from the global batch's int64 token counts per class. Once per optimizer step, after the
// counts have been summed over all micro-batches and all data-parallel ranks:
//   f[e] = cnt[e] / sum_{e<E} cnt[e]          (real experts only)
//   g[e] = f[e] - target[e]                    (target default 1/E)
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  t += 1
//   b[e] -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)      for e < E
// The skip bias b[E] stays frozen at its value (-1 at init) unless balance_skip is set: then
// it gets its own Adam controller with g = skip_rate - skip_target (skip_rate = cnt[E] / all
// tokens) and its own step count. A layer where no token chose a real expert skips the
// real-expert update (fractions undefined; its step count does not advance).
// The biases live in the model's parameter arena (backend memory); m, v and the step counts
// live on the host (fp32 / int64) and go into checkpoints via save_state/save_counters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/params.h"
#include "train/optimizer.h"

namespace zaya {

struct BalancerConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::vector<double> target;  // per real expert load target, sums to 1; empty = uniform 1/E
  bool balance_skip = false;   // false: skip bias frozen
  double skip_target = 0.0;    // target skip rate (fraction of all tokens) when balance_skip
};
// Throws zaya::Error naming the field. E = number of real experts (target's size when given).
void validate_balancer_config(const BalancerConfig& c, int64_t E);

struct BalanceLayerMetrics {
  std::vector<double> load;  // f[e] over real experts (all 0 if no real tokens)
  double entropy = 0;        // normalised load entropy H(f) / ln E in [0, 1] (1 when E == 1)
  double max_load = 0;       // max_e f[e] * E (1 = perfectly balanced)
  double skip_rate = 0;      // cnt[E] / all tokens (0 if no tokens)
  int64_t dead_experts = 0;  // real experts with zero tokens
  int64_t tokens = 0;        // all tokens, skip included
  bool updated = false;      // the real-expert biases moved this step
};
// Metrics of one layer's counts [E+1] without touching any state.
BalanceLayerMetrics balance_metrics(const int64_t* counts, int64_t E);

class BiasBalancer {
 public:
  // Finds every `...mlp.gate.balancing_biases` tensor of the layout (one per layer, all [E+1]).
  BiasBalancer(const ParamLayout& layout, const BalancerConfig& cfg, Backend& be);

  int64_t layers() const { return int64_t(bias_offsets_.size()); }
  int64_t experts() const { return E_; }
  const BalancerConfig& config() const { return cfg_; }
  const std::string& bias_name(int64_t layer) const { return bias_names_[size_t(layer)]; }

  // counts: host int64 [L][E+1] (StepStats::expert_counts of the whole global batch).
  // Reads the biases from params (the parameter arena, backend memory), updates them and
  // writes them back. Returns the per-layer metrics of these counts.
  const std::vector<BalanceLayerMetrics>& step(const int64_t* counts, float* params);
  const std::vector<BalanceLayerMetrics>& step(const std::vector<int64_t>& counts, float* params);
  const std::vector<BalanceLayerMetrics>& metrics() const { return metrics_; }
  // One line per layer: entropy, max load, skip rate, dead experts, for the training log.
  std::string metrics_summary() const;

  // State: m and v per layer [L][E+1] (slot E used only with balance_skip), step counts per
  // layer for the real experts and for the skip class.
  std::vector<float>& adam_m() { return m_; }
  std::vector<float>& adam_v() { return v_; }
  const std::vector<int64_t>& steps() const { return steps_; }
  const std::vector<int64_t>& skip_steps() const { return skip_steps_; }

  // Checkpoint helpers in the Optimizer's format; the data pointers are HOST memory here.
  // Names: "balancer_m.BIAS", "balancer_v.BIAS" ([E+1] each); counters "balancer_step.BIAS",
  // "balancer_skip_step.BIAS" (BIAS = the layer's balancing_biases tensor name).
  std::vector<StateTensor> save_state();
  void load_state(const std::vector<StateTensor>& in);
  std::vector<StateCounter> save_counters() const;
  void load_counters(const std::vector<StateCounter>& in);

 private:
  BalancerConfig cfg_;
  Backend& be_;
  int64_t E_ = 0;
  std::vector<std::string> bias_names_;
  std::vector<int64_t> bias_offsets_;
  std::vector<double> target_;
  std::vector<float> m_, v_;
  std::vector<int64_t> steps_, skip_steps_;
  std::vector<BalanceLayerMetrics> metrics_;
};

}  // namespace zaya
