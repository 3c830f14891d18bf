// The ZAYA model: config, parameter arena with typed views, initialisation, and the forward
// pass (spec A.4–A.8) over a batch of independent sequences, optionally continuing from a
// DecodeState (chunked prefill, then token-by-token decode). Every op goes through Backend.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/config.h"
#include "model/context_parallel.h"
#include "model/params.h"
#include "model/weights.h"

namespace zaya {

// Per-sequence inference state for every layer (spec F.1): KV cache, the conv state (last
// P raw q‖k rows) and the delayed-value state (Wv_del x of the previous token).
class DecodeState {
 public:
  DecodeState(const ModelConfig& c, Backend& be, int64_t batch, int64_t capacity);
  ~DecodeState();
  DecodeState(const DecodeState&) = delete;
  DecodeState& operator=(const DecodeState&) = delete;
  void reset();  // all sequences back to position 0 with zero state
  void reset_sequence(int64_t seq);  // one sequence back to position 0 with zero state
  // Makes sequence to_seq here a copy of sequence from_seq of `from` (its pos tokens of keys
  // and values, its conv and delayed-value states and its position). `from` may be this state
  // (moving a sequence within the batch) or another one of the same model, of any batch and
  // capacity: a prompt prefilled alone joins a decoding batch this way.
  void copy_sequence(const DecodeState& from, int64_t from_seq, int64_t to_seq);
  // Bytes a state of this shape holds on its backend.
  static int64_t bytes(const ModelConfig& c, int64_t batch, int64_t capacity);

  struct Layer {
    float* k = nullptr;     // [B, S, Hkv, dh]
    float* v = nullptr;     // [B, S, Hkv, dh]
    float* conv = nullptr;  // [B, P, C]
    float* vdel = nullptr;  // [B, Hkv*dh/2]
  };
  int64_t batch, capacity;
  std::vector<int64_t> pos;  // tokens already consumed, per sequence
  std::vector<Layer> layers;

 private:
  Backend& be_;
  int64_t kv_, conv_n_, vdel_n_;
  void release();  // frees every layer's buffers
};

struct ForwardOutputs {
  float* logits = nullptr;     // host [B, T, V] (or [B, V] with last_only); nullptr = skip the head
  bool last_only = false;      // only the last position's logits
  int32_t* experts = nullptr;  // host [L, B, T] selected router class (E = skip)
  float* residuals = nullptr;  // host [L, B, T, D] residual stream after each block (debugging)
  float* router_probs = nullptr;  // host [L, B, T, E+1]
  // Loss only (evaluation, scoring): with targets (host [B, T], -1 = not counted) the LM head
  // runs fused with the cross-entropy on the backend, so no [B, T, V] logits leave it; loss_sum
  // receives the sum of next-token losses over counted targets, loss_tokens their number.
  const int32_t* targets = nullptr;
  double* loss_sum = nullptr;
  int64_t* loss_tokens = nullptr;
  // Optional with targets: host [B], each row's own sum (scoring several sequences at once;
  // right-padding a row with uncounted targets leaves its sum unchanged, the model being causal).
  double* row_loss_sums = nullptr;
};

// Throws a clear error unless segment_start[B*T] is a valid per-row document-start table
// (see Model::forward; data/loader.h document_segments builds one).
void check_segments(const int32_t* segment_start, int64_t B, int64_t T);

// What one training forward/backward saw: loss sum over counted targets and, per layer, how
// many tokens chose each router class (int64; class E = skip).
struct StepStats {
  double loss_sum = 0;
  int64_t tokens = 0;
  std::vector<int64_t> expert_counts;  // [L][E+1]
};

class Model {
 public:
  Model(const ModelConfig& c, Backend& be);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ParamLayout& layout() const { return layout_; }
  Backend& backend() { return be_; }
  float* params() { return arena_; }
  const ModelWeights& weights() const { return w_; }

  // Context extension (a training phase's rope_theta): the RoPE base of full-attention and
  // sliding-window layers.
  void set_rope_theta(double full, double sliding) {
    cfg_.rope_hybrid.theta = full;
    cfg_.rope_sliding.theta = sliding;
  }

  // Spec C.5 initialisation (temp = 1, balancing biases 0 / -1 for skip). Deterministic.
  void init_random(uint64_t seed);

  // ids: host [B, T]. state == nullptr runs fresh sequences starting at position 0; otherwise
  // the batch continues the state's sequences first_seq .. first_seq + B - 1 (within
  // state->batch), each from its own position, and the others are left as they are: a server
  // prefills new prompts in some sequences of its batch while others decode.
  // segment_start (reset_at_document_boundary, spec decision 7): host [B, T], the index within
  // its row of each token's document start; each document then runs as its own fresh sequence
  // (CCA conv, delayed value, attention and RoPE positions restart). Fresh sequences only.
  void forward(const int32_t* ids, int64_t B, int64_t T, DecodeState* state, const ForwardOutputs& out,
               const int32_t* segment_start = nullptr, int64_t first_seq = 0);

  // Activation recomputation (off by default): forward_backward then keeps, per block, only the
  // stream entering it, its input norm, its router latent and its routing (2D + R floats and one
  // int per token), and runs each block's forward again just before its backward into one set of
  // the other buffers (4D + 2C + 2Dq + 3Dk + 5R + E + 2 floats per token) that every block
  // shares. The gradients, loss and routing are the same (bitwise on the CPU and in the GPU's host
  // emulation); the forward's matmuls run twice.
  void set_activation_recompute(bool on) { recompute_ = on; }
  bool activation_recompute() const { return recompute_; }

  // Training step on fresh sequences: forward with saved activations, then the hand-written
  // backward. targets: host [B, T], -1 = not counted. Adds d(loss_scale * sum of token
  // losses)/d(param) into grads (backend memory with layout().total floats; the balancing
  // biases get none). Returns the loss sum and the routing statistics.
  // block_done(l), when set, is called as soon as block l's parameter gradients are final
  // (blocks finish from the last to the first; data parallelism starts reductions there).
  // cp (context parallelism, model/context_parallel.h): ids and targets are this rank's chunk
  // rows, [B = 2 x sequences, T = chunk length] (ContextParallel::split); the other ranks of the
  // group must make the same call on their chunks. segment_start there holds each token's
  // document start as a position within the whole sequence (the split of the loader's table;
  // model/chunk_segments.h).
  StepStats forward_backward(const int32_t* ids, const int32_t* targets, int64_t B, int64_t T, float* grads,
                             float loss_scale, const int32_t* segment_start = nullptr,
                             const std::function<void(int64_t block)>& block_done = {},
                             ContextParallel* cp = nullptr);

 private:
  ModelConfig cfg_;
  ParamLayout layout_;
  Backend& be_;
  float* arena_ = nullptr;
  ModelWeights w_;
  bool recompute_ = false;
};

}  // namespace zaya
