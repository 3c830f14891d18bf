// The CPU backend: OpenMP threads, CBLAS GEMMs (OpenBLAS by default), AVX2-friendly loops.
// Op implementations are split by family across ops_*.cpp.
#pragma once
#include "backend/backend.h"

namespace zaya {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  float* alloc(int64_t n) override;
  void free(void* p) override;

  void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N,
              bool accumulate, int64_t ldy) override;
  void embedding(const float* table, const int32_t* ids, float* out, int64_t N, int64_t D) override;
  void rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim) override;
  void affine(float* x, const float* scale, const float* bias, int64_t rows, int64_t dim) override;
  void residual_scale(float* r, const float* h, const float* hs, const float* hb, const float* rs,
                      const float* rb, int64_t rows, int64_t dim) override;
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
  void cross_entropy(const float* logits, const int32_t* target, float* loss, int64_t N, int64_t V) override;
  void copy(float* dst, const float* src, int64_t n) override;
  void fill(float* dst, float value, int64_t n) override;
  void to_host(void* host, const void* src, int64_t bytes) override;
  void from_host(void* dst, const void* host, int64_t bytes) override;
};

// Row-major GEMM helper shared by the CPU ops: C[M,N] = alpha * A[M,K] * op(B) + beta * C,
// where op(B) = B^T for B stored [N,K] (trans_b) or B for B stored [K,N].
void cpu_gemm(bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace zaya
