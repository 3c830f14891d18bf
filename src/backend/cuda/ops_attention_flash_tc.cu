// Flash-style causal GQA attention forward on the tensor cores (CUDA sm_80+, WMMA bf16 16x16x16
// with fp32 accumulation), for chunks of kAttnGemmMinQueries or more queries under the bf16
// policy and head_dim 64 or 128 (CudaBackendOptions::attention_flash_tc). One block of 4 warps
// per 64 queries of one head: the queries stay in shared memory as bf16; for each tile of 64
// visible keys, S = Q K^T (bf16 operands, fp32 scores), an online softmax per row (fp32, the
// visibility rule of ops_attention_common.h: causal, sliding window, document starts, decode
// offsets), the rows of the fp32 output accumulator rescaled in shared memory, and O += P V with
// P rounded to bf16, as the GEMM path rounds it. Scores never reach device memory. The backward
// is unchanged (the GEMM path recomputes the softmax). Elsewhere (HIP, fp32, other head dims)
// attention() keeps the GEMM path.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_attention_common.h"

namespace zaya {

#if defined(ZAYA_GPU_CUDA)
namespace {

constexpr int kFlashRows = 64;            // queries per block (16 per warp)
constexpr int kFlashKeys = 64;            // keys per tile
constexpr int kFlashWarps = 4;
constexpr int kFlashThreads = kFlashWarps * 32;
constexpr int kLdS = kFlashKeys + 4;      // fp32 scores row stride (a multiple of 4 floats)
constexpr int kLdP = kFlashKeys + 8;      // bf16 probabilities row stride (a multiple of 8)

template <int DH>
struct FlashLayout {
  static constexpr int kLdH = DH + 8;  // bf16 Q/K/V row stride
  static constexpr int kLdO = DH + 4;  // fp32 output accumulator row stride
  static constexpr size_t q = 0;
  static constexpr size_t k = q + size_t(kFlashRows) * kLdH * 2;
  static constexpr size_t v = k + size_t(kFlashKeys) * kLdH * 2;
  static constexpr size_t s = v + size_t(kFlashKeys) * kLdH * 2;
  static constexpr size_t p = s + size_t(kFlashRows) * kLdS * 4;
  static constexpr size_t o = p + size_t(kFlashRows) * kLdP * 2;
  static constexpr size_t stats = o + size_t(kFlashRows) * kLdO * 4;  // m, l, alpha per row
  static constexpr size_t bytes = stats + size_t(3) * kFlashRows * 4;
};

// rows [r0, r0 + 64) of head hh of a [B, rows_per_seq, H, DH] fp32 tensor into bf16 shared rows;
// rows at or past `valid` are zero.
template <int DH>
__device__ void stage_bf16(bf16_t* dst, const float* src, int64_t b, int64_t rows_per_seq, int64_t H, int64_t hh,
                           int64_t r0, int64_t valid) {
  constexpr int kLd = FlashLayout<DH>::kLdH;
  for (int i = int(threadIdx.x); i < kFlashRows * DH; i += kFlashThreads) {
    const int r = i / DH, d = i % DH;
    const int64_t row = r0 + r;
    dst[r * kLd + d] = row < valid ? f32_to_bf16(src[((b * rows_per_seq + row) * H + hh) * DH + d]) : bf16_t(0);
  }
}

template <int DH>
__global__ void __launch_bounds__(kFlashThreads) k_attention_flash_tc(AttnParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 WMMA needs sm_80; the backend takes this path only where the device has it
#else
  using namespace nvcuda;
  using L = FlashLayout<DH>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16_t* Qs = reinterpret_cast<bf16_t*>(smem + L::q);
  bf16_t* Ks = reinterpret_cast<bf16_t*>(smem + L::k);
  bf16_t* Vs = reinterpret_cast<bf16_t*>(smem + L::v);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  bf16_t* Ps = reinterpret_cast<bf16_t*>(smem + L::p);
  float* Os = reinterpret_cast<float*>(smem + L::o);
  float* row_m = reinterpret_cast<float*>(smem + L::stats);
  float* row_l = row_m + kFlashRows;
  float* row_alpha = row_l + kFlashRows;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t b = blockIdx.z, h = blockIdx.y, g = h / (p.Hq / p.Hkv);
  const int64_t t_begin = int64_t(blockIdx.x) * kFlashRows;
  const int64_t t_end = t_begin + kFlashRows < p.T ? t_begin + kFlashRows : p.T;
  const int64_t pos_first = p.pos0[b] + t_begin, pos_last = p.pos0[b] + t_end - 1;
  int64_t s_begin = p.window > 0 && pos_first - p.window + 1 > 0 ? pos_first - p.window + 1 : 0;
  if (p.seg && p.seg[b * p.T + t_begin] > s_begin) s_begin = p.seg[b * p.T + t_begin];
  const int64_t s_end = pos_last + 1;

  stage_bf16<DH>(Qs, p.q, b, p.T, p.Hq, h, t_begin, p.T);
  for (int i = int(threadIdx.x); i < kFlashRows * L::kLdO; i += kFlashThreads) Os[i] = 0.0f;
  for (int i = int(threadIdx.x); i < kFlashRows; i += kFlashThreads) {
    row_m[i] = -INFINITY;
    row_l[i] = 0.0f;
  }
  // The softmax of row r = 16 * warp + lane / 2 is kept by two lanes, each over half the keys.
  const int my_row = 16 * warp + lane / 2, half = lane % 2;
  const int64_t t = t_begin + my_row;
  for (int64_t s0 = s_begin; s0 < s_end; s0 += kFlashKeys) {
    __syncthreads();  // the previous tile's K, V and P are no longer read
    stage_bf16<DH>(Ks, p.k, b, p.S, p.Hkv, g, s0, s_end);
    stage_bf16<DH>(Vs, p.v, b, p.S, p.Hkv, g, s0, s_end);
    __syncthreads();
    // S (this warp's 16 rows x 64 keys) = Q K^T.
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> sacc[kFlashKeys / 16];
#pragma unroll
      for (int n = 0; n < kFlashKeys / 16; ++n) wmma::fill_fragment(sacc[n], 0.0f);
#pragma unroll
      for (int kk = 0; kk < DH; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> qa;
        wmma::load_matrix_sync(qa, reinterpret_cast<const __nv_bfloat16*>(Qs + (16 * warp) * L::kLdH + kk), L::kLdH);
#pragma unroll
        for (int n = 0; n < kFlashKeys / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> kb;  // K^T: K's rows as columns
          wmma::load_matrix_sync(kb, reinterpret_cast<const __nv_bfloat16*>(Ks + (16 * n) * L::kLdH + kk), L::kLdH);
          wmma::mma_sync(sacc[n], qa, kb, sacc[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < kFlashKeys / 16; ++n)
        wmma::store_matrix_sync(Ss + (16 * warp) * kLdS + 16 * n, sacc[n], kLdS, wmma::mem_row_major);
    }
    __syncwarp();
    // Online softmax of my_row over this tile's visible keys.
    {
      const float* srow = Ss + my_row * kLdS;
      const bool row_valid = t < p.T;
      float tile_max = -INFINITY;
      for (int j = half * 32; j < half * 32 + 32; ++j)
        if (row_valid && s0 + j < s_end && attn_visible(p, b, t, s0 + j)) tile_max = fmaxf(tile_max, srow[j] * p.scale);
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      const float m_old = row_m[my_row];
      const float m_new = fmaxf(m_old, tile_max);
      // No visible key yet (m_new = -inf): nothing accumulates, alpha 1 keeps the zeros.
      const float alpha = m_new == -INFINITY ? 1.0f : expf(m_old - m_new);
      float sum = 0.0f;
      bf16_t* prow = Ps + my_row * kLdP;
      for (int j = half * 32; j < half * 32 + 32; ++j) {
        float e = 0.0f;
        if (m_new != -INFINITY && row_valid && s0 + j < s_end && attn_visible(p, b, t, s0 + j))
          e = expf(srow[j] * p.scale - m_new);
        const bf16_t eb = f32_to_bf16(e);
        prow[j] = eb;
        sum += bf16_to_f32(eb);  // the normaliser sums what P V multiplies
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      if (half == 0) {
        row_m[my_row] = m_new;
        row_l[my_row] = row_l[my_row] * alpha + sum;
        row_alpha[my_row] = alpha;
      }
    }
    __syncwarp();
    // This warp's output rows *= alpha, then += P V.
    for (int i = lane; i < 16 * DH; i += 32) {
      const int r = 16 * warp + i / DH, d = i % DH;
      Os[r * L::kLdO + d] *= row_alpha[r];
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < DH / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> oacc;
      float* otile = Os + (16 * warp) * L::kLdO + 16 * n;
      wmma::load_matrix_sync(oacc, otile, L::kLdO, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kFlashKeys; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> pa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> vb;
        wmma::load_matrix_sync(pa, reinterpret_cast<const __nv_bfloat16*>(Ps + (16 * warp) * kLdP + kk), kLdP);
        wmma::load_matrix_sync(vb, reinterpret_cast<const __nv_bfloat16*>(Vs + kk * L::kLdH + 16 * n), L::kLdH);
        wmma::mma_sync(oacc, pa, vb, oacc);
      }
      wmma::store_matrix_sync(otile, oacc, L::kLdO, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = int(threadIdx.x); i < kFlashRows * DH; i += kFlashThreads) {
    const int r = i / DH, d = i % DH;
    const int64_t tr = t_begin + r;
    if (tr >= p.T) continue;
    const float l = row_l[r];
    p.out[((b * p.T + tr) * p.Hq + h) * DH + d] = l > 0.0f ? Os[r * L::kLdO + d] / l : 0.0f;
  }
#endif
}

template <int DH>
void launch_flash_tc(const AttnParams& p, gpuStream_t stream) {
  const size_t bytes = FlashLayout<DH>::bytes;  // over the default 48 KiB: allowed per launch (sm_80+)
  GPU_CHECK(gpuFuncSetAttribute(reinterpret_cast<const void*>(&k_attention_flash_tc<DH>),
                                gpuFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  const dim3 grid(unsigned((p.T + kFlashRows - 1) / kFlashRows), unsigned(p.Hq), unsigned(p.B));
  k_attention_flash_tc<DH><<<grid, kFlashThreads, bytes, stream>>>(p);
  GPU_LAUNCH_CHECK();
}

}  // namespace
#endif

bool CudaBackend::attention_flash_tc_enabled() const {
#if defined(ZAYA_GPU_CUDA)
  return options_.attention_flash_tc && options_.bf16_matmul && wmma_;
#else
  return false;
#endif
}

bool CudaBackend::attention_flash_tc_applies(const AttentionArgs& a) const {
  return attention_flash_tc_enabled() && (a.dh == 64 || a.dh == 128);
}

void CudaBackend::attention_flash_tc(const AttentionArgs& a) {
#if defined(ZAYA_GPU_CUDA)
  DeviceBuffer pos0, seg;
  AttnParams p = attn_params(*this, a, warp_size_, "attention", pos0, seg);
  p.out = a.out;
  if (a.dh == 64) launch_flash_tc<64>(p, stream_);
  else launch_flash_tc<128>(p, stream_);
#else
  (void)a;
  fail("cuda", "attention: the tensor-core flash kernel is CUDA-only");
#endif
}

}  // namespace zaya
