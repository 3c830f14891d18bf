// Forward of one ZAYA block (spec A.4 step 2): RMSNorm → CCA (A.5–A.6) → residual scaling →
// RMSNorm → router with EDA (A.8) → top-1 MoE with skip class → residual scaling.
#include "model/block.h"

#include <cmath>

#include "core/error.h"
#include "model/scratch.h"

namespace zaya {

namespace {
// Context parallelism: the previous chunk's last P raw q‖k rows and last delayed value arrive
// into the conv and value states (and are kept in a.halo for the backward pass).
void receive_chunk_boundary(Backend& be, const ModelConfig& c, const BlockShape& s, BlockActivations& a) {
  const int64_t C = c.conv_channels(), P = c.conv_state_rows(), half = c.kv_dim() / 2, W = P * C + half;
  ZAYA_CHECK(s.T >= P && a.halo, "context parallel chunks must hold at least the conv's state rows");
  Scratch scratch(be);
  float* tails = scratch.f(s.B * W);
  for (int64_t i = 0; i < s.B; ++i) {
    be.copy(tails + i * W, a.u + (i * s.T + s.T - P) * C, P * C);
    be.copy(tails + i * W + P * C, a.vdel + (i * s.T + s.T - 1) * half, half);
  }
  s.cp->pass_forward(tails, a.halo, s.B / 2, W);
  for (int64_t i = 0; i < s.B; ++i) {
    be.copy(s.conv_state + i * P * C, a.halo + i * W, P * C);
    // A document that begins at the chunk's first token has no delayed value before it.
    if (s.chunk_segments && s.chunk_segments->starts_at_chunk[size_t(i)])
      be.fill(s.vdel_state + i * half, 0.0f, half);
    else
      be.copy(s.vdel_state + i * half, a.halo + i * W + P * C, half);
  }
}

// Context parallelism with document resets: the convolution over [received rows; chunk] from a
// zero state, with the extended start table (chunk_segments.h), and the chunk's rows of its
// output into a.z. (The backward pass takes the same route.)
void conv_over_received_rows(Backend& be, const ModelConfig& c, const BlockShape& s, CcaConvArgs ca,
                             BlockActivations& a) {
  const int64_t C = c.conv_channels(), P = c.conv_state_rows(), W = P * C + c.kv_dim() / 2, T = s.T;
  Scratch scratch(be);
  float* u_ext = scratch.f(s.B * (P + T) * C);
  float* z_ext = scratch.f(s.B * (P + T) * C);
  float* state = scratch.f(s.B * P * C);
  stack_received_rows(be, a.halo, W, a.u, u_ext, s.B, P, T, C);
  be.fill(state, 0.0f, s.B * P * C);
  ca.u = u_ext;
  ca.z = z_ext;
  ca.T = P + T;
  ca.state = state;
  ca.seg_start = s.chunk_segments->extended.data();
  be.cca_conv(ca);
  take_chunk_rows(be, z_ext, a.z, s.B, P, T, C);
}

}  // namespace

ResidualNormArgs residual_norm_args(const ResidualScaleWeights& p, const float* norm_weight, float eps,
                                    const float* r, const float* h, int64_t rows, int64_t dim) {
  ResidualNormArgs m;
  m.r = r; m.h = h; m.hidden_scale = p.hidden_scale; m.hidden_bias = p.hidden_bias;
  m.residual_scale = p.residual_scale; m.residual_bias = p.residual_bias; m.norm_weight = norm_weight;
  m.eps = eps; m.rows = rows; m.dim = dim;
  return m;
}

ResidualNormGrads residual_norm_grads(const ResidualScaleWeights& g, float* norm_weight) {
  return {g.hidden_scale, g.hidden_bias, g.residual_scale, g.residual_bias, norm_weight};
}

void stack_received_rows(Backend& be, const float* head, int64_t head_stride, const float* chunk, float* ext,
                         int64_t B, int64_t P, int64_t T, int64_t C) {
  for (int64_t i = 0; i < B; ++i) {
    if (head)
      be.copy(ext + i * (P + T) * C, head + i * head_stride, P * C);
    else
      be.fill(ext + i * (P + T) * C, 0.0f, P * C);
    be.copy(ext + (i * (P + T) + P) * C, chunk + i * T * C, T * C);
  }
}

void take_chunk_rows(Backend& be, const float* ext, float* chunk, int64_t B, int64_t P, int64_t T,
                     int64_t C) {
  for (int64_t i = 0; i < B; ++i) be.copy(chunk + i * T * C, ext + (i * (P + T) + P) * C, T * C);
}

void forward_block(Backend& be, const ModelConfig& c, int64_t l, const BlockWeights& w, const BlockShape& s,
                   float* r, const float* rho_prev, BlockActivations& a, const NextNorm& next, bool input_normed) {
  const int64_t N = s.B * s.T, D = c.hidden_size, C = c.conv_channels(), Dq = c.q_dim(), Dk = c.kv_dim(),
                R = c.router_hidden_size, E = c.num_experts;
  const float eps = float(c.rms_norm_eps);
  if (a.r_in) be.copy(a.r_in, r, N * D);

  // --- CCA attention ---
  if (!input_normed) be.rmsnorm(r, w.input_norm, eps, a.x1, N, D);
  const LinearOutput projections[] = {{w.attn.q_proj, a.u, Dq, C},
                                      {w.attn.k_proj, a.u + Dq, Dk, C},
                                      {w.attn.v_current, a.vcur, Dk / 2, 0},
                                      {w.attn.v_delayed, a.vdel, Dk / 2, 0}};
  be.linear_many(a.x1, N, D, projections, 4);
  if (s.cp) receive_chunk_boundary(be, c, s, a);
  CcaConvArgs ca;
  ca.u = a.u; ca.state = s.conv_state; ca.w_dw = w.attn.conv_dw_w; ca.b_dw = w.attn.conv_dw_b;
  ca.w_grp = w.attn.conv_grp_w; ca.b_grp = w.attn.conv_grp_b; ca.z = a.z;
  ca.B = s.B; ca.T = s.T; ca.C = C; ca.t0 = c.cca_time0; ca.t1 = c.cca_time1; ca.group = c.head_dim;
  ca.seg_start = s.cp ? nullptr : s.seg_start;  // a chunk's starts are positions in the sequence
  if (s.cp && s.chunk_segments && s.chunk_segments->conv_has_starts)
    conv_over_received_rows(be, c, s, ca, a);
  else
    be.cca_conv(ca);
  CcaQkArgs qa;
  qa.z = a.z; qa.u = a.u; qa.temp = w.attn.temp; qa.positions = s.positions; qa.q = a.q; qa.k = a.k;
  qa.N = N; qa.Hq = c.num_attention_heads; qa.Hkv = c.num_key_value_heads; qa.dh = c.head_dim;
  qa.rotary_dim = c.rotary_dim(l); qa.theta = c.rope(l).theta;
  be.cca_qk(qa);
  CcaValueArgs va;
  va.v_cur = a.vcur; va.v_del = a.vdel; va.v_state = s.vdel_state; va.v = a.v; va.B = s.B; va.T = s.T; va.half = Dk / 2;
  va.seg_start = s.chunk_segments ? s.chunk_segments->relative.data() : s.seg_start;
  be.cca_values(va);
  if (s.cp) {  // every chunk row gets its whole sequence's keys and values
    s.cp->gather(a.k, s.k_cache, s.B / 2, s.T, Dk);
    s.cp->gather(a.v, s.v_cache, s.B / 2, s.T, Dk);
  } else {
    be.cache_write_kv(a.k, a.v, s.k_cache, s.v_cache, s.pos0, s.B, s.T, s.S, Dk);
  }
  AttentionArgs aa;
  aa.q = a.q; aa.k_cache = s.k_cache; aa.v_cache = s.v_cache; aa.out = a.att; aa.pos0 = s.pos0;
  aa.B = s.B; aa.T = s.T; aa.S = s.S; aa.Hq = c.num_attention_heads; aa.Hkv = c.num_key_value_heads; aa.dh = c.head_dim;
  aa.window = c.is_sliding(l) ? c.sliding_window : 0;
  aa.scale = 1.0f / std::sqrt(float(c.head_dim));
  aa.seg_start = s.seg_start;
  if (s.cp) {  // each slot's chunks attend over the one copy of their sequences
    const int64_t Bs = s.B / 2;
    aa.B = Bs;
    for (int64_t slot = 0; slot < 2; ++slot) {
      aa.q = a.q + slot * Bs * s.T * Dq;
      aa.out = a.att + slot * Bs * s.T * Dq;
      aa.pos0 = s.pos0 + slot * Bs;
      if (s.seg_start) aa.seg_start = s.seg_start + slot * Bs * s.T;
      be.attention(aa);
    }
  } else {
    be.attention(aa);
  }
  be.linear(a.att, w.attn.o_proj, nullptr, a.h_attn, N, Dq, D);
  const ResidualScaleWeights& pa = w.post_attn_scale;
  be.residual_scale_rmsnorm(residual_norm_args(pa, w.post_attn_norm, eps, r, a.h_attn, N, D), r, a.x2);
  if (a.r_mid) be.copy(a.r_mid, r, N * D);

  // --- Router + MoE ---
  const RouterWeights& rw = w.router;
  be.linear_fp32(a.x2, rw.down_w, rw.down_b, a.rh, N, D, R);
  if (l > 0) be.scaled_add_rmsnorm(a.rh, rho_prev, rw.eda_scale, rw.norm, eps, a.rn, N, R);
  else be.rmsnorm(a.rh, rw.norm, eps, a.rn, N, R);
  be.linear_fp32_gelu(a.rn, rw.fc1_w, rw.fc1_b, a.f1, a.g1, N, R, R);
  be.linear_fp32_gelu(a.g1, rw.fc2_w, rw.fc2_b, a.f2, a.g2, N, R, R);
  be.linear_fp32(a.g2, rw.out_w, nullptr, a.probs, N, R, E + 1);
  be.route(a.probs, rw.balancing_biases, a.expert, a.weight, N, E + 1);  // softmax, then the selection
  MoeArgs ma;
  ma.x = a.x2; ma.expert = a.expert; ma.weight = a.weight; ma.gate_up = w.experts.gate_up; ma.down = w.experts.down;
  ma.out = a.h_moe; ma.N = N; ma.D = D; ma.I = c.moe_intermediate_size; ma.E = E;
  ma.skip_identity = c.skip_expert_output == SkipMode::Identity;
  be.moe(ma);
  const ResidualScaleWeights& pm = w.post_mlp_scale;
  be.residual_scale_rmsnorm(residual_norm_args(pm, next.weight, eps, r, a.h_moe, N, D), r, next.y);
}

}  // namespace zaya
