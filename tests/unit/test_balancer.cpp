// The selection-bias controller (spec §B, decision 4) against the float64 twin
// (tests/fixtures/balancer), its edge cases and metrics, and a closed-loop simulation: a fixed
// router that favours one expert is balanced by feeding the biases back through argmax(p + b).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "test_helpers.h"
#include "train/balancer.h"

namespace zaya {
namespace {

void add_param(ParamLayout& L, const std::string& name, std::vector<int64_t> shape, ParamKind kind) {
  L.add(name, std::move(shape), kind);
}

// L layers of [E+1] biases with an unrelated tensor in between, as in a real layout.
ParamLayout bias_layout(int64_t L, int64_t E) {
  ParamLayout out;
  for (int64_t k = 0; k < L; ++k) {
    add_param(out, "model.layers." + std::to_string(k) + ".mlp.gate.router_mlp.fc2.bias", {3}, ParamKind::Vector);
    add_param(out, "model.layers." + std::to_string(k) + ".mlp.gate.balancing_biases", {E + 1}, ParamKind::Buffer);
  }
  return out;
}

std::vector<int64_t> read_i64(const SafeTensorsSet& s, const std::string& name) {
  const auto* e = s.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (!e) return {};
  EXPECT_EQ(e->info->dtype, DType::I64);
  std::vector<int64_t> v(e->info->numel());
  std::memcpy(v.data(), e->file->data(*e->info), v.size() * 8);
  return v;
}

std::vector<float> read_f32(const SafeTensorsSet& s, const std::string& name) {
  const auto* e = s.find(name);
  EXPECT_NE(e, nullptr) << name;
  if (!e) return {};
  std::vector<float> v(e->info->numel());
  s.read_f32(name, v.data());
  return v;
}

TEST(Balancer, MatchesTwinFixture) {
  const std::string dir = test::source_path("tests/fixtures/balancer");
  SafeTensorsSet fx = SafeTensorsSet::open_file(dir + "/balancer.safetensors");
  const int64_t L = 2, E = 4, C = E + 1;
  ParamLayout layout = bias_layout(L, E);
  auto be = make_cpu_backend();
  BiasBalancer bal(layout, BalancerConfig{}, *be);
  ASSERT_EQ(bal.layers(), L);
  ASSERT_EQ(bal.experts(), E);
  std::vector<float> params(size_t(layout.total), 0.5f);
  auto b0 = read_f32(fx, "biases.step0");
  for (int64_t l = 0; l < L; ++l)
    std::copy(b0.begin() + l * C, b0.begin() + (l + 1) * C, params.begin() + layout.at(bal.bias_name(l)).offset);
  for (int s = 1; s <= 4; ++s) {
    const std::string st = ".step" + std::to_string(s);
    auto counts = read_i64(fx, "counts" + st);
    ASSERT_EQ(int64_t(counts.size()), L * C);
    bal.step(counts, params.data());
    auto b = read_f32(fx, "biases" + st), m = read_f32(fx, "adam_m" + st), v = read_f32(fx, "adam_v" + st);
    for (int64_t l = 0; l < L; ++l) {
      const float* got = params.data() + layout.at(bal.bias_name(l)).offset;
      for (int64_t e = 0; e < C; ++e) EXPECT_NEAR(got[e], b[size_t(l * C + e)], 1e-7) << st << " l" << l << " e" << e;
      EXPECT_EQ(got[E], -1.0f) << "skip bias must stay frozen";
      for (int64_t e = 0; e < E; ++e) {
        EXPECT_NEAR(bal.adam_m()[size_t(l * C + e)], m[size_t(l * E + e)], 1e-7) << st << " l" << l << " e" << e;
        EXPECT_NEAR(bal.adam_v()[size_t(l * C + e)], v[size_t(l * E + e)], 1e-9) << st << " l" << l << " e" << e;
      }
      EXPECT_EQ(bal.steps()[size_t(l)], s);
    }
  }
  // Other tensors of the arena are untouched.
  for (const ParamSpec& p : layout.params) {
    if (p.kind == ParamKind::Buffer) continue;
    for (int64_t i = 0; i < p.numel; ++i) EXPECT_EQ(params[size_t(p.offset + i)], 0.5f);
  }
}

TEST(Balancer, LayerWithoutRealTokensSkipsItsUpdate) {
  ParamLayout layout = bias_layout(2, 3);
  auto be = make_cpu_backend();
  BiasBalancer bal(layout, BalancerConfig{}, *be);
  std::vector<float> params(size_t(layout.total), 0.0f);
  const int64_t o0 = layout.at(bal.bias_name(0)).offset, o1 = layout.at(bal.bias_name(1)).offset;
  params[size_t(o0 + 3)] = params[size_t(o1 + 3)] = -1.0f;
  // Layer 0: every token skipped. Layer 1: nothing at all.
  std::vector<int64_t> counts = {0, 0, 0, 17, 0, 0, 0, 0};
  auto& met = bal.step(counts, params.data());
  EXPECT_FALSE(met[0].updated);
  EXPECT_FALSE(met[1].updated);
  EXPECT_EQ(met[0].skip_rate, 1.0);
  EXPECT_EQ(met[0].dead_experts, 3);
  EXPECT_EQ(met[1].tokens, 0);
  for (int64_t e = 0; e < 3; ++e) EXPECT_EQ(params[size_t(o0 + e)], 0.0f);
  EXPECT_EQ(bal.steps()[0], 0);
  for (float m : bal.adam_m()) EXPECT_EQ(m, 0.0f);
  // Then a normal step: the over-used expert's bias goes down, the others up, by ~lr.
  counts = {10, 0, 0, 5, 4, 4, 4, 0};
  bal.step(counts, params.data());
  EXPECT_EQ(bal.steps()[0], 1);
  EXPECT_NEAR(params[size_t(o0 + 0)], -1e-3, 1e-6);
  EXPECT_NEAR(params[size_t(o0 + 1)], 1e-3, 1e-6);
  EXPECT_EQ(params[size_t(o0 + 3)], -1.0f);
  for (int64_t e = 0; e < 3; ++e) EXPECT_EQ(params[size_t(o1 + e)], 0.0f);  // balanced: g = 0
  EXPECT_THROW(bal.step(std::vector<int64_t>(7, 1), params.data()), Error);
  counts[2] = -1;
  EXPECT_THROW(bal.step(counts, params.data()), Error);
}

TEST(Balancer, Metrics) {
  const int64_t uniform[5] = {5, 5, 5, 5, 0};
  auto m = balance_metrics(uniform, 4);
  EXPECT_NEAR(m.entropy, 1.0, 1e-12);
  EXPECT_NEAR(m.max_load, 1.0, 1e-12);
  EXPECT_EQ(m.dead_experts, 0);
  EXPECT_EQ(m.skip_rate, 0.0);
  const int64_t one[5] = {0, 12, 0, 0, 4};
  m = balance_metrics(one, 4);
  EXPECT_NEAR(m.entropy, 0.0, 1e-12);
  EXPECT_NEAR(m.max_load, 4.0, 1e-12);
  EXPECT_EQ(m.dead_experts, 3);
  EXPECT_NEAR(m.skip_rate, 0.25, 1e-12);
  EXPECT_EQ(m.tokens, 16);
  const int64_t two[5] = {3, 3, 0, 0, 0};
  EXPECT_NEAR(balance_metrics(two, 4).entropy, 0.5, 1e-12);  // ln 2 / ln 4
}

// A fixed router: per token, softmax of logits that favour expert 0 (and the skip class is
// unattractive). Selection = argmax(p + b); the controller sees the counts every step.
struct SimRouter {
  int64_t N, E;
  std::vector<double> p;  // [N, E+1]
  SimRouter(int64_t n, int64_t e, uint64_t seed) : N(n), E(e), p(size_t(n * (e + 1))) {
    Rng rng(seed);
    for (int64_t t = 0; t < N; ++t) {
      double* row = p.data() + t * (E + 1);
      double mx = -1e30;
      for (int64_t c = 0; c <= E; ++c) {
        double logit = 0.5 * rng.normal() + (c == 0 ? 1.2 : 0.0) + (c == 1 ? 0.4 : 0.0) - (c == E ? 0.5 : 0.0);
        row[c] = logit;
        mx = std::max(mx, logit);
      }
      double s = 0;
      for (int64_t c = 0; c <= E; ++c) s += row[c] = std::exp(row[c] - mx);
      for (int64_t c = 0; c <= E; ++c) row[c] /= s;
    }
  }
  std::vector<int64_t> counts(const float* b) const {
    std::vector<int64_t> cnt(size_t(E + 1), 0);
    for (int64_t t = 0; t < N; ++t) {
      const double* row = p.data() + t * (E + 1);
      int64_t best = 0;
      for (int64_t c = 1; c <= E; ++c)
        if (row[c] + b[c] > row[best] + b[best]) best = c;
      ++cnt[size_t(best)];
    }
    return cnt;
  }
};

TEST(Balancer, ImbalancedRouterBalances) {
  const int64_t E = 8, N = 4096;
  ParamLayout layout = bias_layout(1, E);
  auto be = make_cpu_backend();
  BiasBalancer bal(layout, BalancerConfig{}, *be);
  std::vector<float> params(size_t(layout.total), 0.0f);
  float* b = params.data() + layout.at(bal.bias_name(0)).offset;
  b[E] = -1.0f;
  SimRouter router(N, E, 7);
  const double h0 = balance_metrics(router.counts(b).data(), E).entropy;
  std::vector<double> h;
  for (int s = 0; s < 400; ++s) {
    auto cnt = router.counts(b);
    h.push_back(bal.step(cnt, params.data())[0].entropy);
  }
  const auto final_counts = router.counts(b);
  const auto fin = balance_metrics(final_counts.data(), E);
  std::printf("load entropy: start %.3f, step 100 %.3f, step 200 %.3f, step 400 %.3f (max load %.2f -> %.2f)\n",
              h0, h[99], h[199], fin.entropy, balance_metrics(router.counts(std::vector<float>(E + 1, 0).data()).data(), E).max_load,
              fin.max_load);
  EXPECT_LT(h0, 0.6);
  EXPECT_GT(h[199], h0 + 0.2);
  EXPECT_GT(fin.entropy, 0.97);
  EXPECT_LT(fin.max_load, 1.5);
  EXPECT_EQ(fin.dead_experts, 0);
  EXPECT_LT(b[0], b[2]);  // the favoured expert ends with the lowest bias
  EXPECT_EQ(b[E], -1.0f);
}

TEST(Balancer, SkipBalancingTracksTargetRate) {
  const int64_t E = 4, N = 4096;
  ParamLayout layout = bias_layout(1, E);
  auto be = make_cpu_backend();
  BalancerConfig cfg;
  cfg.balance_skip = true;
  cfg.skip_target = 0.1;
  cfg.lr = 5e-3;
  BiasBalancer bal(layout, cfg, *be);
  std::vector<float> params(size_t(layout.total), 0.0f);
  float* b = params.data() + layout.at(bal.bias_name(0)).offset;
  b[E] = -1.0f;  // skip starts almost never chosen
  SimRouter router(N, E, 9);
  for (int s = 0; s < 400; ++s) bal.step(router.counts(b), params.data());
  auto m = balance_metrics(router.counts(b).data(), E);
  EXPECT_NEAR(m.skip_rate, 0.1, 0.03);
  EXPECT_GT(m.entropy, 0.95);
  EXPECT_GT(b[E], -1.0f);
  EXPECT_EQ(bal.skip_steps()[0], 400);
}

TEST(Balancer, ModelLayoutStateRoundTripAndValidation) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout layout = build_param_layout(c);
  auto be = make_cpu_backend();
  BiasBalancer a(layout, BalancerConfig{}, *be);
  EXPECT_EQ(a.layers(), c.num_hidden_layers);
  EXPECT_EQ(a.experts(), c.num_experts);
  std::vector<float> params(size_t(layout.total), 0.0f);
  const int64_t C = c.num_experts + 1;
  std::vector<int64_t> counts(size_t(a.layers() * C));
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = int64_t(i * 7 % 11);
  a.step(counts, params.data());
  a.step(counts, params.data());
  EXPECT_FALSE(a.metrics_summary().empty());
  std::vector<std::vector<float>> saved;
  std::vector<StateTensor> host;
  for (const StateTensor& t : a.save_state()) {
    saved.emplace_back(t.data, t.data + t.numel);
    host.push_back({t.name, saved.back().data(), t.numel, t.shape});
  }
  BiasBalancer b(layout, BalancerConfig{}, *be);
  b.load_state(host);
  b.load_counters(a.save_counters());
  std::vector<float> pb = params;
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = int64_t(i * 5 % 13);
  a.step(counts, params.data());
  b.step(counts, pb.data());
  EXPECT_EQ(params, pb);
  host.pop_back();
  EXPECT_THROW(b.load_state(host), Error);

  BalancerConfig bad;
  bad.target = {0.5, 0.5};
  EXPECT_THROW(BiasBalancer(layout, bad, *be), Error);
  bad.target = std::vector<double>(size_t(c.num_experts), 0.3);
  EXPECT_THROW(BiasBalancer(layout, bad, *be), Error);
  bad = BalancerConfig{};
  bad.beta2 = 1.0;
  EXPECT_THROW(BiasBalancer(layout, bad, *be), Error);
  ParamLayout none;
  add_param(none, "model.norm.weight", {4}, ParamKind::Vector);
  EXPECT_THROW(BiasBalancer(none, BalancerConfig{}, *be), Error);
}

TEST(Balancer, CustomTargetIsTracked) {
  const int64_t E = 4, N = 4096;
  ParamLayout layout = bias_layout(1, E);
  auto be = make_cpu_backend();
  BalancerConfig cfg;
  cfg.target = {0.4, 0.2, 0.2, 0.2};
  BiasBalancer bal(layout, cfg, *be);
  std::vector<float> params(size_t(layout.total), 0.0f);
  float* b = params.data() + layout.at(bal.bias_name(0)).offset;
  b[E] = -1.0f;
  SimRouter router(N, E, 13);
  for (int s = 0; s < 400; ++s) bal.step(router.counts(b), params.data());
  auto m = balance_metrics(router.counts(b).data(), E);
  EXPECT_NEAR(m.load[0], 0.4, 0.05);
  for (int64_t e = 1; e < E; ++e) EXPECT_NEAR(m.load[size_t(e)], 0.2, 0.05);
}

}  // namespace
}  // namespace zaya
