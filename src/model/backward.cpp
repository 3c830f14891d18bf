// The training step: forward over fresh sequences keeping every block's activations (or, with
// activation recomputation, only each block's inputs, its forward run again just before its
// backward), the LM head fused with cross-entropy, then the backward pass through every block in
// reverse (residual scaling, MoE, router MLP, EDA chain, CCA) down to the embedding.
// Hand-written against the Backend's backward ops; no autograd.
#include <cmath>
#include <cstring>
#include <optional>

#include "core/error.h"
#include "model/block.h"
#include "model/chunk_segments.h"
#include "model/model.h"
#include "model/scratch.h"

namespace zaya {

StepStats Model::forward_backward(const int32_t* ids, const int32_t* targets, int64_t B, int64_t T, float* grads,
                                  float loss_scale, const int32_t* seg_start,
                                  const std::function<void(int64_t)>& block_done, ContextParallel* cp) {
  const ModelConfig& c = cfg_;
  const int64_t N = B * T, D = c.hidden_size, C = c.conv_channels(), Dq = c.q_dim(), Dk = c.kv_dim(),
                R = c.router_hidden_size, E = c.num_experts, V = c.vocab_size, L = c.num_hidden_layers,
                P = c.conv_state_rows();
  const float eps = float(c.rms_norm_eps);
  // Context parallelism: the B rows are this rank's chunks (2 per sequence) of sequences of
  // length S; otherwise S = T.
  const int64_t S = cp ? T * 2 * cp->size() : T, Wb = P * C + Dk / 2;
  if (cp) {
    if (B % 2 != 0) fail("train", "context parallel rows come in pairs (two chunks per sequence)");
    if (T < P)
      fail("train", "context parallel chunks of " + std::to_string(T) + " tokens are shorter than the " +
                        std::to_string(P) + " rows the CCA convolution carries",
           "use longer sequences or a smaller parallel.context_parallel");
  }
  if (S > c.max_position_embeddings)
    fail("train", "sequence length " + std::to_string(S) + " exceeds max_position_embeddings " +
                      std::to_string(c.max_position_embeddings));
  for (int64_t n = 0; n < N; ++n) {
    if (ids[n] < 0 || ids[n] >= V) fail("train", "token id " + std::to_string(ids[n]) + " is outside the vocabulary");
    if (targets[n] >= V) fail("train", "target id " + std::to_string(targets[n]) + " is outside the vocabulary");
  }
  ModelWeights g = bind_weights(c, layout_, grads);
  Scratch s(be_);
  int32_t* d_ids = s.i(N);
  int32_t* d_targets = s.i(N);
  be_.from_host(d_ids, ids, N * 4);
  be_.from_host(d_targets, targets, N * 4);
  std::vector<int64_t> pos0(static_cast<size_t>(B), 0), positions(static_cast<size_t>(N));
  if (cp)
    for (int64_t b = 0; b < B; ++b) pos0[size_t(b)] = cp->chunk_of_row(b, B / 2) * T;
  // Document resets: per-row tables, or with context parallelism positions within the whole
  // sequences, restated for the chunk (chunk_segments.h).
  std::optional<ChunkSegments> chunk_seg;
  if (seg_start && cp)
    chunk_seg = chunk_segments(seg_start, pos0.data(), B, T, P);
  else if (seg_start)
    check_segments(seg_start, B, T);
  for (int64_t n = 0; n < N; ++n) positions[size_t(n)] = pos0[size_t(n / T)] + n % T - (seg_start ? seg_start[n] : 0);

  // ---- forward, keeping activations (with recompute_, only each block's inputs) ----
  float* emb = s.f(N * D);
  float* r = s.f(N * D);
  be_.embedding(w_.embed, d_ids, emb, N, D);
  be_.copy(r, emb, N * D);
  be_.affine(r, w_.input_scale, w_.input_bias, N, D);
  std::vector<BlockActivations> acts(static_cast<size_t>(L));
  std::vector<std::pair<float*, float*>> kv_full(static_cast<size_t>(L));  // context parallel K, V
  float* conv_state = s.f(B * P * C);
  float* vdel_state = s.f(B * Dk / 2);
  // The buffers a block's forward writes and its backward reads, other than the ones every block
  // keeps for the next one or for recomputation (r_in, x1, rh, expert). With recompute_ all
  // blocks share one set, which each block's forward overwrites and its backward's rerun refills.
  const auto allocate_work = [&](BlockActivations& a, std::pair<float*, float*>& kv) {
    a.u = s.f(N * C); a.z = s.f(N * C); a.q = s.f(N * Dq); a.k = s.f(N * Dk); a.vcur = s.f(N * Dk / 2);
    a.vdel = s.f(N * Dk / 2); a.v = s.f(N * Dk); a.att = s.f(N * Dq); a.h_attn = s.f(N * D); a.r_mid = s.f(N * D);
    a.x2 = s.f(N * D); a.rn = s.f(N * R); a.f1 = s.f(N * R); a.g1 = s.f(N * R); a.f2 = s.f(N * R);
    a.g2 = s.f(N * R); a.probs = s.f(N * (E + 1)); a.weight = s.f(N); a.h_moe = s.f(N * D);
    if (cp) {  // the caches hold each chunk's whole gathered sequence
      a.halo = s.f(B * Wb);
      kv = {s.f(B / 2 * S * Dk), s.f(B / 2 * S * Dk)};
    }
  };
  BlockActivations shared;
  std::pair<float*, float*> shared_kv{nullptr, nullptr};
  if (recompute_) allocate_work(shared, shared_kv);
  // Every block's activations first: each block's last residual merge writes the next block's
  // input norm (x1), and the last block's the final norm's output y.
  for (int64_t l = 0; l < L; ++l) {
    BlockActivations& a = acts[size_t(l)];
    if (recompute_) {
      a = shared;
      kv_full[size_t(l)] = shared_kv;
    } else {
      allocate_work(a, kv_full[size_t(l)]);
    }
    a.r_in = s.f(N * D); a.x1 = s.f(N * D); a.rh = s.f(N * R); a.expert = s.i(N);
  }
  const auto shape_of = [&](int64_t l) {
    BlockShape shape{B, T, pos0.data(), positions.data(), acts[size_t(l)].k, acts[size_t(l)].v, T, conv_state,
                     vdel_state, seg_start};
    if (cp) {
      shape.k_cache = kv_full[size_t(l)].first;
      shape.v_cache = kv_full[size_t(l)].second;
      shape.S = S;
      shape.cp = cp;
      if (chunk_seg) shape.chunk_segments = &*chunk_seg;
    }
    return shape;
  };
  float* y = s.f(N * D);  // the final norm's output
  for (int64_t l = 0; l < L; ++l) {
    be_.fill(conv_state, 0.0f, B * P * C);
    be_.fill(vdel_state, 0.0f, B * Dk / 2);
    const bool last = l == L - 1;
    const NextNorm next{last ? w_.final_norm : w_.blocks[size_t(l + 1)].input_norm,
                        last ? y : acts[size_t(l + 1)].x1};
    forward_block(be_, c, l, w_.blocks[size_t(l)], shape_of(l), r, l > 0 ? acts[size_t(l - 1)].rh : nullptr,
                  acts[size_t(l)], next, /*input_normed=*/l > 0);
  }

  StepStats stats;
  stats.expert_counts.assign(static_cast<size_t>(L * (E + 1)), 0);
  std::vector<int32_t> host_experts(static_cast<size_t>(N));
  for (int64_t l = 0; l < L; ++l) {
    be_.to_host(host_experts.data(), acts[size_t(l)].expert, N * 4);
    for (int32_t e : host_experts) stats.expert_counts[size_t(l * (E + 1) + e)]++;
  }
  for (int64_t n = 0; n < N; ++n) stats.tokens += targets[n] >= 0;

  // ---- head + loss (y: the last block's merge wrote the final norm) ----
  float* dy = s.f(N * D);
  stats.loss_sum = be_.lm_head_loss(y, w_.lm_head, w_.lm_head_bias, d_targets, N, D, V, loss_scale, dy, g.lm_head,
                                    g.lm_head_bias);
  // d(residual stream): the final norm's gradient is added by the last block's fused merge.
  float* dr = s.f(N * D);
  be_.fill(dr, 0.0f, N * D);

  // ---- backward through the blocks ----
  float* dh = s.f(N * D);
  float* dx = s.f(N * D);
  float* dweight = s.f(N);
  float* dprobs = s.f(N * (E + 1));
  float* dga = s.f(N * R);
  float* dgb = s.f(N * R);
  float* drh = s.f(N * R);       // d(router latent) of the current block, incl. the next block's EDA
  float* drho_prev = s.f(N * R);
  float* datt = s.f(N * Dq);
  float* dq = s.f(N * Dq);
  float* dk = s.f(N * Dk);
  float* dv = s.f(N * Dk);
  float* dvcur = s.f(N * Dk / 2);
  float* dvdel = s.f(N * Dk / 2);
  float* dz = s.f(N * C);
  float* du = s.f(N * C);
  // Context parallelism: whole-sequence K/V gradients, the conv's input with the received rows
  // in front, and the boundary gradients passed back (cp_ones: the unit scale of an add).
  float *dk_full = nullptr, *dv_full = nullptr, *u_ext = nullptr, *dz_ext = nullptr, *du_ext = nullptr,
        *head_grads = nullptr, *tail_grads = nullptr, *cp_ones = nullptr;
  if (cp) {
    dk_full = s.f(B * S * Dk);
    dv_full = s.f(B * S * Dk);
    u_ext = s.f(B * (P + T) * C);
    dz_ext = s.f(B * (P + T) * C);
    du_ext = s.f(B * (P + T) * C);
    head_grads = s.f(B * Wb);
    tail_grads = s.f(B * Wb);
    cp_ones = s.f(Wb);
    be_.fill(cp_ones, 1.0f, Wb);
  }
  be_.fill(drh, 0.0f, N * R);
  for (int64_t l = L - 1; l >= 0; --l) {
    const BlockActivations& a = acts[size_t(l)];
    const BlockWeights& w = w_.blocks[size_t(l)];
    const BlockWeights& gw = g.blocks[size_t(l)];
    const bool last = l == L - 1;
    const float* next_norm = last ? w_.final_norm : w_.blocks[size_t(l + 1)].input_norm;
    if (recompute_) {
      // Block l's forward again, from its kept stream and input norm, into the shared buffers
      // (rewriting its kept router latent and routing with the same values). The stream runs
      // in y, free since the head's backward; the next norm it writes lands in dh, which the
      // merge backward below overwrites.
      be_.fill(conv_state, 0.0f, B * P * C);
      be_.fill(vdel_state, 0.0f, B * Dk / 2);
      be_.copy(y, a.r_in, N * D);
      BlockActivations again = a;
      again.r_in = nullptr;  // kept already
      forward_block(be_, c, l, w, shape_of(l), y, l > 0 ? acts[size_t(l - 1)].rh : nullptr, again,
                    NextNorm{next_norm, dh}, /*input_normed=*/true);
    }
    // post-MoE residual merge, fused with the norm that read the merged stream: the final norm
    // (its gradient dy from the head), or the next block's input norm (its gradient d(x1), in
    // dx since that block's backward), whose block is then done.
    const ResidualScaleWeights& pm = w.post_mlp_scale;
    const ResidualScaleWeights& gpm = gw.post_mlp_scale;
    float* next_norm_grad = last ? g.final_norm : g.blocks[size_t(l + 1)].input_norm;
    be_.residual_scale_rmsnorm_backward(residual_norm_args(pm, next_norm, eps, a.r_mid, a.h_moe, N, D),
                                        last ? r : acts[size_t(l + 1)].r_in, last ? dy : dx, dr, dh,
                                        residual_norm_grads(gpm, next_norm_grad));
    if (!last && block_done) block_done(l + 1);
    // experts (and the skip class)
    MoeArgs ma;
    ma.x = a.x2; ma.expert = a.expert; ma.weight = a.weight; ma.gate_up = w.experts.gate_up; ma.down = w.experts.down;
    ma.out = a.h_moe; ma.N = N; ma.D = D; ma.I = c.moe_intermediate_size; ma.E = E;
    ma.skip_identity = c.skip_expert_output == SkipMode::Identity;
    be_.fill(dx, 0.0f, N * D);
    be_.moe_backward(ma, dh, dx, dweight, gw.experts.gate_up, gw.experts.down);
    // router: the weight is the unbiased probability of the selected class
    const RouterWeights& rw = w.router;
    const RouterWeights& grw = gw.router;
    be_.route_backward(a.expert, dweight, dprobs, N, E + 1);
    be_.softmax_backward(a.probs, dprobs, N, E + 1);
    be_.linear_fp32_backward(a.g2, rw.out_w, dprobs, dga, grw.out_w, nullptr, N, R, E + 1, false);
    be_.gelu_backward(a.f2, dga, N * R);
    be_.linear_fp32_backward(a.g1, rw.fc2_w, dga, dgb, grw.fc2_w, grw.fc2_b, N, R, R, false);
    be_.gelu_backward(a.f1, dgb, N * R);
    be_.linear_fp32_backward(a.rn, rw.fc1_w, dgb, dga, grw.fc1_w, grw.fc1_b, N, R, R, false);
    be_.rmsnorm_backward(a.rh, rw.norm, dga, eps, drh, grw.norm, N, R, /*accumulate_dx=*/true);
    if (l > 0) {
      be_.fill(drho_prev, 0.0f, N * R);
      be_.scaled_add_backward(acts[size_t(l - 1)].rh, rw.eda_scale, drh, drho_prev, grw.eda_scale, N, R);
    }
    be_.linear_fp32_backward(a.x2, rw.down_w, drh, dx, grw.down_w, grw.down_b, N, D, R, /*accumulate_dx=*/true);
    // post-attention residual merge and the norm that read it (dx = d(x2))
    be_.residual_scale_rmsnorm_backward(
        residual_norm_args(w.post_attn_scale, w.post_attn_norm, eps, a.r_in, a.h_attn, N, D), a.r_mid, dx, dr, dh,
        residual_norm_grads(gw.post_attn_scale, gw.post_attn_norm));
    // CCA
    be_.linear_backward(a.att, w.attn.o_proj, dh, datt, gw.attn.o_proj, nullptr, N, Dq, D, false);
    AttentionArgs aa;
    aa.q = a.q; aa.k_cache = a.k; aa.v_cache = a.v; aa.out = a.att; aa.pos0 = pos0.data();
    aa.B = B; aa.T = T; aa.S = T; aa.Hq = c.num_attention_heads; aa.Hkv = c.num_key_value_heads; aa.dh = c.head_dim;
    aa.window = c.is_sliding(l) ? c.sliding_window : 0;
    aa.scale = 1.0f / std::sqrt(float(c.head_dim));
    aa.seg_start = seg_start;
    if (cp) {  // per slot, over the one copy of the sequences (as the forward)
      const int64_t Bs = B / 2;
      aa.k_cache = kv_full[size_t(l)].first;
      aa.v_cache = kv_full[size_t(l)].second;
      aa.S = S;
      aa.B = Bs;
      for (int64_t slot = 0; slot < 2; ++slot) {
        const int64_t q_off = slot * Bs * T * Dq;
        aa.q = a.q + q_off;
        aa.out = a.att + q_off;
        aa.pos0 = pos0.data() + slot * Bs;
        if (seg_start) aa.seg_start = seg_start + slot * Bs * T;
        be_.attention_backward(aa, datt + q_off, dq + q_off, dk_full + slot * Bs * S * Dk, dv_full + slot * Bs * S * Dk);
      }
      cp->reduce_scatter(dk_full, dk, B / 2, T, Dk);  // each key's gradient from every chunk's queries
      cp->reduce_scatter(dv_full, dv, B / 2, T, Dk);
    } else {
      be_.attention_backward(aa, datt, dq, dk, dv);
    }
    be_.cca_values_backward(dv, dvcur, dvdel, B, T, Dk / 2,
                            chunk_seg ? chunk_seg->relative.data() : seg_start);
    CcaQkArgs qa;
    qa.z = a.z; qa.u = a.u; qa.temp = w.attn.temp; qa.positions = positions.data(); qa.q = a.q; qa.k = a.k;
    qa.N = N; qa.Hq = c.num_attention_heads; qa.Hkv = c.num_key_value_heads; qa.dh = c.head_dim;
    qa.rotary_dim = c.rotary_dim(l); qa.theta = c.rope(l).theta;
    be_.fill(du, 0.0f, N * C);
    be_.cca_qk_backward(qa, dq, dk, dz, du, gw.attn.temp);
    CcaConvArgs ca;
    ca.u = a.u; ca.state = nullptr; ca.w_dw = w.attn.conv_dw_w; ca.b_dw = w.attn.conv_dw_b;
    ca.w_grp = w.attn.conv_grp_w; ca.b_grp = w.attn.conv_grp_b; ca.z = a.z;
    ca.B = B; ca.T = T; ca.C = C; ca.t0 = c.cca_time0; ca.t1 = c.cca_time1; ca.group = c.head_dim;
    ca.seg_start = seg_start;
    if (cp) {
      // The conv over [received rows; chunk] from a zero state equals the chunk's conv from the
      // received state; the received rows' outputs get no gradient, and their inputs' gradients
      // (with the delayed value's, the delayed half of dv at each chunk's first token) go back to
      // the previous chunk, whose last rows they are.
      stack_received_rows(be_, a.halo, Wb, a.u, u_ext, B, P, T, C);
      stack_received_rows(be_, nullptr, 0, dz, dz_ext, B, P, T, C);
      stack_received_rows(be_, nullptr, 0, du, du_ext, B, P, T, C);
      ca.u = u_ext; ca.T = P + T;
      ca.seg_start = chunk_seg && chunk_seg->conv_has_starts ? chunk_seg->extended.data() : nullptr;
      be_.cca_conv_backward(ca, dz_ext, du_ext, gw.attn.conv_dw_w, gw.attn.conv_dw_b, gw.attn.conv_grp_w,
                            gw.attn.conv_grp_b);
      take_chunk_rows(be_, du_ext, du, B, P, T, C);
      for (int64_t i = 0; i < B; ++i) {
        be_.copy(head_grads + i * Wb, du_ext + i * (P + T) * C, P * C);
        if (chunk_seg && chunk_seg->starts_at_chunk[size_t(i)])  // its first token had no delayed value
          be_.fill(head_grads + i * Wb + P * C, 0.0f, Dk / 2);
        else
          be_.copy(head_grads + i * Wb + P * C, dv + i * T * Dk + Dk / 2, Dk / 2);
      }
      be_.fill(tail_grads, 0.0f, B * Wb);
      cp->pass_backward(head_grads, tail_grads, B / 2, Wb);
      for (int64_t i = 0; i < B; ++i) {
        be_.scaled_add(du + (i * T + T - P) * C, tail_grads + i * Wb, cp_ones, 1, P * C);
        be_.scaled_add(dvdel + (i * T + T - 1) * (Dk / 2), tail_grads + i * Wb + P * C, cp_ones, 1, Dk / 2);
      }
    } else {
      be_.cca_conv_backward(ca, dz, du, gw.attn.conv_dw_w, gw.attn.conv_dw_b, gw.attn.conv_grp_w, gw.attn.conv_grp_b);
    }
    be_.linear_backward(a.x1, w.attn.v_current, dvcur, dx, gw.attn.v_current, nullptr, N, D, Dk / 2, false);
    be_.linear_backward(a.x1, w.attn.v_delayed, dvdel, dx, gw.attn.v_delayed, nullptr, N, D, Dk / 2, true);
    be_.linear_backward(a.x1, w.attn.q_proj, du, dx, gw.attn.q_proj, nullptr, N, D, Dq, true, C);
    be_.linear_backward(a.x1, w.attn.k_proj, du + Dq, dx, gw.attn.k_proj, nullptr, N, D, Dk, true, C);
    // dx = d(x1): the previous block's fused merge takes it; the first block's input norm
    // reads the embedding's stream and runs alone.
    std::swap(drh, drho_prev);
    if (l == 0) {
      be_.rmsnorm_backward(a.r_in, w.input_norm, dx, eps, dr, gw.input_norm, N, D, true);
      if (block_done) block_done(0);
    }
  }
  // input affine and embedding
  be_.affine_backward(emb, w_.input_scale, w_.input_bias, dr, g.input_scale, g.input_bias, N, D);
  be_.embedding_backward(d_ids, dr, g.embed, N, D);
  return stats;
}

}  // namespace zaya
