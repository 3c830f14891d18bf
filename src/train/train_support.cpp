// Helpers for the training loop (see train_support.h).
#include "train/train_support.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace zaya {

double measure_sgemm_gflops() {
  // 2048^3 as in bench/bench_forward.cpp, so the trainer's MFU and the benchmarks agree.
  const int n = 2048;
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n, 0.0f);
  std::vector<double> rates;
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) rates.push_back(2.0 * n * n * double(n) / s / 1e9);  // first run warms up
  }
  return *std::max_element(rates.begin(), rates.end());
}

MatmulPeak::MatmulPeak(std::function<double()> measure) : measure_(std::move(measure)), gflops_(measure_()) {
  if (!(gflops_ > 0))
    fail("train", "the measured matmul peak is " + std::to_string(gflops_) + " GFLOP/s; expected > 0");
}

double MatmulPeak::utilisation(double flops_per_second, std::string* warning) {
  double mfu = flops_per_second / (gflops_ * 1e9);
  if (mfu <= 1.0 || warned_) return mfu;
  char text[256];
  if (!rechecked_) {
    rechecked_ = true;
    const double before = gflops_, again = measure_();
    gflops_ = std::max(gflops_, again);
    mfu = flops_per_second / (gflops_ * 1e9);
    std::snprintf(text, sizeof text,
                  "MFU passed 100%% against the start-up matmul peak of %.1f GFLOP/s (measured while the "
                  "machine was busy?); re-measured %.1f GFLOP/s, now quoting MFU against %.1f",
                  before, again, gflops_);
    *warning = text;
    if (mfu <= 1.0) return mfu;
  }
  warned_ = true;
  std::snprintf(
      text, sizeof text,
      "MFU is %.0f%% even against the re-measured peak of %.1f GFLOP/s: the machine ran faster than "
      "its measured peak (turbo, or load during both measurements); treat MFU as approximate",
      100 * mfu, gflops_);
  *warning = warning->empty() ? std::string(text) : *warning + "; " + text;
  return mfu;
}

double training_flops_per_token(const ModelConfig& c, int64_t T) {
  const double D = double(c.hidden_size), R = double(c.router_hidden_size), I = double(c.moe_intermediate_size);
  const double per_layer = D * double(c.q_dim()) * 2 + D * double(c.kv_dim()) * 2  // q, k, v (2 halves), o
                           + D * R + 2 * R * R + R * double(c.num_experts + 1)        // router
                           + 3 * I * D                                                // one expert
                           + double(c.conv_channels()) * double(c.head_dim) * double(c.cca_time1);  // grouped conv
  const double matmul_params = per_layer * double(c.num_hidden_layers) + double(c.vocab_size) * D;
  const double attention = double(c.num_hidden_layers) * 2.0 * double(T) * double(c.q_dim());  // causal QK^T + PV
  return 3.0 * (2.0 * matmul_params + attention);
}

double eval_loss_sum(Model& m, const int32_t* inputs, const int32_t* targets, int64_t B, int64_t T, int64_t* count,
                     const int32_t* segment_start) {
  double sum = 0;
  int64_t tokens = 0;
  ForwardOutputs out;
  out.targets = targets;
  out.loss_sum = &sum;
  out.loss_tokens = &tokens;
  m.forward(inputs, B, T, nullptr, out, segment_start);
  *count += tokens;
  return sum;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

nlohmann::json balancer_record(const BiasBalancer& b) {
  nlohmann::json layers = nlohmann::json::array();
  double entropy = 0, skip = 0;
  int64_t dead = 0;
  for (const auto& m : b.metrics()) {
    layers.push_back({{"load", m.load}, {"entropy", m.entropy}, {"skip_rate", m.skip_rate}, {"dead", m.dead_experts}});
    entropy += m.entropy;
    skip += m.skip_rate;
    dead += m.dead_experts;
  }
  const double L = std::max<double>(1, double(b.metrics().size()));
  return {{"mean_entropy", entropy / L}, {"mean_skip_rate", skip / L}, {"dead_experts", dead}, {"layers", layers}};
}

double weights_hash(const float* p, int64_t n) {
  uint64_t h = 1469598103934665603ull;
  const unsigned char* b = reinterpret_cast<const unsigned char*>(p);
  for (int64_t i = 0; i < n * 4; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return double(h >> 12);
}

void reload_curve(const std::string& path, int64_t up_to_step, LossCurve* curve) {
  std::vector<std::string> kept;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("step") || j["step"].get<int64_t>() > up_to_step) continue;
      kept.push_back(line);
    }
  }
  {
    std::ofstream out(path, std::ios::trunc);
    for (const auto& l : kept) out << l << "\n";
  }
  // A loss that was not a number (a skipped step's NaN, written as null) or not logged (a step
  // with no targets) reads as NaN.
  auto number_or_nan = [](const nlohmann::json& j, const char* key) {
    auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>() : std::numeric_limits<double>::quiet_NaN();
  };
  for (const std::string& line : kept) {
    auto j = nlohmann::json::parse(line);
    curve->steps.push_back(j["step"].get<double>());
    curve->train_loss.push_back(number_or_nan(j, "loss"));
    if (j.contains("val_loss")) {
      curve->val_steps.push_back(j["step"].get<double>());
      curve->val_loss.push_back(number_or_nan(j, "val_loss"));
    }
  }
}

}  // namespace zaya
