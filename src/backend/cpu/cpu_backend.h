// The CPU backend: OpenMP threads, CBLAS GEMMs (OpenBLAS by default), AVX2-friendly loops.
// Op implementations are split by family across ops_*.cpp.
#pragma once
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/rope_table.h"

namespace zaya {

class CpuBackend final : public Backend {
 public:
  CpuBackend();  // keeps large freed blocks in the heap for reuse (host_allocator.h)
  std::string name() const override { return "cpu"; }
  float* alloc(int64_t n) override;
  void free(void* p) override;

  void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N,
              bool accumulate, int64_t ldy) override;
  void embedding(const float* table, const int32_t* ids, float* out, int64_t N, int64_t D) override;
  void rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim) override;
  void affine(float* x, const float* scale, const float* bias, int64_t rows, int64_t dim) override;
  void residual_scale_rmsnorm(const ResidualNormArgs& a, float* r_out, float* y) override;
  void scaled_add(float* y, const float* x, const float* scale, int64_t rows, int64_t dim) override;
  void gelu(float* x, int64_t n) override;
  void softmax(float* x, int64_t rows, int64_t cols) override;
  void route_select(const float* probs, const float* bias, int32_t* expert, float* weight, int64_t N,
                    int64_t classes) override;
  void cca_conv(const CcaConvArgs& a) override;
  void cca_qk(const CcaQkArgs& a) override;
  void cca_values(const CcaValueArgs& a) override;
  void cache_write(const float* src, float* cache, const int64_t* pos0, int64_t B, int64_t T, int64_t S,
                   int64_t W) override;
  void attention(const AttentionArgs& a) override;
  void moe(const MoeArgs& a) override;
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t M,
                       int64_t K, int64_t N, bool accumulate_dx, int64_t lddy) override;
  void embedding_backward(const int32_t* ids, const float* dout, float* dtable, int64_t N, int64_t D) override;
  void rmsnorm_backward(const float* x, const float* w, const float* dy, float eps, float* dx, float* dw,
                        int64_t rows, int64_t dim, bool accumulate_dx) override;
  void affine_backward(const float* x, const float* scale, const float* bias, float* d, float* dscale, float* dbias,
                       int64_t rows, int64_t dim) override;
  void residual_scale_rmsnorm_backward(const ResidualNormArgs& a, const float* r_out, const float* dy, float* dr,
                                       float* dh, const ResidualNormGrads& g) override;
  void scaled_add_backward(const float* x, const float* scale, const float* dy, float* dx, float* dscale,
                           int64_t rows, int64_t dim) override;
  void gelu_backward(const float* x, float* d, int64_t n) override;
  void softmax_backward(const float* p, float* d, int64_t rows, int64_t cols) override;
  void route_backward(const int32_t* expert, const float* dweight, float* dprobs, int64_t N, int64_t classes) override;
  void cca_conv_backward(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw, float* db_dw, float* dw_grp,
                         float* db_grp) override;
  void cca_qk_backward(const CcaQkArgs& a, const float* dq, const float* dk, float* dz, float* du,
                       float* dtemp) override;
  void cca_values_backward(const float* dv, float* dv_cur, float* dv_del, int64_t B, int64_t T, int64_t half,
                           const int32_t* seg_start) override;
  void attention_backward(const AttentionArgs& a, const float* dout, float* dq, float* dk, float* dv) override;
  void moe_backward(const MoeArgs& a, const float* dout, float* dx, float* dweight, float* dgate_up,
                    float* ddown) override;
  double lm_head_loss(const float* y, const float* w, const float* bias, const int32_t* target, int64_t N, int64_t D,
                      int64_t V, float scale, float* dy, float* dw, float* dbias) override;
  void newton_schulz(float* x, int64_t rows, int64_t cols, int steps) override;
  void newton_schulz_batched(float* x, int64_t batch, int64_t rows, int64_t cols, int steps) override;
  void muon_momentum(float* m, const float* g, float* u, int64_t n, float mu, bool nesterov) override;
  void muon_update(float* w, const float* x, int64_t n, float lr, float scale, float wd) override;
  void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, float lr, float beta1, float beta2,
                    float eps, float wd, int64_t t) override;
  double sum_squares(const float* x, int64_t n) override;
  void scale_inplace(float* x, float s, int64_t n) override;
  void copy(float* dst, const float* src, int64_t n) override;
  void fill(float* dst, float value, int64_t n) override;
  void to_host(void* host, const void* src, int64_t bytes) override;
  void from_host(void* dst, const void* host, int64_t bytes) override;

  // The residual merge alone, r = (h + hb) * hs + (r + rb) * rs per row, and its backward
  // (dr: in d(r_new), out d(r), in place; dh overwritten; the parameter gradients accumulate).
  // Not Backend ops (the model runs every merge fused with its norm): the reference that the
  // fused op is tested against, with rmsnorm and rmsnorm_backward.
  void residual_scale(float* r, const float* h, const float* hs, const float* hb, const float* rs,
                      const float* rb, int64_t rows, int64_t dim);
  void residual_scale_backward(const float* r, const float* h, const float* hs, const float* hb, const float* rs,
                               const float* rb, float* dr, float* dh, float* dhs, float* dhb, float* drs, float* drb,
                               int64_t rows, int64_t dim);

 private:
  RopeTable rope_;  // cca_qk's rotary cosines and sines (one backend serves one thread at a time)
  // Packed documents (CcaConvArgs::seg_start), ops_cca_segments.cpp.
  void cca_conv_segmented(const CcaConvArgs& a);
  void cca_conv_backward_segmented(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw, float* db_dw,
                                   float* dw_grp, float* db_grp);
};

// Row-major GEMM helper shared by the CPU ops: C[M,N] = alpha * A[M,K] * op(B) + beta * C,
// where op(B) = B^T for B stored [N,K] (trans_b) or B for B stored [K,N].
void cpu_gemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
// C[M,N] = alpha * A^T * B + beta * C for A stored [K,M] and B stored [K,N] (weight gradients).
void cpu_gemm_tn(int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc);
// Runs body() on every thread of a new OpenMP team when `parallel`, else once on this thread with
// no OpenMP region around it; `omp for` loops inside body share out their iterations either way
// (alone on this thread without a team). Use it, never `#pragma omp parallel if (cond)`, around
// code that calls BLAS: a region made inactive by its if clause still nests what runs in it, and
// OpenBLAS, which only asks omp_in_parallel() (false there), then starts a nested team of its
// own, whose threads libgomp creates afresh on every call instead of reusing its pool (decode
// spent a quarter of its time creating threads).
void run_team(bool parallel, const std::function<void()>& body);

// The MoE routing plan: per-class row ranges offsets[e]..offsets[e+1] (class E = skip, last)
// of a stable permutation that groups tokens by their selected class.
struct MoePlan {
  std::vector<int64_t> offsets;  // [E + 2]
  std::vector<int64_t> perm;     // [N] token index of each grouped row
};
MoePlan plan_moe(const int32_t* expert, int64_t N, int64_t E);
// A unit of MoE work for one thread: rows [row0, row0 + rows) of one expert's grouped rows,
// or, for the weight gradients, rows [row0, row0 + rows) of one expert's gate_up ([2I, D]) or
// down ([D, I]) gradient. Splitting an expert's rows lets a team share an expert that took most
// of the tokens (an unbalanced router) instead of leaving the other threads idle.
struct MoeTile {
  int64_t expert = 0, row0 = 0, rows = 0;
  bool down = false;  // weight-gradient tiles: of ddown (else of dgate_up)
};
// Rows per MoE row tile: large enough for an efficient single-threaded GEMM, small enough that an
// expert holding most of the tokens still splits into several tiles. A constant, so that what
// each row computes does not depend on the thread count.
constexpr int64_t kMoeRowTile = 256;
// Row tiles of every expert's grouped rows (the skip class excluded), at most max_rows each.
std::vector<MoeTile> moe_row_tiles(const MoePlan& plan, int64_t E, int64_t max_rows);
// The most rows any of the tiles holds (0 for none): what a thread's scratch must hold.
int64_t moe_largest_tile(const std::vector<MoeTile>& tiles);

// Column sums: out[j] += sum_r f(r, j) for a row-major [rows, dim] expression, thread-safe.
void cpu_column_sums(int64_t rows, int64_t dim, float* out, const float* a, const float* b);

}  // namespace zaya
