// The routed Muon + AdamW optimizer against the float64 twin (tests/fixtures/optim): three
// steps of params and state, Newton-Schulz alone, routing by name on a fixture model; plus
// Newton-Schulz call counting, the orthogonality of Muon's update, range/shard stepping and
// checkpoint state round trips.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/config.h"
#include "model/params.h"
#include "test_helpers.h"
#include "train/optimizer.h"

namespace zaya {
namespace {

void add_param(ParamLayout& L, const std::string& name, std::vector<int64_t> shape, ParamKind kind) {
  L.add(name, std::move(shape), kind);
}

// std::max that keeps a NaN (std::max drops one: NaN compares false), so that a NaN result fails
// the comparison that follows.
double max_keep_nan(double acc, double x) { return std::isnan(acc) || std::isnan(x) ? NAN : std::max(acc, x); }

double max_abs_diff(const float* a, const float* b, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = max_keep_nan(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

std::vector<float> read(const SafeTensorsSet& s, const std::string& name, int64_t numel) {
  const auto* e = s.find(name);
  EXPECT_NE(e, nullptr) << "fixture lacks " << name;
  std::vector<float> v(size_t(numel), 0.0f);
  if (!e) return v;
  EXPECT_EQ(int64_t(e->info->numel()), numel) << name;
  s.read_f32(name, v.data());
  return v;
}

// The fixture's seven tensors, with the ParamKinds build_param_layout gives them.
ParamLayout fixture_layout() {
  ParamLayout L;
  add_param(L, "model.embed_tokens.weight", {12, 4}, ParamKind::Embedding);
  add_param(L, "model.layers.0.input_layernorm.weight", {7}, ParamKind::Vector);
  add_param(L, "model.layers.0.self_attn.qkv_proj.q_proj.weight", {6, 10}, ParamKind::Matrix);
  add_param(L, "model.layers.0.self_attn.qkv_proj.conv_qk_depthwise.weight", {8, 1, 2}, ParamKind::Conv);
  add_param(L, "model.layers.0.self_attn.qkv_proj.conv_qk_grouped.weight", {8, 4, 2}, ParamKind::Conv);
  add_param(L, "model.layers.0.self_attn.o_proj.weight", {10, 6}, ParamKind::Matrix);
  add_param(L, "model.layers.0.mlp.experts.gate_up_proj", {3, 8, 5}, ParamKind::Matrix);
  return L;
}

const std::string kOptimDir = "tests/fixtures/optim";

TEST(Optimizer, RoutingOfFixtureTensorsMatchesTwin) {
  auto j = nlohmann::json::parse(std::ifstream(test::source_path(kOptimDir + "/optim.json")));
  ParamLayout L = fixture_layout();
  ASSERT_EQ(j["tensors"].size(), L.params.size());
  for (const ParamSpec& p : L.params) {
    const auto& t = j["tensors"].at(p.name);
    EXPECT_EQ(t["shape"].get<std::vector<int64_t>>(), p.shape) << p.name;
    EXPECT_EQ(route_name(p), t["optimizer"].get<std::string>()) << p.name;
    EXPECT_EQ(route_param(p).weight_decay, t["weight_decay"].get<double>() > 0) << p.name;
  }
}

TEST(Optimizer, ThreeStepsMatchTwin) {
  auto j = nlohmann::json::parse(std::ifstream(test::source_path(kOptimDir + "/optim.json")));
  const float lr = j["lr"].get<float>();
  OptimizerConfig cfg;
  cfg.weight_decay = j["weight_decay"].get<double>();
  ASSERT_EQ(j["steps"].get<int>(), 3);
  auto be = make_cpu_backend();
  ParamLayout L = fixture_layout();
  SafeTensorsSet fx = SafeTensorsSet::open_file(test::source_path(kOptimDir + "/optim.safetensors"));
  std::vector<float> params(size_t(L.total), 0.0f), grads(size_t(L.total), 0.0f);
  for (const ParamSpec& p : L.params) {
    auto v = read(fx, "step0.param." + p.name, p.numel);
    std::copy(v.begin(), v.end(), params.begin() + p.offset);
  }
  Optimizer opt(L, cfg, *be);
  double worst_param = 0, worst_state = 0;
  for (int s = 1; s <= 3; ++s) {
    const std::string st = "step" + std::to_string(s) + ".";
    for (const ParamSpec& p : L.params) {
      auto v = read(fx, st + "grad." + p.name, p.numel);
      std::copy(v.begin(), v.end(), grads.begin() + p.offset);
    }
    opt.step(params.data(), grads.data(), lr);
    for (const ParamSpec& p : L.params) {
      auto ref = read(fx, st + "param." + p.name, p.numel);
      worst_param = std::max(worst_param, max_abs_diff(params.data() + p.offset, ref.data(), p.numel));
      EXPECT_LT(max_abs_diff(params.data() + p.offset, ref.data(), p.numel), 1e-6) << st << p.name;
      if (route_param(p).kind == OptimKind::Muon) {
        auto m = read(fx, st + "muon_momentum." + p.name, p.numel);
        ASSERT_NE(opt.muon_momentum(p.name), nullptr);
        worst_state = std::max(worst_state, max_abs_diff(opt.muon_momentum(p.name), m.data(), p.numel));
        EXPECT_LT(max_abs_diff(opt.muon_momentum(p.name), m.data(), p.numel), 1e-6) << st << p.name;
        EXPECT_EQ(opt.adam_m(p.name), nullptr);
      } else {
        auto m = read(fx, st + "adam_m." + p.name, p.numel);
        auto v = read(fx, st + "adam_v." + p.name, p.numel);
        ASSERT_NE(opt.adam_m(p.name), nullptr);
        worst_state = std::max({worst_state, max_abs_diff(opt.adam_m(p.name), m.data(), p.numel),
                                max_abs_diff(opt.adam_v(p.name), v.data(), p.numel)});
        EXPECT_LT(max_abs_diff(opt.adam_m(p.name), m.data(), p.numel), 1e-6) << st << p.name;
        EXPECT_LT(max_abs_diff(opt.adam_v(p.name), v.data(), p.numel), 1e-6) << st << p.name;
        EXPECT_LT(test::max_rel_err(opt.adam_v(p.name), v.data(), size_t(p.numel)), 1e-5) << st << p.name;
      }
    }
  }
  std::printf("3 steps vs twin: max |param diff| %.2e, max |state diff| %.2e\n", worst_param, worst_state);
  for (const ParamSpec& p : L.params) EXPECT_EQ(opt.step_counts()[L.index.at(p.name)], 3) << p.name;
  // 2 plain matrices + 3 experts, each orthogonalised once per step.
  ASSERT_EQ(opt.muon_matrices().size(), 5u);
  for (int64_t c : opt.ns_calls()) EXPECT_EQ(c, 3);
}

TEST(Optimizer, NewtonSchulzAloneMatchesTwin) {
  auto be = make_cpu_backend();
  SafeTensorsSet fx = SafeTensorsSet::open_file(test::source_path(kOptimDir + "/optim.safetensors"));
  for (auto [name, rows, cols] : {std::tuple<const char*, int64_t, int64_t>{"wide", 6, 10}, {"tall", 10, 6}}) {
    auto x = read(fx, std::string("ns.") + name + ".input", rows * cols);
    auto ref = read(fx, std::string("ns.") + name + ".output", rows * cols);
    be->newton_schulz(x.data(), rows, cols, 5);
    std::printf("NS %s vs twin: max |diff| %.2e\n", name, max_abs_diff(x.data(), ref.data(), rows * cols));
    EXPECT_LT(max_abs_diff(x.data(), ref.data(), rows * cols), 5e-6) << name;
  }
}

TEST(Optimizer, ModelRoutingByNameMatchesTwin) {
  auto j = nlohmann::json::parse(std::ifstream(test::source_path(kOptimDir + "/optim.json")));
  const std::string kase = j["model_routing_case"].get<std::string>();
  ModelConfig c = load_config_file(test::source_path("tests/fixtures/" + kase + "/config.json"));
  ParamLayout L = build_param_layout(c);
  const auto& want = j["model_routing"];
  EXPECT_EQ(want.size(), L.params.size());
  for (const ParamSpec& p : L.params) {
    ASSERT_TRUE(want.contains(p.name)) << "twin has no routing for " << p.name;
    EXPECT_EQ(route_name(p), want[p.name]["optimizer"].get<std::string>()) << p.name;
    EXPECT_EQ(route_param(p).weight_decay, want[p.name]["weight_decay"].get<bool>()) << p.name;
  }
  auto be = make_cpu_backend();
  Optimizer opt(L, OptimizerConfig{}, *be);
  const std::string table = opt.routing_table();
  for (const ParamSpec& p : L.params) EXPECT_NE(table.find(p.name), std::string::npos) << p.name;
  EXPECT_NE(table.find("muon x3 [48,32]"), std::string::npos) << table;
  EXPECT_NE(table.find("none (balancer)"), std::string::npos);
  EXPECT_NE(table.find("totals: muon "), std::string::npos);
}

// ---- float64 helpers for the orthogonality checks
using Mat = std::vector<double>;

Mat matmul_abt(const Mat& a, const Mat& b, int64_t m, int64_t k, int64_t n) {  // a[m,k] b[n,k]^T
  Mat c(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t t = 0; t < k; ++t) s += a[size_t(i * k + t)] * b[size_t(j * k + t)];
      c[size_t(i * n + j)] = s;
    }
  return c;
}

// Newton-Schulz in float64, written independently of the backend (spec C.4).
Mat ns64(Mat x, int64_t rows, int64_t cols) {
  double nrm = 0;
  for (double v : x) nrm += v * v;
  nrm = std::sqrt(nrm) + 1e-7;
  for (double& v : x) v /= nrm;
  bool tr = rows > cols;
  int64_t r = tr ? cols : rows, c = tr ? rows : cols;
  Mat X(size_t(r * c));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) X[size_t(i * c + j)] = tr ? x[size_t(j * r + i)] : x[size_t(i * c + j)];
  for (int s = 0; s < 5; ++s) {
    Mat A = matmul_abt(X, X, r, c, r);
    Mat AA = matmul_abt(A, A, r, r, r);  // A symmetric
    Mat B(size_t(r * r));
    for (size_t i = 0; i < B.size(); ++i) B[i] = -4.7750 * A[i] + 2.0315 * AA[i];
    Mat Y(size_t(r * c));
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        double acc = 3.4445 * X[size_t(i * c + j)];
        for (int64_t t = 0; t < r; ++t) acc += B[size_t(i * r + t)] * X[size_t(t * c + j)];
        Y[size_t(i * c + j)] = acc;
      }
    X = Y;
  }
  Mat out(size_t(rows * cols));
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) (tr ? out[size_t(j * r + i)] : out[size_t(i * c + j)]) = X[size_t(i * c + j)];
  return out;
}

// Eigenvalues of a symmetric n x n matrix (cyclic Jacobi), ascending.
std::vector<double> sym_eigenvalues(Mat a, int64_t n) {
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) off += a[size_t(p * n + q)] * a[size_t(p * n + q)];
    if (off < 1e-30) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        double apq = a[size_t(p * n + q)];
        if (std::fabs(apq) < 1e-300) continue;
        double theta = (a[size_t(q * n + q)] - a[size_t(p * n + p)]) / (2 * apq);
        double t = (theta >= 0 ? 1 : -1) / (std::fabs(theta) + std::sqrt(theta * theta + 1));
        double cs = 1 / std::sqrt(t * t + 1), sn = t * cs;
        for (int64_t k = 0; k < n; ++k) {  // columns p, q
          double akp = a[size_t(k * n + p)], akq = a[size_t(k * n + q)];
          a[size_t(k * n + p)] = cs * akp - sn * akq;
          a[size_t(k * n + q)] = sn * akp + cs * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // rows p, q
          double apk = a[size_t(p * n + k)], aqk = a[size_t(q * n + k)];
          a[size_t(p * n + k)] = cs * apk - sn * aqk;
          a[size_t(q * n + k)] = sn * apk + cs * aqk;
        }
      }
  }
  std::vector<double> ev(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ev[size_t(i)] = a[size_t(i * n + i)];
  std::sort(ev.begin(), ev.end());
  return ev;
}

// Singular values of a [rows, cols] matrix, ascending (min(rows, cols) of them).
std::vector<double> singular_values(const Mat& x, int64_t rows, int64_t cols) {
  Mat g = rows <= cols ? matmul_abt(x, x, rows, cols, rows) : Mat{};
  if (rows > cols) {  // X^T X
    g.assign(size_t(cols * cols), 0.0);
    for (int64_t i = 0; i < cols; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        double s = 0;
        for (int64_t t = 0; t < rows; ++t) s += x[size_t(t * cols + i)] * x[size_t(t * cols + j)];
        g[size_t(i * cols + j)] = s;
      }
  }
  auto ev = sym_eigenvalues(g, std::min(rows, cols));
  for (double& e : ev) e = std::sqrt(std::max(e, 0.0));
  return ev;
}

// Random params and grads for a whole model layout; buffers get non-zero "grads" too, which
// the optimizer must ignore.
void fill_random(const ParamLayout& L, std::vector<float>& params, std::vector<float>& grads, uint64_t seed) {
  params.assign(size_t(L.total), 0.0f);
  grads.assign(size_t(L.total), 0.0f);
  auto pv = test::random_vector(size_t(L.total), seed, 0.05);
  auto gv = test::random_vector(size_t(L.total), seed + 1, 1e-3);
  for (const ParamSpec& p : L.params)
    for (int64_t i = 0; i < p.numel; ++i) {
      params[size_t(p.offset + i)] = pv[size_t(p.offset + i)];
      grads[size_t(p.offset + i)] = gv[size_t(p.offset + i)];
    }
}

TEST(Optimizer, EveryMuonMatrixRunsNewtonSchulzOncePerStep) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto be = make_cpu_backend();
  Optimizer opt(L, OptimizerConfig{}, *be);
  // Per block: q, k, v_cur, v_del, o, router down, fc1, fc2, out_proj, and 2 per expert.
  const size_t expect = size_t(c.num_hidden_layers * (9 + 2 * c.num_experts));
  ASSERT_EQ(opt.muon_matrices().size(), expect);
  int64_t muon_tensors = 0;
  for (const ParamSpec& p : L.params) muon_tensors += p.kind == ParamKind::Matrix;
  EXPECT_EQ(muon_tensors, c.num_hidden_layers * 11);
  std::vector<float> params, grads;
  fill_random(L, params, grads, 11);
  const std::vector<float> before = params;
  for (int s = 1; s <= 3; ++s) {
    opt.step(params.data(), grads.data(), 1e-3f);
    for (size_t m = 0; m < opt.muon_matrices().size(); ++m) ASSERT_EQ(opt.ns_calls()[m], s) << m;
  }
  // The balancing biases are never touched; every trainable tensor moved.
  for (const ParamSpec& p : L.params) {
    double d = max_abs_diff(params.data() + p.offset, before.data() + p.offset, p.numel);
    if (p.kind == ParamKind::Buffer) {
      EXPECT_EQ(d, 0.0) << p.name;
      EXPECT_EQ(route_param(p).kind, OptimKind::None);
    } else {
      EXPECT_GT(d, 0.0) << p.name;
    }
  }
}

// k orthonormal vectors of length n (Gram-Schmidt, twice), row-major [k, n].
Mat orthonormal_rows(int64_t k, int64_t n, Rng& rng) {
  Mat q(size_t(k * n));
  for (auto& v : q) v = rng.normal();
  for (int pass = 0; pass < 2; ++pass)
    for (int64_t i = 0; i < k; ++i) {
      double* qi = q.data() + i * n;
      for (int64_t j = 0; j < i; ++j) {
        const double* qj = q.data() + j * n;
        double d = 0;
        for (int64_t t = 0; t < n; ++t) d += qi[t] * qj[t];
        for (int64_t t = 0; t < n; ++t) qi[t] -= d * qj[t];
      }
      double nn = 0;
      for (int64_t t = 0; t < n; ++t) nn += qi[t] * qi[t];
      for (int64_t t = 0; t < n; ++t) qi[t] /= std::sqrt(nn);
    }
  return q;
}

TEST(Optimizer, MuonUpdateIsTheOrthogonalisedGradient) {
  // Every Muon matrix of a model gets an ill-conditioned gradient U diag(s) V^T with singular
  // values spread over 1.5 decades. After one step from zero momentum, the update direction is
  // NS(1.95 G) (checked against an independent float64 NS), and its singular values are all
  // within (0.5, 1.3): NS equalises the spectrum, which neither SGD nor AdamW would do.
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto be = make_cpu_backend();
  OptimizerConfig cfg;
  Optimizer opt(L, cfg, *be);
  std::vector<float> params, grads;
  fill_random(L, params, grads, 21);
  Rng rng(99);
  for (const MuonMatrix& m : opt.muon_matrices()) {
    const int64_t K = std::min(m.rows, m.cols);
    Mat U = orthonormal_rows(K, m.rows, rng), V = orthonormal_rows(K, m.cols, rng);
    for (int64_t i = 0; i < m.rows; ++i)
      for (int64_t j = 0; j < m.cols; ++j) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += 1e-3 * std::pow(10.0, -1.5 * double(k) / double(K - 1)) * U[size_t(k * m.rows + i)] *
                 V[size_t(k * m.cols + j)];
        grads[size_t(m.offset + i * m.cols + j)] = float(acc);
      }
  }
  const std::vector<float> before = params;
  const float lr = 1e-2f;
  opt.step(params.data(), grads.data(), lr);
  double worst_ref = 0, sv_lo = 1e9, sv_hi = 0, g_cond_min = 1e9;
  for (const MuonMatrix& m : opt.muon_matrices()) {
    const int64_t n = m.rows * m.cols;
    const double scale = cfg.muon_scale * std::sqrt(double(std::max(m.rows, m.cols)));
    Mat upd(static_cast<size_t>(n)), u(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      double w0 = before[size_t(m.offset + i)], w1 = params[size_t(m.offset + i)];
      upd[size_t(i)] = (w0 * (1 - double(lr) * cfg.weight_decay) - w1) / (double(lr) * scale);
      g[size_t(i)] = grads[size_t(m.offset + i)];
      u[size_t(i)] = (1 + cfg.muon_momentum) * g[size_t(i)];
    }
    Mat ref = ns64(u, m.rows, m.cols);
    double d = 0;
    for (int64_t i = 0; i < n; ++i) d = max_keep_nan(d, std::fabs(upd[size_t(i)] - ref[size_t(i)]));
    worst_ref = max_keep_nan(worst_ref, d);
    auto sv = singular_values(upd, m.rows, m.cols);
    sv_lo = std::min(sv_lo, sv.front());
    sv_hi = std::max(sv_hi, sv.back());
    auto gs = singular_values(g, m.rows, m.cols);
    g_cond_min = std::min(g_cond_min, gs.back() / gs.front());
  }
  std::printf("Muon update vs float64 NS: max |diff| %.2e; update singular values in [%.3f, %.3f]; min cond(G) %.1f\n",
              worst_ref, sv_lo, sv_hi, g_cond_min);
  EXPECT_LT(worst_ref, 1e-5);  // update recovered through fp32 parameter differences
  EXPECT_GT(sv_lo, 0.5);
  EXPECT_LT(sv_hi, 1.3);
  EXPECT_GT(g_cond_min, 20.0);  // the gradients themselves were far from orthogonal

  // Scaling a Muon matrix's gradient does not change its update (NS normalises by the
  // Frobenius norm), while rotating it rotates the update. Check both on one matrix.
  const MuonMatrix& m = opt.muon_matrices()[0];
  Optimizer a(L, cfg, *be), b(L, cfg, *be);
  std::vector<float> pa = before, pb = before, gb = grads;
  for (int64_t i = 0; i < m.rows * m.cols; ++i) gb[size_t(m.offset + i)] *= 1000.0f;
  a.step(pa.data(), grads.data(), lr);
  b.step(pb.data(), gb.data(), lr);
  EXPECT_LT(max_abs_diff(pa.data() + m.offset, pb.data() + m.offset, m.rows * m.cols), 1e-6);
}

TEST(Optimizer, RangeStepsComposeToOneStep) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto be = make_cpu_backend();
  std::vector<float> p1, g;
  fill_random(L, p1, g, 31);
  std::vector<float> p2 = p1;
  Optimizer full(L, OptimizerConfig{}, *be), parts(L, OptimizerConfig{}, *be);
  const size_t n = L.params.size(), k = n / 3;
  for (int s = 0; s < 2; ++s) {
    full.step(p1.data(), g.data(), 2e-3f);
    parts.step_range(k, n, p2.data(), g.data(), 2e-3f);
    parts.step_range(0, k, p2.data(), g.data(), 2e-3f);
  }
  EXPECT_EQ(max_abs_diff(p1.data(), p2.data(), L.total), 0.0);
  EXPECT_EQ(max_abs_diff(full.moment1(), parts.moment1(), full.moment1_size()), 0.0);
  EXPECT_EQ(max_abs_diff(full.moment2(), parts.moment2(), full.moment2_size()), 0.0);
  EXPECT_EQ(full.step_counts(), parts.step_counts());
  EXPECT_EQ(full.ns_calls(), parts.ns_calls());
}

// Newton-Schulz across tensors: the owned Muon matrices of one shape go to the backend in one
// batch (as many as the workspace holds), and every tensor comes out as it does stepped alone.
// On one thread the CPU computes each matrix of a batch exactly as alone, so the steps must
// agree bit for bit; the number of batches shows the grouping happened.
TEST(Optimizer, NewtonSchulzAcrossTensorsBatchesEachShapeAndMatchesPerTensor) {
  struct RestoreThreads {
    int before = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(before); }
  } restore;
  omp_set_num_threads(1);
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto be = make_cpu_backend();
  EXPECT_FALSE(be->newton_schulz_across_tensors());  // the CPU's default: one tensor per batch
  std::vector<float> p_per, g;
  fill_random(L, p_per, g, 47);
  // Muon tensors by matrix shape, in layout order, and the largest tensor.
  std::map<std::pair<int64_t, int64_t>, std::vector<int64_t>> by_shape;  // shape -> floats of each tensor
  int64_t muon_tensors = 0, largest = 0;
  for (const ParamSpec& p : L.params) {
    const ParamRoute r = route_param(p);
    if (r.kind != OptimKind::Muon) continue;
    by_shape[{r.rows, r.cols}].push_back(r.rows * r.cols * r.matrices);
    ++muon_tensors;
    largest = std::max(largest, r.rows * r.cols * r.matrices);
  }
  ASSERT_GT(muon_tensors, int64_t(by_shape.size()));  // some shape has several tensors
  // Batches when each shape's tensors fill batches of `capacity` floats in order.
  auto batches_of = [&](int64_t capacity) {
    int64_t n = 0;
    for (const auto& [shape, sizes] : by_shape) {
      int64_t used = capacity;  // no open batch
      for (int64_t f : sizes) {
        if (used + f > capacity) ++n, used = 0;
        used += f;
      }
    }
    return n;
  };
  Optimizer per(L, OptimizerConfig{}, *be);
  EXPECT_FALSE(per.newton_schulz_across_tensors());
  for (int64_t capacity : {int64_t(0), largest + largest / 2}) {
    SCOPED_TRACE("workspace " + std::to_string(capacity) + " floats");
    std::vector<float> p_across = p_per, p_ref = p_per;
    Optimizer ref(L, OptimizerConfig{}, *be), across(L, OptimizerConfig{}, *be);
    across.set_newton_schulz_across_tensors(true, capacity);
    EXPECT_TRUE(across.newton_schulz_across_tensors());
    for (int s = 0; s < 2; ++s) {
      ref.step(p_ref.data(), g.data(), 2e-3f);
      across.step(p_across.data(), g.data(), 2e-3f);
    }
    EXPECT_EQ(ref.ns_batches(), 2 * muon_tensors);
    EXPECT_EQ(across.ns_batches(), 2 * batches_of(capacity > 0 ? capacity : Optimizer::kNsGroupFloats));
    EXPECT_LT(across.ns_batches(), ref.ns_batches());
    EXPECT_EQ(max_abs_diff(p_ref.data(), p_across.data(), L.total), 0.0);
    EXPECT_EQ(max_abs_diff(ref.moment1(), across.moment1(), ref.moment1_size()), 0.0);
    EXPECT_EQ(ref.step_counts(), across.step_counts());
    EXPECT_EQ(ref.ns_calls(), across.ns_calls());
  }
}

TEST(Optimizer, ShardOwnsOnlyItsTensors) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto be = make_cpu_backend();
  std::vector<float> p_full, g;
  fill_random(L, p_full, g, 41);
  const std::vector<float> before = p_full;
  const size_t n = L.params.size(), a = n / 4, b = 3 * n / 4;
  Optimizer full(L, OptimizerConfig{}, *be);
  full.step(p_full.data(), g.data(), 1e-3f);
  // A contiguous ZeRO-1 shard and a scattered one (as bin packing assigns them).
  std::vector<bool> range(n, false), scattered(n, false);
  for (size_t i = a; i < b; ++i) range[i] = true;
  for (size_t i = 0; i < n; i += 3) scattered[i] = true;
  for (const std::vector<bool>& mine : {range, scattered}) {
    Optimizer shard(L, OptimizerConfig{}, *be, mine);
    std::vector<float> p_shard = before;
    shard.step(p_shard.data(), g.data(), 1e-3f);
    EXPECT_LT(shard.moment1_size(), full.moment1_size());
    for (size_t i = 0; i < n; ++i) {
      const ParamSpec& p = L.params[i];
      const float* want = (mine[i] ? p_full.data() : before.data()) + p.offset;
      EXPECT_EQ(max_abs_diff(p_shard.data() + p.offset, want, p.numel), 0.0) << p.name;
      EXPECT_EQ(shard.owns(i), mine[i]);
    }
    for (const MuonMatrix& m : shard.muon_matrices()) EXPECT_TRUE(mine[m.param]);
    EXPECT_THROW(shard.step_range(0, n + 1, p_shard.data(), g.data(), 1e-3f), Error);
    if (!mine[0]) {
      EXPECT_EQ(shard.adam_m(L.params[0].name), nullptr);
    }
  }
  EXPECT_THROW(Optimizer(L, OptimizerConfig{}, *be, std::vector<bool>(n + 1, true)), Error);
}

TEST(Optimizer, StateRoundTripResumesExactly) {
  ModelConfig c = preset_config("zaya-tiny");
  ParamLayout L = build_param_layout(c);
  auto be = make_cpu_backend();
  std::vector<float> p, g;
  fill_random(L, p, g, 51);
  Optimizer a(L, OptimizerConfig{}, *be);
  a.step(p.data(), g.data(), 1e-3f);
  a.step(p.data(), g.data(), 1e-3f);
  // "Checkpoint": copy every state tensor out to host buffers.
  std::vector<std::vector<float>> saved;
  std::vector<StateTensor> views = a.save_state(), host;
  for (const StateTensor& t : views) {
    saved.emplace_back(size_t(t.numel));
    be->to_host(saved.back().data(), t.data, t.numel * 4);
  }
  for (size_t i = 0; i < views.size(); ++i) host.push_back({views[i].name, saved[i].data(), views[i].numel, views[i].shape});
  std::vector<StateCounter> counters = a.save_counters();
  EXPECT_EQ(counters.size(), size_t(std::count_if(L.params.begin(), L.params.end(),
                                                  [](const ParamSpec& s) { return s.kind != ParamKind::Buffer; })));
  Optimizer b(L, OptimizerConfig{}, *be);
  b.load_state(host);
  b.load_counters(counters);
  std::vector<float> pb = p;
  a.step(p.data(), g.data(), 1e-3f);
  b.step(pb.data(), g.data(), 1e-3f);
  EXPECT_EQ(max_abs_diff(p.data(), pb.data(), L.total), 0.0);
  EXPECT_EQ(a.step_counts(), b.step_counts());

  // Malformed state is refused, naming the tensor.
  Optimizer d(L, OptimizerConfig{}, *be);
  std::vector<StateTensor> missing(host.begin() + 1, host.end());
  EXPECT_THROW(d.load_state(missing), Error);
  std::vector<StateTensor> wrong = host;
  wrong[0].numel -= 1;
  EXPECT_THROW(d.load_state(wrong), Error);
  std::vector<StateTensor> extra = host;
  extra.push_back({"adam_m.no.such.tensor", saved[0].data(), 1, {1}});
  EXPECT_THROW(d.load_state(extra), Error);
  std::vector<StateCounter> bad_counters(counters.begin() + 1, counters.end());
  EXPECT_THROW(d.load_counters(bad_counters), Error);
}

TEST(Optimizer, ConfigValidation) {
  ParamLayout L = fixture_layout();
  auto be = make_cpu_backend();
  OptimizerConfig c;
  c.ns_steps = 0;
  try {
    Optimizer o(L, c, *be);
    FAIL() << "ns_steps = 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("ns_steps"), std::string::npos);
  }
  c = OptimizerConfig{};
  c.adam_beta2 = 1.0;
  EXPECT_THROW(Optimizer(L, c, *be), Error);
  c = OptimizerConfig{};
  c.muon_momentum = -0.1;
  EXPECT_THROW(Optimizer(L, c, *be), Error);
  Optimizer ok(L, OptimizerConfig{}, *be);
  std::vector<float> p(size_t(L.total), 0.0f), g(size_t(L.total), 0.0f);
  EXPECT_THROW(ok.step(p.data(), g.data(), std::nanf("")), Error);
  ParamLayout bad;
  add_param(bad, "x.weight", {2, 3, 4, 5}, ParamKind::Matrix);
  EXPECT_THROW(Optimizer(bad, OptimizerConfig{}, *be), Error);
}

TEST(Optimizer, NewtonSchulzEdgeCases) {
  auto be = make_cpu_backend();
  // A zero matrix stays zero (pure weight decay then applies).
  std::vector<float> z(12, 0.0f);
  be->newton_schulz(z.data(), 3, 4, 5);
  for (float v : z) EXPECT_EQ(v, 0.0f);
  // Square and 1-row matrices; output equals the float64 reference.
  for (auto [r, cc] : {std::pair<int64_t, int64_t>{7, 7}, {1, 9}, {9, 1}, {33, 64}, {64, 33}}) {
    auto x = test::random_vector(size_t(r * cc), uint64_t(r * 100 + cc));
    Mat xd(x.begin(), x.end());
    Mat ref = ns64(xd, r, cc);
    be->newton_schulz(x.data(), r, cc, 5);
    double d = 0;
    for (size_t i = 0; i < x.size(); ++i) d = max_keep_nan(d, std::fabs(double(x[i]) - ref[i]));
    EXPECT_LT(d, 1e-5) << r << "x" << cc;
  }
}

// A tensor's experts are orthogonalised one per thread: each matrix of the batch on its own,
// as the float64 reference, and bitwise as newton_schulz computes it on one thread.
TEST(Optimizer, NewtonSchulzBatchedOrthogonalisesEachMatrixOnItsOwn) {
  struct RestoreThreads {
    int before = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(before); }
  } restore;
  auto be = make_cpu_backend();
  for (int threads : {2, 1}) {
    omp_set_num_threads(threads);
    if (omp_get_max_threads() != threads) GTEST_SKIP() << "OpenMP gives no " << threads << " threads here";
    for (auto [batch, r, cc] : {std::tuple<int64_t, int64_t, int64_t>{5, 33, 64}, {3, 64, 33}, {1, 16, 24}}) {
      auto x = test::random_vector(size_t(batch * r * cc), uint64_t(batch * 1000 + r));
      for (int64_t i = 0; i < batch; ++i)  // a different scale per matrix (each is normalised alone)
        for (int64_t k = 0; k < r * cc; ++k) x[size_t(i * r * cc + k)] *= float(1 + 3 * i);
      std::vector<Mat> ref;
      for (int64_t i = 0; i < batch; ++i)
        ref.push_back(ns64(Mat(x.begin() + i * r * cc, x.begin() + (i + 1) * r * cc), r, cc));
      std::vector<float> alone = x;  // each matrix by newton_schulz on one thread
      omp_set_num_threads(1);
      for (int64_t i = 0; i < batch; ++i) be->newton_schulz(alone.data() + i * r * cc, r, cc, 5);
      omp_set_num_threads(threads);
      be->newton_schulz_batched(x.data(), batch, r, cc, 5);
      for (int64_t i = 0; i < batch; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r * cc; ++k)
          d = max_keep_nan(d, std::fabs(double(x[size_t(i * r * cc + k)]) - ref[size_t(i)][size_t(k)]));
        EXPECT_LT(d, 1e-5) << threads << " threads, matrix " << i << " of " << batch << " " << r << "x" << cc;
      }
      if (batch >= threads) {
        EXPECT_EQ(x, alone) << threads << " threads, " << batch << " matrices " << r << "x" << cc;
      }
    }
  }
  std::vector<float> none;
  be->newton_schulz_batched(none.data(), 0, 4, 4, 5);  // an empty batch does nothing
}

// The matmul count bench_train reports (and ZeRO-1's bin packing weighs): per iteration
// X X^T (2 m^2 n), A A (2 m^3) and B X (2 m^2 n) on the wide orientation, m <= n.
TEST(Optimizer, NewtonSchulzFlopsCountTheThreeProducts) {
  const double m = 48, n = 80;
  EXPECT_DOUBLE_EQ(newton_schulz_flops(48, 80, 1), 2 * m * m * n + 2 * m * m * m + 2 * m * m * n);
  EXPECT_DOUBLE_EQ(newton_schulz_flops(80, 48, 5), 5 * newton_schulz_flops(48, 80, 1));  // tall = wide
  EXPECT_DOUBLE_EQ(newton_schulz_flops(2048, 2048, 5), 5 * 6.0 * 2048.0 * 2048.0 * 2048.0);
}

}  // namespace
}  // namespace zaya
