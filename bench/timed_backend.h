// The per-op timing Backend decorator shared by the benchmarks (bench_forward, bench_train).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>
#include <unordered_map>

#include "backend/backend.h"
#include "bench_common.h"
#include "model/model.h"

namespace zaya::bench {

// ------------------------------------------------------------------ timing backend
// Forwards every op to an inner backend and, when enabled, accumulates wall time (and the
// FLOPs of the ops that count them) per op name under an optional phase prefix ("fb.",
// "opt."). Linear ops are named by their weight (q_proj, o_proj, router.fc1, lm_head, ...)
// via a pointer map. Used by bench_forward (inference) and bench_train (training steps).
// On a GPU backend every timed op ends with a device synchronisation (a 4-byte to_host), so
// each op's time is its device time plus one synchronisation (~10 us); the step is slower
// while profiling.
class TimedBackend final : public Backend {
 public:
  struct Stat {
    double seconds = 0;
    int64_t calls = 0;
    double flops = 0;
  };
  explicit TimedBackend(Backend& inner) : in_(inner) {
    if (in_.name() != "cpu") sync_buf_ = in_.alloc(1);
  }
  ~TimedBackend() override {
    if (sync_buf_) in_.free(sync_buf_);
  }
  bool enabled = false;
  std::string phase;  // prefix of every op name while set
  std::map<std::string, Stat> stats;
  std::unordered_map<const float*, std::string> weight_names;
  std::string wname(const float* w) const {
    auto it = weight_names.find(w);
    return it == weight_names.end() ? std::string("other") : it->second;
  }

  void reset() { stats.clear(); }

  std::string name() const override { return "timed(" + in_.name() + ")"; }
  float* alloc(int64_t n) override { return in_.alloc(n); }
  double matmul_peak_gflops() override { return in_.matmul_peak_gflops(); }
  int64_t peak_memory_bytes() const override { return in_.peak_memory_bytes(); }
  std::string diagnostics() const override { return in_.diagnostics(); }
  void set_weights_frozen(bool frozen) override { in_.set_weights_frozen(frozen); }
  void free(void* p) override { in_.free(p); }

  void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N,
              bool accumulate, int64_t ldy) override {
    std::string nm = "linear." + wname(w);
    time(nm, 2.0 * double(M) * K * N, [&] { in_.linear(x, w, bias, y, M, K, N, accumulate, ldy); });
  }
  void embedding(const float* t, const int32_t* ids, float* o, int64_t N, int64_t D) override {
    time("embedding", 0, [&] { in_.embedding(t, ids, o, N, D); });
  }
  void rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim) override {
    time("rmsnorm", 0, [&] { in_.rmsnorm(x, w, eps, y, rows, dim); });
  }
  void affine(float* x, const float* s, const float* b, int64_t rows, int64_t dim) override {
    time("affine", 0, [&] { in_.affine(x, s, b, rows, dim); });
  }
  void residual_scale_rmsnorm(const ResidualNormArgs& a, float* r_out, float* y) override {
    time("residual_scale_rmsnorm", 0, [&] { in_.residual_scale_rmsnorm(a, r_out, y); });
  }
  void scaled_add(float* y, const float* x, const float* s, int64_t rows, int64_t dim) override {
    time("scaled_add", 0, [&] { in_.scaled_add(y, x, s, rows, dim); });
  }
  void gelu(float* x, int64_t n) override {
    time("gelu", 0, [&] { in_.gelu(x, n); });
  }
  void softmax(float* x, int64_t rows, int64_t cols) override {
    time("softmax", 0, [&] { in_.softmax(x, rows, cols); });
  }
  void route_select(const float* p, const float* b, int32_t* e, float* w, int64_t N, int64_t cl) override {
    time("route_select", 0, [&] { in_.route_select(p, b, e, w, N, cl); });
  }
  void cca_conv(const CcaConvArgs& a) override {
    double fl = 2.0 * double(a.B) * a.T * a.C * (a.t0 + a.group * a.t1);
    time("cca_conv", fl, [&] { in_.cca_conv(a); });
  }
  void cca_qk(const CcaQkArgs& a) override {
    time("cca_qk", 0, [&] { in_.cca_qk(a); });
  }
  void cca_values(const CcaValueArgs& a) override {
    time("cca_values", 0, [&] { in_.cca_values(a); });
  }
  void cache_write(const float* src, float* cache, const int64_t* pos0, int64_t B, int64_t T, int64_t S,
                   int64_t W) override {
    time("cache_write", 0, [&] { in_.cache_write(src, cache, pos0, B, T, S, W); });
  }
  void attention(const AttentionArgs& a) override {
    double fl = 0;  // exact causal count: keys visible per query
    for (int64_t b = 0; b < a.B; ++b)
      for (int64_t t = 0; t < a.T; ++t) {
        int64_t p = a.pos0[b] + t, vis = a.window > 0 ? std::min(p + 1, a.window) : p + 1;
        fl += 4.0 * double(vis) * a.Hq * a.dh;
      }
    time("attention", fl, [&] { in_.attention(a); });
  }
  void moe(const MoeArgs& a) override {
    int64_t routed = 0;
    if (enabled) {  // FLOPs for the profile; a.expert is backend memory (device memory on a GPU)
      std::vector<int32_t> experts(static_cast<size_t>(a.N));
      in_.to_host(experts.data(), a.expert, a.N * 4);
      for (int32_t e : experts) routed += e < a.E;
    }
    time("moe", 2.0 * double(routed) * 3 * a.I * a.D, [&] { in_.moe(a); });
  }
  // Backward ops (training): forwarded so the decorator stays a complete Backend.
  void linear_fp32(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N,
                   bool accumulate, int64_t ldy) override {
    time("linear_fp32." + wname(w), 2.0 * double(M) * K * N,
         [&] { in_.linear_fp32(x, w, bias, y, M, K, N, accumulate, ldy); });
  }
  void linear_fp32_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                            int64_t M, int64_t K, int64_t N, bool acc, int64_t lddy) override {
    time("linear_fp32_backward." + wname(w), 0,
         [&] { in_.linear_fp32_backward(x, w, dy, dx, dw, db, M, K, N, acc, lddy); });
  }
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t M,
                       int64_t K, int64_t N, bool acc, int64_t lddy) override {
    time("linear_backward." + wname(w), 0, [&] { in_.linear_backward(x, w, dy, dx, dw, db, M, K, N, acc, lddy); });
  }
  void embedding_backward(const int32_t* ids, const float* dout, float* dt, int64_t N, int64_t D) override {
    time("embedding_backward", 0, [&] { in_.embedding_backward(ids, dout, dt, N, D); });
  }
  void rmsnorm_backward(const float* x, const float* w, const float* dy, float eps, float* dx, float* dw,
                        int64_t rows, int64_t dim, bool acc) override {
    time("rmsnorm_backward", 0, [&] { in_.rmsnorm_backward(x, w, dy, eps, dx, dw, rows, dim, acc); });
  }
  void affine_backward(const float* x, const float* sc, const float* b, float* d, float* dsc, float* db, int64_t rows,
                       int64_t dim) override {
    time("affine_backward", 0, [&] { in_.affine_backward(x, sc, b, d, dsc, db, rows, dim); });
  }
  void residual_scale_rmsnorm_backward(const ResidualNormArgs& a, const float* r_out, const float* dy, float* dr,
                                       float* dh, const ResidualNormGrads& g) override {
    time("residual_scale_rmsnorm_backward", 0, [&] { in_.residual_scale_rmsnorm_backward(a, r_out, dy, dr, dh, g); });
  }
  void scaled_add_backward(const float* x, const float* sc, const float* dy, float* dx, float* dsc, int64_t rows,
                           int64_t dim) override {
    time("scaled_add_backward", 0, [&] { in_.scaled_add_backward(x, sc, dy, dx, dsc, rows, dim); });
  }
  void gelu_backward(const float* x, float* d, int64_t n) override {
    time("gelu_backward", 0, [&] { in_.gelu_backward(x, d, n); });
  }
  void softmax_backward(const float* p, float* d, int64_t rows, int64_t cols) override {
    time("softmax_backward", 0, [&] { in_.softmax_backward(p, d, rows, cols); });
  }
  void route_backward(const int32_t* e, const float* dw, float* dp, int64_t N, int64_t cl) override {
    time("route_backward", 0, [&] { in_.route_backward(e, dw, dp, N, cl); });
  }
  void cca_conv_backward(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw, float* db_dw, float* dw_grp,
                         float* db_grp) override {
    time("cca_conv_backward", 0, [&] { in_.cca_conv_backward(a, dz, du, dw_dw, db_dw, dw_grp, db_grp); });
  }
  void cca_qk_backward(const CcaQkArgs& a, const float* dq, const float* dk, float* dz, float* du,
                       float* dtemp) override {
    time("cca_qk_backward", 0, [&] { in_.cca_qk_backward(a, dq, dk, dz, du, dtemp); });
  }
  void cca_values_backward(const float* dv, float* dvc, float* dvd, int64_t B, int64_t T, int64_t half,
                           const int32_t* seg) override {
    time("cca_values_backward", 0, [&] { in_.cca_values_backward(dv, dvc, dvd, B, T, half, seg); });
  }
  void attention_backward(const AttentionArgs& a, const float* dout, float* dq, float* dk, float* dv) override {
    time("attention_backward", 0, [&] { in_.attention_backward(a, dout, dq, dk, dv); });
  }
  void moe_backward(const MoeArgs& a, const float* dout, float* dx, float* dweight, float* dgu,
                    float* ddown) override {
    time("moe_backward", 0, [&] { in_.moe_backward(a, dout, dx, dweight, dgu, ddown); });
  }
  double lm_head_loss(const float* y, const float* w, const float* bias, const int32_t* target, int64_t N, int64_t D,
                      int64_t V, float scale, float* dy, float* dw, float* dbias) override {
    double r = 0;
    time("lm_head_loss", 0, [&] { r = in_.lm_head_loss(y, w, bias, target, N, D, V, scale, dy, dw, dbias); });
    return r;
  }
  void newton_schulz_batched(float* x, int64_t batch, int64_t rows, int64_t cols, int steps) override {
    time("newton_schulz", 0, [&] { in_.newton_schulz_batched(x, batch, rows, cols, steps); });
  }
  void newton_schulz(float* x, int64_t rows, int64_t cols, int steps) override {
    time("newton_schulz", 0, [&] { in_.newton_schulz(x, rows, cols, steps); });
  }
  void muon_momentum(float* m, const float* g, float* u, int64_t n, float mu, bool nesterov) override {
    time("muon_momentum", 0, [&] { in_.muon_momentum(m, g, u, n, mu, nesterov); });
  }
  void muon_update(float* w, const float* x, int64_t n, float lr, float scale, float wd) override {
    time("muon_update", 0, [&] { in_.muon_update(w, x, n, lr, scale, wd); });
  }
  void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, float lr, float b1, float b2, float eps,
                    float wd, int64_t t) override {
    time("adamw_update", 0, [&] { in_.adamw_update(w, g, m, v, n, lr, b1, b2, eps, wd, t); });
  }
  double sum_squares(const float* x, int64_t n) override {
    double r = 0;
    time("sum_squares", 0, [&] { r = in_.sum_squares(x, n); });
    return r;
  }
  void scale_inplace(float* x, float s, int64_t n) override {
    time("scale_inplace", 0, [&] { in_.scale_inplace(x, s, n); });
  }
  void copy(float* d, const float* s, int64_t n) override {
    time("copy", 0, [&] { in_.copy(d, s, n); });
  }
  void fill(float* d, float v, int64_t n) override {
    time("fill", 0, [&] { in_.fill(d, v, n); });
  }
  void to_host(void* h, const void* s, int64_t bytes) override {
    time("to_host", 0, [&] { in_.to_host(h, s, bytes); });
  }
  void from_host(void* d, const void* h, int64_t bytes) override {
    time("from_host", 0, [&] { in_.from_host(d, h, bytes); });
  }

 private:
  template <class F>
  void time(const std::string& nm, double flops, F&& f) {
    if (!enabled) {
      f();
      return;
    }
    auto t0 = Clock::now();
    f();
    if (sync_buf_) {
      float x;
      in_.to_host(&x, sync_buf_, 4);
    }
    Stat& s = stats[phase + nm];
    s.seconds += seconds_since(t0);
    s.calls += 1;
    s.flops += flops;
  }
  Backend& in_;
  float* sync_buf_ = nullptr;  // GPU backends: synchronised after each timed op
};

void name_weights(TimedBackend& tb, const Model& m) {
  const ModelWeights& w = m.weights();
  for (const BlockWeights& b : w.blocks) {
    tb.weight_names[b.attn.q_proj] = "q_proj";
    tb.weight_names[b.attn.k_proj] = "k_proj";
    tb.weight_names[b.attn.v_current] = "v_current";
    tb.weight_names[b.attn.v_delayed] = "v_delayed";
    tb.weight_names[b.attn.o_proj] = "o_proj";
    tb.weight_names[b.router.down_w] = "router.down";
    tb.weight_names[b.router.fc1_w] = "router.fc1";
    tb.weight_names[b.router.fc2_w] = "router.fc2";
    tb.weight_names[b.router.out_w] = "router.out";
  }
  tb.weight_names[w.lm_head] = "lm_head";
}


}  // namespace zaya::bench
