// Causal GQA attention through the GEMM engine, for chunks of many queries (training, prefill):
// the tensor cores do the products, the masked softmax and dS are fp32 row kernels.
//
// Per sequence b, KV group g and chunk of Tq queries, the rep = Hq / Hkv query heads of the
// group are gathered into one contiguous [rep*Tq, dh] block, so every product is one GEMM
// against the group's keys [s_begin, s_end) (read in place from the [B, S, Hkv, dh] caches):
//   forward   S = Q K^T, P = masked softmax(scale S), O = P V
//   backward  S and P recomputed, dP = dO V^T, dS = scale P (dP - rowsum(P dP)),
//             dQ = dS K, dK += dS^T Q, dV += P^T dO
// Operands are bf16 under the bf16 policy (fp32 with bf16_matmul off), accumulation fp32; the
// softmax and dS kernels write P and dS packed to bf16 themselves (no separate pass). The
// scores of a chunk are materialised: queries are chunked so they stay under kScoreBudget bytes
// and at most kMaxChunkQueries long (later chunks of a causal sequence then skip the keys no
// query of theirs can see). The visibility rule (causal, sliding window, document starts) is
// attn_visible, as in the flash kernels used for short chunks (decode).
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_attention_common.h"

namespace zaya {

namespace {

constexpr int64_t kScoreBudget = int64_t(256) << 20;  // bytes of fp32 scores per chunk
constexpr int64_t kMaxChunkQueries = 1024;

// dst[(i * Tq + t) * dh + d] = src[((b * T + t0 + t) * Hq + h0 + i) * dh + d]
__global__ void k_gather_heads(const float* src, float* dst, int64_t b, int64_t T, int64_t Hq, int64_t h0, int64_t rep,
                               int64_t t0, int64_t Tq, int64_t dh) {
  const int64_t n = rep * Tq * dh;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = x % dh, r = x / dh, t = r % Tq, i = r / Tq;
    dst[x] = src[((b * T + t0 + t) * Hq + h0 + i) * dh + d];
  }
}

// The inverse of k_gather_heads (each element written once).
__global__ void k_scatter_heads(const float* src, float* dst, int64_t b, int64_t T, int64_t Hq, int64_t h0,
                                int64_t rep, int64_t t0, int64_t Tq, int64_t dh) {
  const int64_t n = rep * Tq * dh;
  for (int64_t x = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; x < n; x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = x % dh, r = x / dh, t = r % Tq, i = r / Tq;
    dst[((b * T + t0 + t) * Hq + h0 + i) * dh + d] = src[x];
  }
}

// One block per score row r (query t0 + r % Tq): P = softmax over the visible keys of scale * S,
// 0 elsewhere, written in place (S itself, when keep_f32) and/or packed to bf16 in P16 (when not
// null: the operand of the next GEMM, with no separate packing pass). Every row has a visible
// key (its own position).
__global__ void k_masked_softmax(float* S, int64_t Sn, AttnParams p, int64_t b, int64_t t0, int64_t Tq, int64_t s0,
                                 int keep_f32, bf16_t* P16) {
  __shared__ float shf[kGpuThreads];
  __shared__ double shd[kGpuThreads];
  const int64_t r = blockIdx.x, t = t0 + r % Tq;
  float* row = S + r * Sn;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < Sn; j += blockDim.x)
    if (attn_visible(p, b, t, s0 + j)) mx = fmaxf(mx, row[j] * p.scale);
  mx = block_max(mx, shf);
  double sum = 0;
  for (int64_t j = threadIdx.x; j < Sn; j += blockDim.x)
    if (attn_visible(p, b, t, s0 + j)) sum += double(expf(row[j] * p.scale - mx));  // the terms P uses
  sum = block_sum(sum, shd);
  const float inv = float(1.0 / sum);
  for (int64_t j = threadIdx.x; j < Sn; j += blockDim.x) {
    const float v = attn_visible(p, b, t, s0 + j) ? expf(row[j] * p.scale - mx) * inv : 0.0f;
    if (keep_f32) row[j] = v;
    if (P16) P16[r * Sn + j] = f32_to_bf16(v);
  }
}

// One block per row: dS = scale * P * (dP - sum_j P dP) (masked entries have P = 0), in place
// in dP, or packed to bf16 in dS16 when it is not null.
__global__ void k_attn_ds(const float* P, float* dP, int64_t Sn, float scale, bf16_t* dS16) {
  __shared__ double shd[kGpuThreads];
  const int64_t r = blockIdx.x;
  const float* pr = P + r * Sn;
  float* dr = dP + r * Sn;
  double dot = 0;
  for (int64_t j = threadIdx.x; j < Sn; j += blockDim.x) dot += double(pr[j]) * double(dr[j]);
  dot = block_sum(dot, shd);
  const float D = float(dot);
  for (int64_t j = threadIdx.x; j < Sn; j += blockDim.x) {
    const float v = scale * pr[j] * (dr[j] - D);
    if (dS16) dS16[r * Sn + j] = f32_to_bf16(v);
    else dr[j] = v;
  }
}

// The query chunks of sequence b and the keys each may see.
struct AttnChunk {
  int64_t t0, Tq, s0, Sn;
};

std::vector<AttnChunk> attention_chunks(const AttentionArgs& a, int64_t b) {
  const int64_t rep = a.Hq / a.Hkv;
  int64_t tq = kScoreBudget / (rep * std::max<int64_t>(a.S, 1) * 4);
  tq = std::max<int64_t>(1, std::min({tq, kMaxChunkQueries, a.T}));
  std::vector<AttnChunk> out;
  for (int64_t t0 = 0; t0 < a.T; t0 += tq) {
    AttnChunk c;
    c.t0 = t0;
    c.Tq = std::min(tq, a.T - t0);
    const int64_t first = a.pos0[b] + t0, last = a.pos0[b] + t0 + c.Tq - 1;
    int64_t s_begin = a.window > 0 ? std::max<int64_t>(0, first - a.window + 1) : 0;
    if (a.seg_start) s_begin = std::max<int64_t>(s_begin, a.seg_start[b * a.T + t0]);
    c.s0 = s_begin;
    c.Sn = last + 1 - s_begin;
    out.push_back(c);
  }
  return out;
}

}  // namespace

void CudaBackend::attention_gemm(const AttentionArgs& a) {
  DeviceBuffer pos0, seg;
  AttnParams p = attn_params(*this, a, warp_size_, "attention", pos0, seg);
  const int64_t rep = a.Hq / a.Hkv, dh = a.dh, ldkv = a.Hkv * dh;
  const bool bf16 = options_.bf16_matmul;
  for (int64_t b = 0; b < a.B; ++b)
    for (const AttnChunk& c : attention_chunks(a, b))
      for (int64_t g = 0; g < a.Hkv; ++g) {
        const int64_t M = rep * c.Tq;
        DeviceBuffer qg(this, M * dh * 4), sc(this, M * c.Sn * 4), og(this, M * dh * 4);
        gpu_launch(k_gather_heads, gpu_blocks(M * dh), kGpuThreads, 0, stream_, a.q, qg.f(), b, a.T, a.Hq,
                   g * rep, rep, c.t0, c.Tq, dh);
        GPU_LAUNCH_CHECK();
        const float* kb = a.k_cache + ((b * a.S + c.s0) * a.Hkv + g) * dh;
        const float* vb = a.v_cache + ((b * a.S + c.s0) * a.Hkv + g) * dh;
        DeviceBuffer hq, hk, hp, hv;
        gemm(M, c.Sn, dh, 1.0f, operand(qg.f(), M, dh, dh, false, bf16, hq), operand(kb, c.Sn, dh, ldkv, true, bf16, hk),
             0.0f, sc.f(), c.Sn);  // S = Q K^T
        if (bf16) hp = DeviceBuffer(this, M * c.Sn * 2);  // P packed to bf16 by the softmax itself
        gpu_launch(k_masked_softmax, unsigned(M), kGpuThreads, 0, stream_, sc.f(), c.Sn, p, b, c.t0, c.Tq,
                   c.s0, !bf16, bf16 ? hp.h() : nullptr);
        GPU_LAUNCH_CHECK();
        const GemmOperand p_op = bf16 ? bf16_operand(hp.h(), c.Sn, false) : f32_operand(sc.f(), c.Sn, false);
        gemm(M, dh, c.Sn, 1.0f, p_op, operand(vb, c.Sn, dh, ldkv, false, bf16, hv), 0.0f, og.f(), dh);  // O = P V
        gpu_launch(k_scatter_heads, gpu_blocks(M * dh), kGpuThreads, 0, stream_, og.f(), a.out, b, a.T, a.Hq,
                   g * rep, rep, c.t0, c.Tq, dh);
        GPU_LAUNCH_CHECK();
      }
}

void CudaBackend::attention_backward_gemm(const AttentionArgs& a, const float* dout, float* dq, float* dk, float* dv) {
  DeviceBuffer pos0, seg;
  AttnParams p = attn_params(*this, a, warp_size_, "attention_backward", pos0, seg);
  const int64_t rep = a.Hq / a.Hkv, dh = a.dh, ldkv = a.Hkv * dh;
  const bool bf16 = options_.bf16_matmul;
  fill(dk, 0.0f, a.B * a.S * a.Hkv * dh);
  fill(dv, 0.0f, a.B * a.S * a.Hkv * dh);
  for (int64_t b = 0; b < a.B; ++b)
    for (const AttnChunk& c : attention_chunks(a, b))
      for (int64_t g = 0; g < a.Hkv; ++g) {
        const int64_t M = rep * c.Tq;
        DeviceBuffer qg(this, M * dh * 4), dog(this, M * dh * 4), sc(this, M * c.Sn * 4), dp(this, M * c.Sn * 4),
            dqg(this, M * dh * 4);
        gpu_launch(k_gather_heads, gpu_blocks(M * dh), kGpuThreads, 0, stream_, a.q, qg.f(), b, a.T, a.Hq,
                   g * rep, rep, c.t0, c.Tq, dh);
        gpu_launch(k_gather_heads, gpu_blocks(M * dh), kGpuThreads, 0, stream_, dout, dog.f(), b, a.T, a.Hq,
                   g * rep, rep, c.t0, c.Tq, dh);
        GPU_LAUNCH_CHECK();
        const int64_t kv_off = ((b * a.S + c.s0) * a.Hkv + g) * dh;
        const float *kb = a.k_cache + kv_off, *vb = a.v_cache + kv_off;
        DeviceBuffer hq, hk, hdo, hv, hp, hds, hkn;
        const GemmOperand q_op = operand(qg.f(), M, dh, dh, false, bf16, hq);
        const GemmOperand do_op = operand(dog.f(), M, dh, dh, false, bf16, hdo);
        gemm(M, c.Sn, dh, 1.0f, q_op, operand(kb, c.Sn, dh, ldkv, true, bf16, hk), 0.0f, sc.f(), c.Sn);  // S
        if (bf16) {
          hp = DeviceBuffer(this, M * c.Sn * 2);
          hds = DeviceBuffer(this, M * c.Sn * 2);
        }
        // P in fp32 (for dS) and, under bf16, packed for the dV GEMM by the same kernel.
        gpu_launch(k_masked_softmax, unsigned(M), kGpuThreads, 0, stream_, sc.f(), c.Sn, p, b, c.t0, c.Tq,
                   c.s0, 1, bf16 ? hp.h() : nullptr);
        GPU_LAUNCH_CHECK();
        gemm(M, c.Sn, dh, 1.0f, do_op, operand(vb, c.Sn, dh, ldkv, true, bf16, hv), 0.0f, dp.f(), c.Sn);  // dP
        gpu_launch(k_attn_ds, unsigned(M), kGpuThreads, 0, stream_, sc.f(), dp.f(), c.Sn, a.scale,
                   bf16 ? hds.h() : nullptr);  // dS
        GPU_LAUNCH_CHECK();
        const GemmOperand p_op = bf16 ? bf16_operand(hp.h(), c.Sn, false) : f32_operand(sc.f(), c.Sn, false);
        GemmOperand ds_op = bf16 ? bf16_operand(hds.h(), c.Sn, false) : f32_operand(dp.f(), c.Sn, false);
        gemm(M, dh, c.Sn, 1.0f, ds_op, operand(kb, c.Sn, dh, ldkv, false, bf16, hkn), 0.0f, dqg.f(), dh);  // dQ
        gpu_launch(k_scatter_heads, gpu_blocks(M * dh), kGpuThreads, 0, stream_, dqg.f(), dq, b, a.T, a.Hq,
                   g * rep, rep, c.t0, c.Tq, dh);
        GPU_LAUNCH_CHECK();
        ds_op.trans = true;  // [M, Sn] read as dS^T
        gemm(c.Sn, dh, M, 1.0f, ds_op, q_op, 1.0f, dk + kv_off, ldkv);  // dK += dS^T Q
        GemmOperand pt_op = p_op;
        pt_op.trans = true;
        gemm(c.Sn, dh, M, 1.0f, pt_op, do_op, 1.0f, dv + kv_off, ldkv);  // dV += P^T dO
      }
}

}  // namespace zaya
