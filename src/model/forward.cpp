// The ZAYA forward pass (spec A.4): embedding affine into an fp32 residual stream, then per
// block RMSNorm → CCA attention → residual scaling → RMSNorm → router/MoE → residual
// scaling, then the final norm and the LM head. All math is fp32 through the Backend.
#include <cmath>
#include <cstring>
#include <memory>
#include <utility>

#include "core/error.h"
#include "model/block.h"
#include "model/model.h"
#include "model/scratch.h"

namespace zaya {


void check_segments(const int32_t* segment_start, int64_t B, int64_t T) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = segment_start[b * T + t];
      const int32_t prev = t > 0 ? segment_start[b * T + t - 1] : 0;
      if (s < 0 || s > t || (s != t && s != prev))
        fail("model", "document start table: row " + std::to_string(b) + " position " + std::to_string(t) +
                          " has start " + std::to_string(s),
             "each entry must equal its own position (a document starts) or the previous entry");
    }
}

void Model::forward(const int32_t* ids, int64_t B, int64_t T, DecodeState* state, const ForwardOutputs& out,
                    const int32_t* segment_start, int64_t first_seq) {
  const ModelConfig& c = cfg_;
  const int64_t N = B * T, D = c.hidden_size, C = c.conv_channels(), Dq = c.q_dim(), Dk = c.kv_dim(),
                R = c.router_hidden_size, E = c.num_experts, V = c.vocab_size, L = c.num_hidden_layers;
  if (B <= 0 || T <= 0) fail("model", "forward needs at least one sequence and one token");
  for (int64_t n = 0; n < N; ++n)
    if (ids[n] < 0 || ids[n] >= V)
      fail("model", "token id " + std::to_string(ids[n]) + " at position " + std::to_string(n) +
                        " is outside the vocabulary [0, " + std::to_string(V) + ")");

  if (segment_start) {
    if (state) fail("model", "document resets (segment_start) apply to fresh sequences only, not to decoding");
    check_segments(segment_start, B, T);
  }
  std::unique_ptr<DecodeState> fresh;
  if (!state) {
    fresh = std::make_unique<DecodeState>(c, be_, B, T);
    state = fresh.get();
  }
  if (first_seq < 0 || first_seq + B > state->batch)
    fail("model", "decode state holds " + std::to_string(state->batch) + " sequences but the input has " +
                      std::to_string(B) + " from sequence " + std::to_string(first_seq));
  std::vector<int64_t> pos0(state->pos.begin() + first_seq, state->pos.begin() + first_seq + B),
      positions(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b) {
    if (pos0[size_t(b)] + T > state->capacity)
      fail("model",
           "sequence " + std::to_string(first_seq + b) + " would reach " +
               std::to_string(pos0[size_t(b)] + T) + " tokens but the context holds " +
               std::to_string(state->capacity),
           "raise the context size (--ctx) or shorten the prompt");
    for (int64_t t = 0; t < T; ++t)
      positions[size_t(b * T + t)] = pos0[size_t(b)] + t - (segment_start ? segment_start[b * T + t] : 0);
  }

  Scratch s(be_);
  int32_t* d_ids = s.i(N);
  be_.from_host(d_ids, ids, N * 4);
  float* r = s.f(N * D);  // residual stream
  float* rho = s.f(N * R);  // previous block's router latent (trades buffers with a.rh after each block)
  BlockActivations a;     // reused by every block
  a.x1 = s.f(N * D); a.u = s.f(N * C); a.z = s.f(N * C); a.q = s.f(N * Dq); a.k = s.f(N * Dk);
  a.vcur = s.f(N * Dk / 2); a.vdel = s.f(N * Dk / 2); a.v = s.f(N * Dk); a.att = s.f(N * Dq);
  a.h_attn = s.f(N * D); a.x2 = s.f(N * D); a.rh = s.f(N * R); a.rn = s.f(N * R);
  a.f1 = a.g1 = s.f(N * R); a.f2 = a.g2 = s.f(N * R); a.probs = s.f(N * (E + 1)); a.expert = s.i(N);
  a.weight = s.f(N); a.h_moe = a.h_attn;

  be_.embedding(w_.embed, d_ids, r, N, D);
  be_.affine(r, w_.input_scale, w_.input_bias, N, D);

  for (int64_t l = 0; l < L; ++l) {
    const DecodeState::Layer& st = state->layers[size_t(l)];
    const int64_t S = state->capacity, kv = c.kv_dim(), P = c.conv_state_rows();
    BlockShape shape{B,
                     T,
                     pos0.data(),
                     positions.data(),
                     st.k + first_seq * S * kv,
                     st.v + first_seq * S * kv,
                     S,
                     st.conv + first_seq * P * C,
                     st.vdel + first_seq * (kv / 2),
                     segment_start};
    // Each block's last merge writes the next block's input norm into a.x1, the last block's
    // the final norm (of every position) that the head reads below.
    const NextNorm next{l == L - 1 ? w_.final_norm : w_.blocks[size_t(l + 1)].input_norm, a.x1};
    forward_block(be_, c, l, w_.blocks[size_t(l)], shape, r, rho, a, next, /*input_normed=*/l > 0);
    std::swap(rho, a.rh);  // this block's router latent is the next one's rho_prev; no copy
    if (out.experts) be_.to_host(out.experts + l * N, a.expert, N * 4);
    if (out.residuals) be_.to_host(out.residuals + l * N * D, r, N * D * 4);
    if (out.router_probs) be_.to_host(out.router_probs + l * N * (E + 1), a.probs, N * (E + 1) * 4);
  }

  for (int64_t b = 0; b < B; ++b) state->pos[size_t(first_seq + b)] += T;
  if (out.targets) {
    ZAYA_CHECK(out.loss_sum && out.loss_tokens, "ForwardOutputs.targets needs loss_sum and loss_tokens");
    const float* y = a.x1;  // the final norm
    int32_t* d_targets = s.i(N);
    be_.from_host(d_targets, out.targets, N * 4);
    if (out.row_loss_sums) {
      *out.loss_sum = 0;
      for (int64_t b = 0; b < B; ++b) {
        out.row_loss_sums[b] = be_.lm_head_loss(y + b * T * D, w_.lm_head, w_.lm_head_bias, d_targets + b * T,
                                                T, D, V, 0.0f, nullptr, nullptr, nullptr);
        *out.loss_sum += out.row_loss_sums[b];
      }
    } else {
      *out.loss_sum = be_.lm_head_loss(y, w_.lm_head, w_.lm_head_bias, d_targets, N, D, V, 0.0f, nullptr,
                                       nullptr, nullptr);
    }
    *out.loss_tokens = 0;
    for (int64_t n = 0; n < N; ++n) *out.loss_tokens += out.targets[n] >= 0;
  }
  if (!out.logits) return;

  // LM head over all positions, or each sequence's last one: its final norm moves to row b (from
  // row b*T + T - 1, never below b, so no row is overwritten before it is read).
  const int64_t rows = out.last_only ? B : N;
  float* x = a.x1;
  if (out.last_only && T > 1)
    for (int64_t b = 0; b < B; ++b) be_.copy(x + b * D, x + (b * T + T - 1) * D, D);
  float* logits = s.f(rows * V);
  be_.linear_fp32(x, w_.lm_head, w_.lm_head_bias, logits, rows, D, V);  // the LM head stays fp32 (spec A.11)
  be_.to_host(out.logits, logits, rows * V * 4);
}

}  // namespace zaya
