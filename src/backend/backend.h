// The backend seam: every op the model runs goes through this interface, so the model code
// never touches a vendor API. The CPU backend (backend/cpu) is the reference every other
// backend is tested against. Pointers are backend memory obtained from alloc().
// Layout conventions: row-major; activations [N, D] with N = B*T tokens; linear weights
// [out, in] as in PyTorch.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace zaya {

struct CcaConvArgs {
  const float* u = nullptr;      // [B, T, C] raw concat(q, k) of the chunk
  float* state = nullptr;        // [B, P, C] raw rows before the chunk (zeros at sequence start); updated
  const float* w_dw = nullptr;   // [C, 1, t0] depthwise conv weight
  const float* b_dw = nullptr;   // [C]
  const float* w_grp = nullptr;  // [C, group, t1] grouped conv weight (group = head_dim channels)
  const float* b_grp = nullptr;  // [C]
  float* z = nullptr;            // [B, T, C] output
  int64_t B = 0, T = 0, C = 0, t0 = 2, t1 = 2, group = 0;
  // Packed documents (reset_at_document_boundary): host [B*T], the index within its row of
  // each token's document start. Raw rows before it count as zeros, as at a sequence start.
  // nullptr = no resets. Only with fresh sequences (zero state).
  const int32_t* seg_start = nullptr;
};

// A residual-scaling merge (spec A.7) and the RMSNorm that reads the merged stream, as one op
// (the post-attention merge and the next sub-block's input norm; the last merge and the final
// norm). Per row: r_out = (h + hidden_bias) * hidden_scale + (r + residual_bias) * residual_scale,
// then y = norm_weight * r_out * rsqrt(mean(r_out^2) + eps). Every merge of the model is followed
// by such a norm, so the merge is an op only in this form (the CPU backend keeps the merge alone
// as the reference it is tested against).
struct ResidualNormArgs {
  const float* r = nullptr;               // [rows, dim] the residual stream before the merge
  const float* h = nullptr;               // [rows, dim] the sub-block's output
  const float* hidden_scale = nullptr;    // [dim]
  const float* hidden_bias = nullptr;     // [dim]
  const float* residual_scale = nullptr;  // [dim]
  const float* residual_bias = nullptr;   // [dim]
  const float* norm_weight = nullptr;     // [dim]
  float eps = 0;
  int64_t rows = 0, dim = 0;
};

// The parameter gradients of a ResidualNormArgs op, each [dim], accumulated into.
struct ResidualNormGrads {
  float* hidden_scale = nullptr;
  float* hidden_bias = nullptr;
  float* residual_scale = nullptr;
  float* residual_bias = nullptr;
  float* norm_weight = nullptr;
};

struct CcaQkArgs {
  const float* z = nullptr;          // [N, C] conv output
  const float* u = nullptr;          // [N, C] raw concat(q, k) (mean paths)
  const float* temp = nullptr;       // [Hkv] key temperature
  const int64_t* positions = nullptr;  // [N] absolute positions (host memory)
  float* q = nullptr;                // [N, Hq, dh] normalised, rotated queries
  float* k = nullptr;                // [N, Hkv, dh] normalised, tempered, rotated keys
  int64_t N = 0, Hq = 0, Hkv = 0, dh = 0, rotary_dim = 0;
  double theta = 1e4;
};

struct CcaValueArgs {
  const float* v_cur = nullptr;  // [B, T, half] Wv_cur x_t
  const float* v_del = nullptr;  // [B, T, half] Wv_del x_t
  float* v_state = nullptr;      // [B, half] Wv_del x of the token before the chunk (zeros at start); updated
  float* v = nullptr;            // [B, T, 2*half] concat(v_cur[t], v_del[t-1])
  int64_t B = 0, T = 0, half = 0;
  // Document resets: [B*T] host, each token's document start relative to the chunk's first
  // token (negative: it began in an earlier chunk); the delayed half is zero at a token t > 0
  // whose start is t. A document that begins at t = 0 takes v_state, which the caller zeroes
  // (context-parallel chunks; fresh sequences have a zero state). nullptr = no resets.
  const int32_t* seg_start = nullptr;
};

struct AttentionArgs {
  const float* q = nullptr;        // [B, T, Hq, dh]
  const float* k_cache = nullptr;  // [B, S, Hkv, dh] keys of positions 0..pos0[b]+T-1
  const float* v_cache = nullptr;  // [B, S, Hkv, dh]
  float* out = nullptr;            // [B, T, Hq, dh]
  const int64_t* pos0 = nullptr;   // [B] absolute position of the chunk's first token (host)
  int64_t B = 0, T = 0, S = 0, Hq = 0, Hkv = 0, dh = 0;
  int64_t window = 0;  // > 0: key s visible from query t only if t - s < window
  float scale = 1.0f;
  // Document resets: key s visible from query t only if s >= seg_start[b*T + t], a key
  // position (with pos0 = 0 the query's own row index of its document start; for a
  // context-parallel chunk a position within the gathered sequence). nullptr = no resets.
  const int32_t* seg_start = nullptr;
};

// Fails (naming the backend, the op and the sequence) unless every sequence's queries fit the
// cache: 0 <= pos0[b] and pos0[b] + T <= S, as every attention kernel reads keys up to
// pos0[b] + T - 1. Each backend's attention and attention_backward call it first.
void check_attention_rows(const AttentionArgs& a, const std::string& backend, const char* op);

struct MoeArgs {
  const float* x = nullptr;        // [N, D] MoE input (post-norm)
  const int32_t* expert = nullptr; // [N] selected class, E = skip
  const float* weight = nullptr;   // [N] unbiased probability of the selected class
  const float* gate_up = nullptr;  // [E, 2I, D]
  const float* down = nullptr;     // [E, D, I]
  float* out = nullptr;            // [N, D]
  int64_t N = 0, D = 0, I = 0, E = 0;
  bool skip_identity = false;      // skip class outputs weight*x (else 0)
};

// One weight matrix of Backend::linear_many and where its output goes: y[M, N] = x W[N, K]^T
// with row stride ldy (0 = N).
struct LinearOutput {
  const float* w = nullptr;
  float* y = nullptr;
  int64_t N = 0;
  int64_t ldy = 0;
};

// Throws zaya::Error("backend", ...) for an optional op a backend does not implement.
[[noreturn]] void backend_op_missing(const std::string& backend, const char* op);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Memory (elements of float / int32). Contents are uninitialised.
  virtual float* alloc(int64_t n) = 0;
  virtual void free(void* p) = 0;

  // y[M,N] = x[M,K] W[N,K]^T (+ bias[N]); accumulate adds into y. ldy: row stride of y (0 = N).
  virtual void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K,
                      int64_t N, bool accumulate = false, int64_t ldy = 0) = 0;
  // linear with fp32 operands on every backend, whatever its matmul precision: the router
  // (down projection and MLP), whose argmax flips on near-ties (spec A.11; Megatron keeps its
  // router in fp32 too). Backends whose linear is fp32 already need not override it.
  virtual void linear_fp32(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K,
                           int64_t N, bool accumulate = false, int64_t ldy = 0) {
    linear(x, w, bias, y, M, K, N, accumulate, ldy);
  }
  // Several linears of the same input x[M, K] (linear's precision, no bias, no accumulation):
  // the attention's input projections. The default runs linear() for each; a backend may run
  // them as one (the GPU's decode does).
  virtual void linear_many(const float* x, int64_t M, int64_t K, const LinearOutput* outs, int count) {
    for (int i = 0; i < count; ++i) linear(x, outs[i].w, nullptr, outs[i].y, M, K, outs[i].N, false, outs[i].ldy);
  }
  // linear_fp32, then the exact GELU: pre[M, N] = x W^T + bias, y = gelu(pre). pre may be y (the
  // activation in place); otherwise pre keeps the sums (training's backward reads them). The
  // router MLP's layers. The default runs the three ops; a backend may fuse them.
  virtual void linear_fp32_gelu(const float* x, const float* w, const float* bias, float* pre, float* y, int64_t M,
                                int64_t K, int64_t N) {
    linear_fp32(x, w, bias, pre, M, K, N);
    if (y != pre) copy(y, pre, M * N);
    gelu(y, M * N);
  }
  // out[n,:] = table[ids[n],:]
  virtual void embedding(const float* table, const int32_t* ids, float* out, int64_t N, int64_t D) = 0;
  // y = w * x * rsqrt(mean(x^2) + eps) per row
  virtual void rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim) = 0;
  // x = (x + bias) * scale per row
  virtual void affine(float* x, const float* scale, const float* bias, int64_t rows, int64_t dim) = 0;
  // The residual merge (ZAYA residual scaling) and the norm in one pass over the rows (ResidualNormArgs): r_out (which may be
  // a.r, in place) receives the merged stream and y its RMSNorm.
  virtual void residual_scale_rmsnorm(const ResidualNormArgs& a, float* r_out, float* y) = 0;
  // y += scale (broadcast per column) * x
  virtual void scaled_add(float* y, const float* x, const float* scale, int64_t rows, int64_t dim) = 0;
  // scaled_add, then rmsnorm of the sum: y += scale * x; out = w * y * rsqrt(mean(y^2) + eps) per
  // row. The router's depth-averaged latent and its norm. The default runs the two ops; a
  // backend may fuse them.
  virtual void scaled_add_rmsnorm(float* y, const float* x, const float* scale, const float* w, float eps, float* out,
                                  int64_t rows, int64_t dim) {
    scaled_add(y, x, scale, rows, dim);
    rmsnorm(y, w, eps, out, rows, dim);
  }
  virtual void gelu(float* x, int64_t n) = 0;                        // exact erf GELU, in place
  virtual void softmax(float* x, int64_t rows, int64_t cols) = 0;    // in place
  // expert[n] = argmax(p[n,:] + bias); weight[n] = p[n, expert[n]]
  virtual void route_select(const float* probs, const float* bias, int32_t* expert, float* weight, int64_t N,
                            int64_t classes) = 0;
  // The router's last two steps as one op, which a backend may fuse: softmax over each row of
  // `logits` in place (they become the probabilities), then route_select over them.
  virtual void route(float* logits, const float* bias, int32_t* expert, float* weight, int64_t N, int64_t classes) {
    softmax(logits, N, classes);
    route_select(logits, bias, expert, weight, N, classes);
  }

  virtual void cca_conv(const CcaConvArgs& a) = 0;
  virtual void cca_qk(const CcaQkArgs& a) = 0;
  virtual void cca_values(const CcaValueArgs& a) = 0;
  // Writes rows src[B, T, W] into cache[B, S, W] at positions pos0[b] + t.
  virtual void cache_write(const float* src, float* cache, const int64_t* pos0, int64_t B, int64_t T, int64_t S,
                           int64_t W) = 0;
  // cache_write of the keys k into k_cache and the values v into v_cache (same shapes), which a
  // backend may do as one op. The default makes the two calls.
  virtual void cache_write_kv(const float* k, const float* v, float* k_cache, float* v_cache, const int64_t* pos0,
                              int64_t B, int64_t T, int64_t S, int64_t W) {
    cache_write(k, k_cache, pos0, B, T, S, W);
    cache_write(v, v_cache, pos0, B, T, S, W);
  }
  virtual void attention(const AttentionArgs& a) = 0;
  virtual void moe(const MoeArgs& a) = 0;

  // ---- Backward (training). Activations are those the forward saw; fresh sequences (pos0 =
  // 0, zero conv/value state), except where an op says otherwise (attention_backward takes
  // context-parallel chunks; the model runs a chunk's conv over [received rows; chunk] from a
  // zero state). "accumulate" outputs are added to, others overwritten.
  // dx[M,K] (+)= dy W; dw[N,K] += dy^T x; db[N] += colsum(dy). dx/dw/db may be null.
  // lddy: row stride of dy (0 = N).
  virtual void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                               int64_t M, int64_t K, int64_t N, bool accumulate_dx, int64_t lddy = 0) = 0;
  // The backward of linear_fp32 (fp32 operands on every backend).
  virtual void linear_fp32_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                                    int64_t M, int64_t K, int64_t N, bool accumulate_dx, int64_t lddy = 0) {
    linear_backward(x, w, dy, dx, dw, db, M, K, N, accumulate_dx, lddy);
  }
  // dtable[ids[n]] += dout[n]
  virtual void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t D) = 0;
  // y = w * x * rsqrt(mean(x^2)+eps): dx (+)= ..., dw += ...
  virtual void rmsnorm_backward(const float* x, const float* w, const float* dy, float eps, float* dx, float* dw,
                                int64_t rows, int64_t dim, bool accumulate_dx) = 0;
  // out = (x + bias) * scale. d: in d(out), out d(x) (in place); dscale/dbias accumulate.
  virtual void affine_backward(const float* x, const float* scale, const float* bias, float* d, float* dscale,
                               float* dbias, int64_t rows, int64_t dim) = 0;
  // The backward of residual_scale_rmsnorm: r_out is the merged stream the forward wrote, dy =
  // d(y). dr: in, d(r_out) from the stream's other readers; out, d(a.r). dh = d(a.h)
  // (overwritten). The parameter gradients in g accumulate. No two of a.r, a.h, r_out, dy, dr, dh
  // and the gradients may overlap.
  virtual void residual_scale_rmsnorm_backward(const ResidualNormArgs& a, const float* r_out, const float* dy,
                                               float* dr, float* dh, const ResidualNormGrads& g) = 0;
  // y += scale * x: dx += dy * scale; dscale += colsum(dy * x)
  virtual void scaled_add_backward(const float* x, const float* scale, const float* dy, float* dx, float* dscale,
                                   int64_t rows, int64_t dim) = 0;
  // d: in d(gelu(x)), out d(x) (in place), x = pre-activation
  virtual void gelu_backward(const float* x, float* d, int64_t n) = 0;
  // p = softmax(s): d in d(p), out d(s) (in place)
  virtual void softmax_backward(const float* p, float* d, int64_t rows, int64_t cols) = 0;
  // dprobs = 0 except dprobs[n, expert[n]] = dweight[n]
  virtual void route_backward(const int32_t* expert, const float* dweight, float* dprobs, int64_t N,
                              int64_t classes) = 0;
  // From dz: du, conv weight/bias grads (all accumulate). a.state must be zeros.
  virtual void cca_conv_backward(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw, float* db_dw,
                                 float* dw_grp, float* db_grp) = 0;
  // From dq, dk: dz (overwritten), du (accumulated: mean paths), dtemp (accumulate).
  virtual void cca_qk_backward(const CcaQkArgs& a, const float* dq, const float* dk, float* dz, float* du,
                               float* dtemp) = 0;
  // From dv: dv_cur, dv_del (overwritten). seg_start as in CcaValueArgs (nullptr = none).
  virtual void cca_values_backward(const float* dv, float* dv_cur, float* dv_del, int64_t B, int64_t T,
                                   int64_t half, const int32_t* seg_start) = 0;
  // From dout: dq, dk, dv (overwritten; dk/dv laid out like the caches, all S rows). Training
  // uses pos0 = 0, S = T; a context-parallel chunk has its queries at pos0[b] + t over the whole
  // gathered sequence (S >= pos0[b] + T; seg_start then holds key positions). A backend that supports
  // only pos0 = 0, S = T fails clearly otherwise.
  virtual void attention_backward(const AttentionArgs& a, const float* dout, float* dq, float* dk, float* dv) = 0;
  // From dout: dx (accumulate), dweight (overwritten), dgate_up/ddown (accumulate).
  virtual void moe_backward(const MoeArgs& a, const float* dout, float* dx, float* dweight, float* dgate_up,
                            float* ddown) = 0;
  // LM head fused with cross-entropy, in row chunks so [N, V] logits never exist at once.
  // Returns the sum of losses over rows with target >= 0; dy (overwritten), dw/dbias (accumulate)
  // receive the gradient of (scale * sum of losses). dy == nullptr: the loss only (evaluation;
  // dw and dbias are ignored).
  virtual double lm_head_loss(const float* y, const float* w, const float* bias, const int32_t* target, int64_t N,
                              int64_t D, int64_t V, float scale, float* dy, float* dw, float* dbias) = 0;

  // ---- Optimizer math (training). In place on backend memory; n elements, row-major.
  // Not pure: a backend without them fails with a clear error when the optimizer runs.
  // Muon orthogonalisation of one [rows, cols] matrix, in place (spec C.4):
  //   X = x / (||x||_F + 1e-7); X = X^T if rows > cols; `steps` times
  //   A = X X^T; B = b A + c A A; X = a X + B X   with (a, b, c) = (3.4445, -4.7750, 2.0315);
  //   transposed back. A zero matrix stays zero. Workspace is the backend's own.
  virtual void newton_schulz(float* /*x*/, int64_t /*rows*/, int64_t /*cols*/, int /*steps*/) {
    backend_op_missing(name(), "newton_schulz");
  }
  // newton_schulz of `batch` same-shape matrices stored one after another ([batch, rows, cols]),
  // each with its own norm: a tensor's experts in one call. Default: one call per matrix.
  virtual void newton_schulz_batched(float* x, int64_t batch, int64_t rows, int64_t cols, int steps) {
    for (int64_t i = 0; i < batch; ++i) newton_schulz(x + i * rows * cols, rows, cols, steps);
  }
  // Whether the optimizer batches the same-shape matrices of different tensors (every layer's
  // q_proj, say) into one newton_schulz_batched call. A GPU gains from fewer, larger launches.
  // The CPU's Newton-Schulz already runs its GEMMs near the machine's peak, and one tensor per
  // call keeps its results independent of which tensors are stepped together (step_range).
  virtual bool newton_schulz_across_tensors() const { return false; }
  // Muon momentum: m = mu * m + g; u = nesterov ? g + mu * m : m (u is NS's input).
  virtual void muon_momentum(float* /*m*/, const float* /*g*/, float* /*u*/, int64_t /*n*/, float /*mu*/,
                             bool /*nesterov*/) {
    backend_op_missing(name(), "muon_momentum");
  }
  // Muon parameter update with decoupled weight decay on the weight before the step:
  //   w = w - lr * (scale * x + wd * w)     (x = NS output, scale = 0.2 * sqrt(max(rows, cols)))
  virtual void muon_update(float* /*w*/, const float* /*x*/, int64_t /*n*/, float /*lr*/, float /*scale*/,
                           float /*wd*/) {
    backend_op_missing(name(), "muon_update");
  }
  // AdamW, bias-corrected with the tensor's step count t >= 1 (spec C.5):
  //   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  //   w = w - lr * ((m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * w)
  virtual void adamw_update(float* /*w*/, const float* /*g*/, float* /*m*/, float* /*v*/, int64_t /*n*/,
                            float /*lr*/, float /*beta1*/, float /*beta2*/, float /*eps*/, float /*wd*/,
                            int64_t /*t*/) {
    backend_op_missing(name(), "adamw_update");
  }
  // Sum of squares of x[0..n) accumulated in double (gradient-norm clipping).
  virtual double sum_squares(const float* /*x*/, int64_t /*n*/) { backend_op_missing(name(), "sum_squares"); }
  // x *= s in place.
  virtual void scale_inplace(float* /*x*/, float /*s*/, int64_t /*n*/) { backend_op_missing(name(), "scale_inplace"); }

  virtual void copy(float* dst, const float* src, int64_t n) = 0;
  virtual void fill(float* dst, float value, int64_t n) = 0;
  // The measured peak rate (GFLOP/s) of this backend's matmuls in the precision its ops use,
  // the denominator of MFU. 0 = not measured by the backend (the CPU: the trainer times sgemm).
  virtual double matmul_peak_gflops() { return 0; }
  // The most device memory this backend has held at once (bytes; 0 = host memory, not tracked).
  virtual int64_t peak_memory_bytes() const { return 0; }
  // One line of backend-specific counters for benchmarks ("" = none).
  virtual std::string diagnostics() const { return ""; }
  // Inference (generate, score): from set_weights_frozen(true) until set_weights_frozen(false),
  // the weights passed to the ops (linear's w, the MoE's experts) do not change, so a backend
  // may keep converted copies of them instead of converting at every call (the GPU keeps bf16
  // shadows). Unfreeze before changing weights (the GPU backend also drops the copies of any
  // weights that its own writes touch: from_host, copy, fill, scale_inplace, the optimizer
  // updates). Default: nothing kept.
  virtual void set_weights_frozen(bool frozen) { (void)frozen; }
  // Host <-> backend transfers (no-ops beyond memcpy on the CPU).
  virtual void to_host(void* host, const void* src, int64_t bytes) = 0;
  virtual void from_host(void* dst, const void* host, int64_t bytes) = 0;
};

// The CPU backend (OpenMP + CBLAS + AVX2 kernels).
std::unique_ptr<Backend> make_cpu_backend();
// Backend by name on GPU `device` (ignored by the CPU): "cpu"; in a GPU build also "cuda" (bf16
// GEMMs, the precision policy) and "cuda-fp32" (every GEMM fp32, for exact comparisons).
// Throws a clear error for an unknown one.
std::unique_ptr<Backend> make_backend(const std::string& name, int device = 0);

// A GPU backend linked from outside zaya_lib: the host emulation of the GPU (tests/simt), whose
// test programs register it so that make_backend("cuda" / "cuda-fp32") reaches it, and with it
// the trainer, in a build without CUDA. A CUDA or HIP build has its own backend and ignores it.
using GpuBackendMaker = std::function<std::unique_ptr<Backend>(const std::string& name, int device)>;
void register_gpu_backend(GpuBackendMaker maker);

}  // namespace zaya
