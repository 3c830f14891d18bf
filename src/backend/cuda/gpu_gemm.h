// The GPU backend's one internal GEMM: row-major C[M,N] = alpha * op(A) op(B) + beta * C
// (+ a bias on every row) with fp32 or bf16 operands, fp32 accumulation and an fp32 C (or, on
// a BLASLt engine, a bf16 C: run_bf16_out). cuBLASLt on CUDA, hipBLASLt on HIP
// when found (ZAYA_HAVE_HIPBLASLT), otherwise (or when asked, `portable`) our own tiled kernel.
// beta == 0 never reads C (outputs may hold NaN poison).
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "backend/cuda/gpu_runtime.h"

namespace zaya {

enum class GemmType { F32, BF16 };

// One operand as stored: row-major with row stride ld (elements).
//   A: op(A) is [M,K]; stored [M,K] (trans = false) or [K,M] (trans = true).
//   B: op(B) is [K,N]; stored [K,N] (trans = false) or [N,K] (trans = true).
struct GemmOperand {
  const void* ptr = nullptr;
  GemmType type = GemmType::F32;
  int64_t ld = 0;
  bool trans = false;
};

// An fp32 operand as stored, row stride ld.
inline GemmOperand f32_operand(const float* p, int64_t ld, bool trans) {
  GemmOperand o;
  o.ptr = p;
  o.type = GemmType::F32;
  o.ld = ld;
  o.trans = trans;
  return o;
}

// A packed bf16 operand (raw 16-bit storage, gpu_device.h's bf16_t) as stored, row stride ld.
inline GemmOperand bf16_operand(const uint16_t* p, int64_t ld, bool trans) {
  GemmOperand o;
  o.ptr = p;
  o.type = GemmType::BF16;
  o.ld = ld;
  o.trans = trans;
  return o;
}

// A strided batch of same-shape GEMMs: problem i uses A + i*stride_a, B + i*stride_b and
// C + i*stride_c (elements of each operand's type). count = 1 is a single GEMM.
struct GemmBatch {
  int64_t count = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// How fp32 operands are multiplied: exactly (fp32 FMA), or on the tensor cores in TF32 (10-bit
// mantissa, fp32 accumulation; about 8x the fp32 rate on Hopper). bf16 operands ignore it. The
// tiled kernel is always exact.
enum class GemmCompute { Exact, Tf32 };

// How a GEMM's shape behaves from call to call. Fixed: the same shape recurs (dense layers,
// attention chunks), so its BLASLt plan is built for that exact shape. RaggedM / RaggedK: M or
// K is a token count that changes with the routing (the MoE's per-expert GEMMs: M for the
// products over an expert's rows, K for its weight gradients); one plan serves every value of
// that dimension up to the next power of two, built for that bound, so the BLASLt heuristic is
// not queried again at every step. The other dimensions stay exact.
enum class GemmShape { Fixed, RaggedM, RaggedK };

// The smallest power of two >= x (and >= 16): the bound a ragged dimension's plan is built for.
int64_t ragged_bound(int64_t x);

// The portable tiled kernel (gpu_gemm_tiled.cu), usable on any target.
void gemm_tiled(gpuStream_t stream, int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A,
                const GemmOperand& B, float beta, float* C, int64_t ldc);

class GpuGemm {
 public:
  GpuGemm(gpuStream_t stream, bool portable);
  ~GpuGemm();
  GpuGemm(const GpuGemm&) = delete;
  GpuGemm& operator=(const GpuGemm&) = delete;

  // A and B must have the same type.
  void run(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B, float beta,
           float* C, int64_t ldc, const GemmBatch& batch = {}, GemmCompute compute = GemmCompute::Exact,
           GemmShape shape = GemmShape::Fixed);
  // The same single GEMM, then C[m, n] += bias[n]: through the BLASLt bias epilogue when bias
  // is 16-byte aligned (no pass over C of its own), else a row-bias kernel after the GEMM.
  void run_bias(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B, float beta,
                float* C, int64_t ldc, const float* bias, GemmCompute compute = GemmCompute::Exact);
  // D = alpha op(A) op(B) + beta * C_in, where C_in and D are distinct fp32 matrices of the
  // same layout (ldc, batch.stride_c): the library reads one and writes the other, so that a
  // caller that must keep C_in (Newton-Schulz's iterates) needs no copy of its own. The tiled
  // kernel copies C_in to D first.
  void run_into(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B, float beta,
                const float* C_in, float* D, int64_t ldc, const GemmBatch& batch = {},
                GemmCompute compute = GemmCompute::Exact);
  // D = alpha op(A) op(B) + beta * C_in with bf16 C_in and D (raw bf16 storage): fp32
  // accumulation and scaling, D rounded to bf16 once. C_in may equal D, and is not read when
  // beta is 0 (nullptr allowed). BLASLt only: returns false, having done nothing, when there is
  // no BLASLt engine, K is 0 or the library has no algorithm for the problem, and the caller
  // then computes it another way.
  bool run_bf16_out(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                    float beta, const uint16_t* C_in, uint16_t* D, int64_t ldc, const GemmBatch& batch = {});
  // "cublaslt", "hipblaslt" or "tiled".
  const char* engine() const;
  // Plans built so far (cache misses) and the host seconds spent building them (descriptors and
  // the BLASLt heuristic query): the cost of shapes that change from call to call.
  int64_t plans_built() const { return plans_built_; }
  double plan_seconds() const { return plan_seconds_; }
  // Ragged calls whose bound's algorithm the library refused for the actual shape, so that an
  // exact plan was built instead (expected 0).
  int64_t ragged_fallbacks() const { return ragged_fallbacks_; }
  // Bias-epilogue calls the library refused (no algorithm with the epilogue, or the call failed),
  // whose bias a kernel added instead (expected 0; vectors less than 16-byte aligned go to the
  // kernel by design and are not counted).
  int64_t epilogue_fallbacks() const { return epilogue_fallbacks_; }

 private:
  // bias: the epilogue's bias vector (nullptr: none). c_in: where beta * C is read from
  // (nullptr: C itself; else a distinct matrix of C's layout). c_type: the type of C and c_in
  // (fp32 unless run_bf16_out).
  bool run_blaslt(int64_t M, int64_t N, int64_t K, float alpha, const GemmOperand& A, const GemmOperand& B,
                  float beta, void* C, int64_t ldc, const GemmBatch& batch, GemmCompute compute, GemmShape shape,
                  const float* bias = nullptr, const void* c_in = nullptr, GemmType c_type = GemmType::F32);
  // BLASLt descriptors, layouts and the chosen algorithm of each problem shape (with operand
  // alignments and batch), built and queried once: a training step repeats a few dozen shapes.
  // A ragged plan is built for ragged_bound() of its ragged dimension (M or K).
  struct Plan;
  Plan* plan_for(int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B, const void* C,
                 int64_t ldc, const GemmBatch& batch, GemmCompute compute, GemmShape shape, const float* bias,
                 GemmType c_type);
  std::map<std::vector<int64_t>, Plan*> plans_;
  int64_t plans_built_ = 0;
  double plan_seconds_ = 0;
  int64_t ragged_fallbacks_ = 0;
  int64_t epilogue_fallbacks_ = 0;

  gpuStream_t stream_;
  bool portable_;
  void* handle_ = nullptr;     // gpuBlasLtHandle_t when a BLASLt library is used
  void* workspace_ = nullptr;  // BLASLt workspace
  int64_t workspace_bytes_ = 0;
};

}  // namespace zaya
