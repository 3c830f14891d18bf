// The GPU backend class (CUDA or HIP through gpu_runtime.h). One stream; every op is enqueued
// on it, so buffers returned to the caching pool can be reused by later ops without waits.
// to_host synchronises. Host-memory arguments of the interface (positions, pos0, seg_start)
// are uploaded per call (positions and pos0 only when their bytes differ from a recent call's:
// upload_reused). Op implementations are split by family across ops_*.cu, mirroring
// backend/cpu. Checked against the CPU backend on an H100; what changed after that run is
// listed in docs/gpu.md, "Not done yet".
#pragma once

#include <initializer_list>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_factory.h"
#include "backend/cuda/gpu_device.h"
#include "backend/cuda/gpu_gemm.h"
#include "backend/cuda/staging_ring.h"

namespace zaya {

class CudaBackend;
struct GemvOutput;  // gpu_gemv.h

// A device buffer from the backend's pool, returned to it when the object goes out of scope.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(CudaBackend* be, int64_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : be_(o.be_), p_(o.p_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  float* f() const { return static_cast<float*>(p_); }
  double* d() const { return static_cast<double*>(p_); }
  int32_t* i() const { return static_cast<int32_t*>(p_); }
  int64_t* l() const { return static_cast<int64_t*>(p_); }
  bf16_t* h() const { return static_cast<bf16_t*>(p_); }

 private:
  CudaBackend* be_ = nullptr;
  void* p_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  float* alloc(int64_t n) override;
  void free(void* p) override;

  void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N,
              bool accumulate, int64_t ldy) override;
  void linear_many(const float* x, int64_t M, int64_t K, const LinearOutput* outs, int count) override;
  void linear_fp32_gelu(const float* x, const float* w, const float* bias, float* pre, float* y, int64_t M,
                        int64_t K, int64_t N) override;
  void embedding(const float* table, const int32_t* ids, float* out, int64_t N, int64_t D) override;
  void rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim) override;
  void affine(float* x, const float* scale, const float* bias, int64_t rows, int64_t dim) override;
  void residual_scale_rmsnorm(const ResidualNormArgs& a, float* r_out, float* y) override;
  void scaled_add(float* y, const float* x, const float* scale, int64_t rows, int64_t dim) override;
  void scaled_add_rmsnorm(float* y, const float* x, const float* scale, const float* w, float eps, float* out,
                          int64_t rows, int64_t dim) override;
  void gelu(float* x, int64_t n) override;
  void softmax(float* x, int64_t rows, int64_t cols) override;
  void route_select(const float* probs, const float* bias, int32_t* expert, float* weight, int64_t N,
                    int64_t classes) override;
  void route(float* logits, const float* bias, int32_t* expert, float* weight, int64_t N, int64_t classes) override;
  void cca_conv(const CcaConvArgs& a) override;
  void cca_qk(const CcaQkArgs& a) override;
  void cca_values(const CcaValueArgs& a) override;
  void cache_write(const float* src, float* cache, const int64_t* pos0, int64_t B, int64_t T, int64_t S,
                   int64_t W) override;
  void cache_write_kv(const float* k, const float* v, float* k_cache, float* v_cache, const int64_t* pos0, int64_t B,
                      int64_t T, int64_t S, int64_t W) override;
  void attention(const AttentionArgs& a) override;
  void moe(const MoeArgs& a) override;
  void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db, int64_t M,
                       int64_t K, int64_t N, bool accumulate_dx, int64_t lddy) override;
  void linear_fp32(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N,
                   bool accumulate, int64_t ldy) override {
    linear_impl(x, w, bias, y, M, K, N, accumulate, ldy, /*bf16=*/false);
  }
  void linear_fp32_backward(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                            int64_t M, int64_t K, int64_t N, bool accumulate_dx, int64_t lddy) override {
    linear_backward_impl(x, w, dy, dx, dw, db, M, K, N, accumulate_dx, lddy, /*bf16=*/false);
  }
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
  bool newton_schulz_across_tensors() const override { return true; }
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
  double matmul_peak_gflops() override;  // gpu_peak.cu
  int64_t peak_memory_bytes() const override { return peak_reserved_bytes_; }
  std::string diagnostics() const override;  // cuda_backend.cu: GEMM engine, plans built, their host time
  void set_weights_frozen(bool frozen) override;

  // ---- internals shared by the ops_*.cu files ----
  gpuStream_t stream() const { return stream_; }
  void* pool_get(int64_t bytes);
  void pool_put(void* p);
  // Copies a small host array to a fresh device buffer (safe to reuse the host array at once):
  // through the pinned staging ring when it fits a chunk (an asynchronous copy in stream order,
  // no wait), else from the caller's memory (on HIP followed by a wait for the GPU). from_host
  // copies the same way.
  DeviceBuffer upload(const void* host, int64_t bytes);
  // The same for a small array that recurs from call to call (token positions, cache offsets):
  // a device copy of these exact bytes is kept and handed out again while the same bytes come
  // back, so a decode step uploads its positions once rather than once a layer. The device copy is read-only for the kernels
  // and stays valid until kUploadCacheSlots other contents have been asked for since; `holder`
  // receives a plain upload of arrays over kUploadCacheMaxBytes.
  const void* upload_reused(const void* host, int64_t bytes, DeviceBuffer& holder);
  void synchronize();
  // A GEMM operand for a row-major [rows, cols] fp32 matrix (row stride ld): the matrix itself,
  // or (bf16 = true) a packed bf16 copy made in `holder`.
  GemmOperand operand(const float* p, int64_t rows, int64_t cols, int64_t ld, bool trans, bool bf16,
                      DeviceBuffer& holder);
  // The same for a packed weight matrix [rows, cols]: while the weights are frozen, its bf16
  // copy is made once and kept (a bf16 shadow), so decode does not convert every weight at
  // every step.
  GemmOperand weight_operand(const float* w, int64_t rows, int64_t cols, bool trans, bool bf16, DeviceBuffer& holder);
  void gemm(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B, float beta,
            float* C, int64_t ldc, const GemmBatch& batch = {}, GemmCompute compute = GemmCompute::Exact,
            GemmShape shape = GemmShape::Fixed) {
    gemm_->run(M, N, K, alpha, A, B, beta, C, ldc, batch, compute, shape);
  }
  // D = alpha op(A) op(B) + beta * C_in with C_in and D distinct, same layout: GpuGemm::run_into.
  void gemm_into(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B, float beta,
                 const float* C_in, float* D, int64_t ldc, const GemmBatch& batch = {},
                 GemmCompute compute = GemmCompute::Exact) {
    gemm_->run_into(M, N, K, alpha, A, B, beta, C_in, D, ldc, batch, compute);
  }
  // The same with bf16 C_in and D (GpuGemm::run_bf16_out; C_in may equal D, or be null when
  // beta is 0). Where the engine cannot (the tiled kernel, or no BLASLt algorithm), it widens
  // C_in, runs the fp32 GEMM and rounds the result to bf16: the same arithmetic up to
  // summation order. That way needs contiguous outputs (ldc == N, stride_c == M * N).
  void gemm_bf16_out(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                     float beta, const bf16_t* C_in, bf16_t* D, int64_t ldc, const GemmBatch& batch = {});
  // GEMMs gemm_bf16_out ran the fp32 way (expected 0 on a BLASLt engine).
  int64_t bf16_out_fallbacks() const { return bf16_out_fallbacks_; }
  // A single GEMM, then C[m, n] += bias[n] (bias may be null): the BLASLt bias epilogue.
  void gemm_bias(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B, float beta,
                 float* C, int64_t ldc, const float* bias, GemmCompute compute = GemmCompute::Exact) {
    gemm_->run_bias(M, N, K, alpha, A, B, beta, C, ldc, bias, compute);
  }
  // A GEMM whose M or K (shape: RaggedM or RaggedK) is a routed token count (the MoE's
  // experts): see GemmShape.
  void gemm_ragged(GemmShape shape, int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A,
                   const GemmOperand& B, float beta, float* C, int64_t ldc) {
    gemm_->run(M, N, K, alpha, A, B, beta, C, ldc, {}, GemmCompute::Exact, shape);
  }
  const GpuGemm& gemm_engine() const { return *gemm_; }
  // Whether lm_head_loss runs its GEMMs as 3xTF32 (ops_lm_head.cu): asked for, under the bf16
  // policy, on cuBLASLt (the tiled kernel has no TF32 path, and HIP has no TF32: exact fp32).
  bool lm_head_tf32x3() const;
  bool bf16_matmul() const { return options_.bf16_matmul; }
  bool moe_device_grouped() const { return options_.moe_device_grouped; }
  bool moe_few_rows_gemv() const { return options_.moe_few_rows_gemv; }
  // Whether Newton-Schulz takes bf16 GEMM operands (asked for, under the bf16 policy), and
  // whether its iterates are bf16 as well (asked for, with bf16 operands).
  bool newton_schulz_bf16() const { return options_.newton_schulz_bf16 && options_.bf16_matmul; }
  bool newton_schulz_bf16_iterates() const { return newton_schulz_bf16() && options_.newton_schulz_bf16_iterates; }
  // Whether the grouped GEMMs take their bf16 WMMA path (CUDA, sm_80 and newer, not asked for the
  // portable kernels; decided once at start).
  bool wmma() const { return wmma_; }
  int warp_size() const { return warp_size_; }  // the device's
  // Whether the mma.sync kernels (the flash attention, the pipelined grouped GEMMs) may run:
  // wmma() holds, one of them is asked for, and the start-up check of their primitives found them
  // agreeing with plain products on this device (check_mma_primitives).
  bool mma_sync() const { return mma_sync_ok_; }
  // gpu_mma_check.cu: the primitives of gpu_mma.h on this device against plain products of
  // inputs drawn from `seed`; one line per primitive that disagrees (none in builds without them).
  std::vector<std::string> check_mma_primitives(uint64_t seed);
  // linear / linear_backward with an explicit operand precision (the LM head stays fp32).
  void linear_impl(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N,
                   bool accumulate, int64_t ldy, bool bf16);
  void linear_backward_impl(const float* x, const float* w, const float* dy, float* dx, float* dw, float* db,
                            int64_t M, int64_t K, int64_t N, bool accumulate_dx, int64_t lddy, bool bf16);
  // Attention through the GEMM engine (ops_attention_gemm.cu), for chunks of at least
  // kAttnGemmMinQueries queries; shorter ones (decode) use the flash kernels.
  static constexpr int64_t kAttnGemmMinQueries = 64;
  void attention_gemm(const AttentionArgs& a);
  // The tensor-core flash attention (ops_attention_flash_tc.cu, ops_attention_flash_tc_backward.cu):
  // whether it is on (asked for, bf16 policy, CUDA sm_80+, mma_sync()) and whether it serves `a`
  // (head_dim 64 or 128, every tensor 16-byte aligned, and the shared memory of the forward and
  // backward kernels within the device's per-block limit; `more` names the backward's extra
  // tensors).
  bool attention_flash_tc_enabled() const;
  bool attention_flash_tc_applies(const AttentionArgs& a, std::initializer_list<const void*> more = {}) const;
  void attention_flash_tc(const AttentionArgs& a);
  void attention_backward_flash_tc(const AttentionArgs& a, const float* dout, float* dq, float* dk, float* dv);
  void attention_backward_gemm(const AttentionArgs& a, const float* dout, float* dq, float* dk, float* dv);
  // Whether a linear of M rows runs as the few-rows GEMV (gpu_gemv.h): asked for, and M at most
  // kLinearGemvMaxRows.
  bool linear_as_gemv(int64_t M) const;
  // o.w and o.ldw for weight matrix w [N, K]: its bf16 copy (made in holder, or the frozen
  // weights' shadow) when bf16, else w itself.
  void gemv_weights(const float* w, int64_t N, int64_t K, bool bf16, DeviceBuffer& holder, GemvOutput& o);
  void cca_conv_rows(const CcaConvArgs& a);  // ops_cca.cu: no segments
  void cca_conv_backward_rows(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw, float* db_dw,
                              float* dw_grp, float* db_grp);

 private:
  CudaBackendOptions options_;
  int warp_size_ = 32;  // the device's (checked equal to the kernels' GPU_WARP_SIZE)
  bool wmma_ = false;   // see wmma()
  void check_mma_sync_at_start();       // sets mma_sync_ok_ and mma_check_ (cuda_backend.cu)
  bool mma_sync_ok_ = false;            // see mma_sync()
  std::string mma_check_ = "not checked (no kernel that uses them asked for, or none here)";  // diagnostics()
  int64_t max_shared_per_block_ = 0;  // the device's opt-in shared memory per block (CUDA)
  int64_t multiprocessors_ = 0;       // the device's (sizes the attention forward's key splits)
  double peak_gflops_ = 0;  // matmul_peak_gflops(), measured once
  // upload_reused's copies, least recently used first to go.
  static constexpr int kUploadCacheSlots = 4;
  static constexpr int64_t kUploadCacheMaxBytes = 64 << 10;
  struct ReusedUpload {
    std::vector<unsigned char> bytes;  // the host bytes the device copy holds
    DeviceBuffer device;
    uint64_t last_used = 0;
  };
  std::vector<ReusedUpload> upload_cache_;
  uint64_t upload_clock_ = 0;
  int64_t uploads_reused_ = 0, uploads_cached_ = 0;  // hits, misses (diagnostics)
  // upload's pinned staging ring (staging_ring.h; CudaBackendOptions::upload_staging_*): the
  // buffer (null: uploads copy from pageable memory), each chunk's event (recorded when the ring
  // leaves the chunk), and counts for the diagnostics.
  StagingRing staging_;
  unsigned char* staging_buffer_ = nullptr;
  std::vector<gpuEvent_t> staging_events_;
  int64_t uploads_staged_ = 0, staging_waits_ = 0;
  void start_upload_staging();
  void* stage_upload(const void* host, int64_t bytes);  // the pinned copy of host's bytes
  // upload's and from_host's copy: through the staging ring when it fits a chunk, else from the
  // caller's memory (on HIP followed by a wait for the GPU).
  void copy_to_device(void* dst, const void* host, int64_t bytes);
  int64_t reserved_bytes_ = 0, peak_reserved_bytes_ = 0;  // device memory held by the pool
  gpuStream_t stream_ = nullptr;
  std::unique_ptr<GpuGemm> gemm_;
  int64_t bf16_out_fallbacks_ = 0;
  std::unordered_map<void*, int64_t> live_;  // pool block -> its size in bytes
  // bf16 copies of frozen weight matrices, by the weights' address (set_weights_frozen).
  struct WeightShadow {
    DeviceBuffer bf16;
    int64_t rows = 0, cols = 0;
  };
  bool weights_frozen_ = false;
  // By the weights' address, with the addresses also kept in order (shadow_keys_) so that the
  // shadows of a freed block are found by range. (A std::map of WeightShadow would do both, but
  // crashes Debian's clang 15 in HIP device compilation.)
  std::unordered_map<uintptr_t, WeightShadow> shadows_;
  std::set<uintptr_t> shadow_keys_;
  int64_t shadows_built_ = 0;
  int64_t shadow_bytes_ = 0;      // bytes of the shadows held
  int64_t shadow_budget_ = 0;     // the most shadow_bytes_ may reach (set when frozen)
  int64_t shadows_declined_ = 0;  // shadows not built because the budget was reached
  void forget_shadow(const WeightShadow& sh) { shadow_bytes_ -= sh.rows * sh.cols * 2; }
  // Drops the shadows of every weight matrix overlapping [p, p + bytes): a block going back to
  // the pool, or memory about to be written (from_host, copy, fill, scale_inplace and the
  // optimizer updates), so a stale bf16 copy never serves even if weights change while frozen.
  void drop_shadows_over(const void* p, int64_t bytes);
  std::multimap<int64_t, void*> free_;       // reusable blocks by size
  void release_free_blocks();
  // The device could not give `bytes` more even with the pool's free blocks released: a clear
  // error with the sizes and what to lower.
  [[noreturn]] void fail_out_of_memory(int64_t bytes);
};

// ---- launch helpers shared by the ops files (gpu_common.cu) ----
// out[j] += sum_r a[r*lda + j] * (b ? b[r*dim + j] + (c ? c[j] : 0) : 1) * (v ? v[j] : 1) * (rv ? rv[r] : 1)
// summed in double, in a fixed order (deterministic).
void gpu_column_sums(CudaBackend& be, int64_t rows, int64_t dim, float* out, const float* a, int64_t lda,
                     const float* b, const float* c, const float* v, const float* rv);
// gpu_column_sums in two halves, for kernels that sum several columns' products at once: rows
// in `chunks` chunks of rows_per_chunk (the last may be short), each chunk's partial sums
// part[k*dim + j] in double, then gpu_column_finish adds them to out[j] in chunk order.
struct GpuColumnChunks {
  int64_t rows_per_chunk, chunks;
};
GpuColumnChunks gpu_column_chunks(int64_t rows);
void gpu_column_finish(CudaBackend& be, int64_t dim, int64_t chunks, const double* part, float* out);
// dst[r*cols + j] = bf16(src[r*ld + j]).
void gpu_to_bf16(gpuStream_t s, const float* src, int64_t rows, int64_t cols, int64_t ld, bf16_t* dst);
// dst[i] = float(src[i]) for i < n.
void gpu_from_bf16(gpuStream_t s, const bf16_t* src, int64_t n, float* dst);
void gpu_fill(gpuStream_t s, float* dst, float value, int64_t n);
// Sum of squares of x[0..n) in double, left on the device in *out (deterministic).
void gpu_sum_squares(CudaBackend& be, const float* x, int64_t n, double* out);

}  // namespace zaya
