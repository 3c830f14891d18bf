// The ZAYA forward pass (spec A.4): embedding affine into an fp32 residual stream, then per
// block RMSNorm → CCA attention → residual scaling → RMSNorm → router/MoE → residual
// scaling, then the final norm and the LM head. All math is fp32 through the Backend.
#include <cmath>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "model/model.h"

namespace zaya {

namespace {

// Backend buffers for one forward call, freed on scope exit.
class Scratch {
 public:
  explicit Scratch(Backend& be) : be_(be) {}
  ~Scratch() {
    for (void* p : owned_) be_.free(p);
  }
  float* f(int64_t n) {
    float* p = be_.alloc(n);
    owned_.push_back(p);
    return p;
  }
  int32_t* i(int64_t n) { return reinterpret_cast<int32_t*>(f(n)); }

 private:
  Backend& be_;
  std::vector<void*> owned_;
};

}  // namespace

void Model::forward(const int32_t* ids, int64_t B, int64_t T, DecodeState* state, const ForwardOutputs& out) {
  const ModelConfig& c = cfg_;
  const int64_t N = B * T, D = c.hidden_size, C = c.conv_channels(), Hq = c.num_attention_heads,
                Hkv = c.num_key_value_heads, dh = c.head_dim, Dq = c.q_dim(), Dk = c.kv_dim(),
                R = c.router_hidden_size, E = c.num_experts, V = c.vocab_size, L = c.num_hidden_layers;
  if (B <= 0 || T <= 0) fail("model", "forward needs at least one sequence and one token");
  for (int64_t n = 0; n < N; ++n)
    if (ids[n] < 0 || ids[n] >= V)
      fail("model", "token id " + std::to_string(ids[n]) + " at position " + std::to_string(n) +
                        " is outside the vocabulary [0, " + std::to_string(V) + ")");

  std::unique_ptr<DecodeState> fresh;
  if (!state) {
    fresh = std::make_unique<DecodeState>(c, be_, B, T);
    state = fresh.get();
  }
  if (state->batch != B) fail("model", "decode state holds " + std::to_string(state->batch) +
                                           " sequences but the input has " + std::to_string(B));
  std::vector<int64_t> pos0(state->pos), positions(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b) {
    if (pos0[size_t(b)] + T > state->capacity)
      fail("model", "sequence " + std::to_string(b) + " would reach " + std::to_string(pos0[size_t(b)] + T) +
                        " tokens but the context holds " + std::to_string(state->capacity),
           "raise the context size (--ctx) or shorten the prompt");
    for (int64_t t = 0; t < T; ++t) positions[size_t(b * T + t)] = pos0[size_t(b)] + t;
  }

  Scratch s(be_);
  int32_t* d_ids = s.i(N);
  be_.from_host(d_ids, ids, N * 4);
  float* r = s.f(N * D);       // residual stream
  float* x = s.f(N * D);       // normalised input of a sub-layer
  float* h = s.f(N * D);       // sub-layer output
  float* u = s.f(N * C);       // raw q‖k
  float* z = s.f(N * C);       // conv output
  float* q = s.f(N * Dq);
  float* k = s.f(N * Dk);
  float* vcur = s.f(N * Dk / 2);
  float* vdel = s.f(N * Dk / 2);
  float* v = s.f(N * Dk);
  float* att = s.f(N * Dq);
  float* rh = s.f(N * R);      // router latent (post-EDA)
  float* rho = s.f(N * R);     // previous MoE layer's router latent
  float* ra = s.f(N * R);
  float* rb = s.f(N * R);
  float* probs = s.f(N * (E + 1));
  int32_t* expert = s.i(N);
  float* weight = s.f(N);

  be_.embedding(w_.embed, d_ids, r, N, D);
  be_.affine(r, w_.input_scale, w_.input_bias, N, D);

  for (int64_t l = 0; l < L; ++l) {
    const BlockWeights& bw = w_.blocks[size_t(l)];
    DecodeState::Layer& st = state->layers[size_t(l)];
    // --- CCA attention ---
    be_.rmsnorm(r, bw.input_norm, float(c.rms_norm_eps), x, N, D);
    be_.linear(x, bw.attn.q_proj, nullptr, u, N, D, Dq, false, C);
    be_.linear(x, bw.attn.k_proj, nullptr, u + Dq, N, D, Dk, false, C);
    CcaConvArgs ca;
    ca.u = u; ca.state = st.conv; ca.w_dw = bw.attn.conv_dw_w; ca.b_dw = bw.attn.conv_dw_b;
    ca.w_grp = bw.attn.conv_grp_w; ca.b_grp = bw.attn.conv_grp_b; ca.z = z;
    ca.B = B; ca.T = T; ca.C = C; ca.t0 = c.cca_time0; ca.t1 = c.cca_time1; ca.group = dh;
    be_.cca_conv(ca);
    CcaQkArgs qa;
    qa.z = z; qa.u = u; qa.temp = bw.attn.temp; qa.positions = positions.data(); qa.q = q; qa.k = k;
    qa.N = N; qa.Hq = Hq; qa.Hkv = Hkv; qa.dh = dh; qa.rotary_dim = c.rotary_dim(l); qa.theta = c.rope(l).theta;
    be_.cca_qk(qa);
    be_.linear(x, bw.attn.v_current, nullptr, vcur, N, D, Dk / 2);
    be_.linear(x, bw.attn.v_delayed, nullptr, vdel, N, D, Dk / 2);
    CcaValueArgs va;
    va.v_cur = vcur; va.v_del = vdel; va.v_state = st.vdel; va.v = v; va.B = B; va.T = T; va.half = Dk / 2;
    be_.cca_values(va);
    be_.cache_write(k, st.k, pos0.data(), B, T, state->capacity, Dk);
    be_.cache_write(v, st.v, pos0.data(), B, T, state->capacity, Dk);
    AttentionArgs aa;
    aa.q = q; aa.k_cache = st.k; aa.v_cache = st.v; aa.out = att; aa.pos0 = pos0.data();
    aa.B = B; aa.T = T; aa.S = state->capacity; aa.Hq = Hq; aa.Hkv = Hkv; aa.dh = dh;
    aa.window = c.is_sliding(l) ? c.sliding_window : 0;
    aa.scale = 1.0f / std::sqrt(float(dh));
    be_.attention(aa);
    be_.linear(att, bw.attn.o_proj, nullptr, h, N, Dq, D);
    const ResidualScaleWeights& pa = bw.post_attn_scale;
    be_.residual_scale(r, h, pa.hidden_scale, pa.hidden_bias, pa.residual_scale, pa.residual_bias, N, D);

    // --- Router + MoE ---
    be_.rmsnorm(r, bw.post_attn_norm, float(c.rms_norm_eps), x, N, D);
    const RouterWeights& rw = bw.router;
    be_.linear(x, rw.down_w, rw.down_b, rh, N, D, R);
    if (l > 0) be_.scaled_add(rh, rho, rw.eda_scale, N, R);
    be_.copy(rho, rh, N * R);
    be_.rmsnorm(rh, rw.norm, float(c.rms_norm_eps), ra, N, R);
    be_.linear(ra, rw.fc1_w, rw.fc1_b, rb, N, R, R);
    be_.gelu(rb, N * R);
    be_.linear(rb, rw.fc2_w, rw.fc2_b, ra, N, R, R);
    be_.gelu(ra, N * R);
    be_.linear(ra, rw.out_w, nullptr, probs, N, R, E + 1);
    be_.softmax(probs, N, E + 1);
    be_.route_select(probs, rw.balancing_biases, expert, weight, N, E + 1);
    MoeArgs ma;
    ma.x = x; ma.expert = expert; ma.weight = weight; ma.gate_up = bw.experts.gate_up; ma.down = bw.experts.down;
    ma.out = h; ma.N = N; ma.D = D; ma.I = c.moe_intermediate_size; ma.E = E;
    ma.skip_identity = c.skip_expert_output == SkipMode::Identity;
    be_.moe(ma);
    const ResidualScaleWeights& pm = bw.post_mlp_scale;
    be_.residual_scale(r, h, pm.hidden_scale, pm.hidden_bias, pm.residual_scale, pm.residual_bias, N, D);

    if (out.experts) be_.to_host(out.experts + l * N, expert, N * 4);
    if (out.residuals) be_.to_host(out.residuals + l * N * D, r, N * D * 4);
    if (out.router_probs) be_.to_host(out.router_probs + l * N * (E + 1), probs, N * (E + 1) * 4);
  }

  for (int64_t b = 0; b < B; ++b) state->pos[size_t(b)] += T;
  if (!out.logits) return;

  // Final norm and LM head, over all positions or only each sequence's last one.
  const int64_t rows = out.last_only ? B : N;
  if (out.last_only) {
    for (int64_t b = 0; b < B; ++b) be_.copy(x + b * D, r + (b * T + T - 1) * D, D);
    be_.copy(r, x, B * D);
  }
  be_.rmsnorm(r, w_.final_norm, float(c.rms_norm_eps), x, rows, D);
  float* logits = s.f(rows * V);
  be_.linear(x, w_.lm_head, w_.lm_head_bias, logits, rows, D, V);
  be_.to_host(out.logits, logits, rows * V * 4);
}

}  // namespace zaya
