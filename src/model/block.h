// One ZAYA block (CCA attention + router/MoE with residual scaling) over backend buffers.
// The same code serves inference (activation buffers reused across layers) and training
// (one BlockActivations per layer, kept for the backward pass).
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/chunk_segments.h"
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/weights.h"

namespace zaya {

// Backend buffers a block reads and writes. For inference, r_in/r_mid alias nothing
// (nullptr: not saved) and g1 == f1, g2 == f2 (GELU in place).
struct BlockActivations {
  float* r_in = nullptr;   // [N,D] residual entering the block (saved for training)
  float* x1 = nullptr;     // [N,D] input_layernorm output
  float* u = nullptr;      // [N,C] raw q‖k
  float* z = nullptr;      // [N,C] conv output
  float* q = nullptr;      // [N,Hq*dh]
  float* k = nullptr;      // [N,Hkv*dh]
  float* vcur = nullptr;   // [N,kv/2]
  float* vdel = nullptr;   // [N,kv/2]
  float* v = nullptr;      // [N,kv]
  float* att = nullptr;    // [N,Hq*dh] attention output (pre o_proj)
  float* h_attn = nullptr; // [N,D] o_proj output
  float* r_mid = nullptr;  // [N,D] residual after the attention merge (saved for training)
  float* x2 = nullptr;     // [N,D] post_attention_layernorm output
  float* rh = nullptr;     // [N,R] router latent after EDA (passed to the next block)
  float* rn = nullptr;     // [N,R] router RMSNorm output
  float* f1 = nullptr;     // [N,R] fc1 pre-activation
  float* g1 = nullptr;     // [N,R] GELU(f1)
  float* f2 = nullptr;     // [N,R] fc2 pre-activation
  float* g2 = nullptr;     // [N,R] GELU(f2)
  float* probs = nullptr;  // [N,E+1]
  int32_t* expert = nullptr;  // [N]
  float* weight = nullptr;    // [N]
  float* h_moe = nullptr;     // [N,D]
  // Context parallelism: [B, P*C + kv/2] per chunk row, the previous chunk's last P raw q‖k rows
  // and its last delayed value, as received (saved for the backward pass).
  float* halo = nullptr;
};

struct BlockShape {
  int64_t B, T;
  const int64_t* pos0;       // [B] host
  const int64_t* positions;  // [N] host
  float* k_cache;            // [B,S,kv]
  float* v_cache;
  int64_t S;
  float* conv_state;         // [B,P,C]
  float* vdel_state;         // [B,kv/2]
  const int32_t* seg_start = nullptr;  // [N] host, document starts (nullptr = no resets)
  // Context parallelism (training): the B rows are this rank's chunks, slot-major (B/2
  // sequences in slot 0, then in slot 1; pos0 = chunk starts), the caches are [B/2, S, kv]
  // buffers the whole gathered sequences are written to, and the conv and value states receive
  // the previous chunk's boundary rows. nullptr = ordinary sequences.
  ContextParallel* cp = nullptr;
  // Context parallelism with document resets: seg_start holds positions within the whole
  // sequence (the attention's keys), and these the chunk's restatements (chunk_segments.h).
  const ChunkSegments* chunk_segments = nullptr;
};

// Context parallelism: the conv's input with each sequence's P received rows in front.
// ext [B, P+T, C] takes, for sequence i, the P*C values at head + i*head_stride (zeros when head
// is null) and then its rows of chunk [B, T, C].
void stack_received_rows(Backend& be, const float* head, int64_t head_stride, const float* chunk, float* ext,
                         int64_t B, int64_t P, int64_t T, int64_t C);
// The chunk's rows of ext [B, P+T, C] (each sequence's last T) into chunk [B, T, C].
void take_chunk_rows(Backend& be, const float* ext, float* chunk, int64_t B, int64_t P, int64_t T, int64_t C);

// A residual merge with parameters p of h into r, fused with the RMSNorm (norm_weight) that
// reads the merged stream, and the gradients of both (g: the merge's, norm_weight: the norm's).
ResidualNormArgs residual_norm_args(const ResidualScaleWeights& p, const float* norm_weight, float eps,
                                    const float* r, const float* h, int64_t rows, int64_t dim);
ResidualNormGrads residual_norm_grads(const ResidualScaleWeights& g, float* norm_weight);

// The RMSNorm that reads a block's output stream: the next block's input norm or the final norm.
// The block's last residual merge runs fused with it (Backend::residual_scale_rmsnorm), and y
// receives the normed stream.
struct NextNorm {
  const float* weight = nullptr;
  float* y = nullptr;
};

// Runs block l: r (the residual stream, [N,D]) is updated in place. rho_prev is the previous
// block's router latent (ignored for l == 0). input_normed: a.x1 already holds the block's
// input norm of r (the previous block's NextNorm wrote it), so the block does not norm again.
void forward_block(Backend& be, const ModelConfig& c, int64_t l, const BlockWeights& w, const BlockShape& s,
                   float* r, const float* rho_prev, BlockActivations& a, const NextNorm& next,
                   bool input_normed);

}  // namespace zaya
