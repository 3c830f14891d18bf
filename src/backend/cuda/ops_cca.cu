// GPU ops for Compressed Convolutional Attention (spec A.5-A.6): the two-stage causal conv
// with carried state (the grouped stage as GEMMs from kConvGemmMinTokens tokens, else one
// kernel; the whole conv of a few rows, as decode runs it, in one kernel; and the packed-document variant, re-laid exactly as the CPU backend does), the mean
// paths + QK-norm + key temperature + partial NeoX RoPE, the current/delayed value heads, and
// KV-cache writes. All fp32 (spec A.11). Passed against the CPU backend on an H100.
#include <cfloat>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_cca_common.h"
#include "backend/cuda/ops_cca_qk_kernels.h"

namespace zaya {

using namespace cca_qk_fwd;  // k_rope_table, k_cca_qk (ops_cca_qk_kernels.h)

namespace {

// w_t[(ci * t1 + j) * C + c] = w_grp[(c * G + ci) * t1 + j]: the grouped conv's weights with the
// output channel innermost, so that the threads of a warp (consecutive c) read consecutive
// weights (in [C, G, t1] order each of their loads touched another cache line: measured 23 ms
// per layer at 16384 tokens on an H100).
__global__ void k_grouped_w_transpose(const float* w_grp, float* w_t, int64_t C, int64_t G, int64_t t1) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < C * G * t1; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, r = i / C, ci = r / t1, j = r % t1;
    w_t[i] = w_grp[(c * G + ci) * t1 + j];
  }
}

// z[b, t, c] = b_grp[c] + sum_{ci, j} w_grp[c, ci, j] y[b, t + j, group(c) + ci], the weights in
// k_grouped_w_transpose's layout w_t[(ci * t1 + j) * C + c].
__global__ void k_conv_grouped(const float* y, const float* w_t, const float* b_grp, float* z, int64_t B, int64_t T,
                               int64_t C, int64_t G, int64_t t1) {
  const int64_t Ly = T + t1 - 1;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < B * T * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, t = (i / C) % T, b = i / (C * T);
    const float* yg = y + (b * Ly + t) * C + (c / G) * G;
    float acc = b_grp[c];
    for (int64_t ci = 0; ci < G; ++ci)
      for (int64_t j = 0; j < t1; ++j) acc += w_t[(ci * t1 + j) * C + c] * yg[j * C + ci];
    z[i] = acc;
  }
}

// The grouped stage in one kernel (chunks shorter than kConvGemmMinTokens), into a.z, from the
// transposed weights.
void conv_grouped_direct(CudaBackend& be, const float* y, const CcaConvArgs& a) {
  const int64_t B = a.B, T = a.T, C = a.C, G = a.group, t1 = a.t1;
  DeviceBuffer w_t(&be, C * G * t1 * 4);
  gpu_launch(k_grouped_w_transpose, gpu_blocks(C * G * t1), kGpuThreads, 0, be.stream(), a.w_grp, w_t.f(), C, G,
             t1);
  GPU_LAUNCH_CHECK();
  gpu_launch(k_conv_grouped, gpu_blocks(B * T * C), kGpuThreads, 0, be.stream(), y, w_t.f(), a.b_grp, a.z, B, T, C,
             G, t1);
  GPU_LAUNCH_CHECK();
}

// Token rows up to which the whole conv runs as k_conv_few_rows (decode): its threads read the
// grouped weights as stored, strided, as the transpose itself would, so for a few rows the
// transpose's launch and pass, the depthwise stage's launch and its buffer, and the state's own
// launch buy nothing.
constexpr int64_t kConvFewRowsMaxRows = 16;
// Its shared memory must stay within what every target grants a block without asking (48 KiB on
// NVIDIA; AMD's 64 KiB LDS holds it too): (rows + t1 - 1) * G fp32 values, 8.5 KiB for 16 rows at G = 128, t1 = 2.
constexpr int64_t kConvFewRowsMaxShared = 48 << 10;

// The whole conv of a few token rows, one block per (b, channel group of G): the depthwise stage
// of the group's channels over the T + t1 - 1 rows the grouped stage reads, into shared memory
// (y: [Ly][G]); after the barrier, the grouped stage from it with the weights as stored
// ([C, G, t1]); then the carried state of the group's channels moved on in place, as
// k_conv_new_state does (every read of the old state is in the depthwise stage, before the
// barrier, and no other block reads these channels). The same terms in the same order as the
// depthwise, grouped and state kernels, so the same bits.
__global__ void k_conv_few_rows(const float* u, float* state, const float* w_dw, const float* b_dw,
                                const float* w_grp, const float* b_grp, float* z, int64_t T, int64_t C, int64_t G,
                                int64_t P, int64_t t0, int64_t t1) {
  ZAYA_DYNAMIC_SHARED(smem);
  float* y = reinterpret_cast<float*>(smem);
  const int64_t groups = C / G, b = int64_t(blockIdx.x) / groups, g0 = (int64_t(blockIdx.x) % groups) * G;
  const int64_t Ly = T + t1 - 1;
  for (int64_t i = threadIdx.x; i < Ly * G; i += blockDim.x) {
    const int64_t ci = i % G, s = i / G, c = g0 + ci;
    float acc = b_dw[c];
    for (int64_t k = 0; k < t0; ++k) acc += w_dw[c * t0 + k] * conv_ext(u, state, b, s + k, c, T, C, P);
    y[i] = acc;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < T * G; i += blockDim.x) {
    const int64_t co = i % G, t = i / G, c = g0 + co;
    const float* wc = w_grp + c * G * t1;
    float acc = b_grp[c];
    for (int64_t ci = 0; ci < G; ++ci)
      for (int64_t j = 0; j < t1; ++j) acc += wc[ci * t1 + j] * y[(t + j) * G + ci];
    z[(b * T + t) * C + c] = acc;
  }
  if (state == nullptr) return;
  for (int64_t ci = threadIdx.x; ci < G; ci += blockDim.x)
    for (int64_t p = 0; p < P; ++p)
      state[(b * P + p) * C + g0 + ci] = conv_ext(u, state, b, T + p, g0 + ci, T, C, P);
}

// state[b, p] = ext(b, T + p) for p < P, in place: one thread per (b, c) takes p upwards, so
// each entry it reads (row T + p > p of the old state, or u) is still the old one.
__global__ void k_conv_new_state(const float* u, float* state, int64_t B, int64_t T, int64_t C, int64_t P) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < B * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, b = i / C;
    for (int64_t p = 0; p < P; ++p) state[(b * P + p) * C + c] = conv_ext(u, state, b, T + p, c, T, C, P);
  }
}

// v = [v_cur | v_del one token late], and the delayed-value state moved on to the chunk's last
// token: the element that reads a state entry (t = 0) is its only reader, so it writes the next
// chunk's value there after reading (no second launch).
__global__ void k_cca_values(const float* v_cur, const float* v_del, float* state, const int32_t* seg, float* v,
                             int64_t B, int64_t T, int64_t h) {
  const int64_t W = 2 * h;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < B * T * W; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % W, t = (i / W) % T, b = i / (W * T);
    if (j < h) {
      v[i] = v_cur[(b * T + t) * h + j];
    } else if (t == 0) {
      const int64_t s = b * h + (j - h);
      v[i] = state[s];
      state[s] = v_del[(b * T + T - 1) * h + (j - h)];
    } else if (seg && seg[b * T + t] == t) {
      v[i] = 0.0f;  // a document starts here
    } else {
      v[i] = v_del[(b * T + t - 1) * h + (j - h)];
    }
  }
}

// Rows of src[B, T, W] into cache[B, S, W] at pos0[b] + t, and (src2 not null) the same of src2
// into cache2: the elements of both tensors in one grid.
__global__ void k_cache_write(const float* src, float* cache, const float* src2, float* cache2, const int64_t* pos0,
                              int64_t B, int64_t T, int64_t S, int64_t W) {
  const int64_t n = B * T * W, total = src2 != nullptr ? 2 * n : n;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const bool second = e >= n;
    const int64_t i = second ? e - n : e;
    const int64_t w = i % W, t = (i / W) % T, b = i / (W * T);
    (second ? cache2 : cache)[(b * S + pos0[b] + t) * W + w] = (second ? src2 : src)[i];
  }
}

}  // namespace

void CudaBackend::cca_conv_rows(const CcaConvArgs& a) {
  const int64_t B = a.B, T = a.T, C = a.C, P = (a.t0 - 1) + (a.t1 - 1), Ly = T + a.t1 - 1;
  if (B * T == 0) return;
  const int64_t G = a.group, few_rows_shared = Ly * G * 4;
  if (B * T <= kConvFewRowsMaxRows && C % G == 0 && few_rows_shared <= kConvFewRowsMaxShared) {
    gpu_launch(k_conv_few_rows, unsigned(B * (C / G)), kGpuThreads, size_t(few_rows_shared), stream_, a.u, a.state,
               a.w_dw, a.b_dw, a.w_grp, a.b_grp, a.z, T, C, G, P, a.t0, a.t1);
    GPU_LAUNCH_CHECK();
    return;
  }
  DeviceBuffer y(this, B * Ly * C * 4);
  launch_conv_depthwise(stream_, a.u, a.state, a.w_dw, a.b_dw, y.f(), B, T, C, P, a.t0, a.t1);
  if (T >= kConvGemmMinTokens) {
    grouped_conv_gemm(*this, y.f(), a.w_grp, a.b_grp, a.z, B, T, C, a.group, a.t1);
  } else {
    conv_grouped_direct(*this, y.f(), a);
  }
  if (a.state && P > 0) {
    gpu_launch(k_conv_new_state, gpu_blocks(B * C), kGpuThreads, 0, stream_, a.u, a.state, B, T, C, P);
    GPU_LAUNCH_CHECK();
  }
}

void CudaBackend::cca_conv(const CcaConvArgs& a) {
  if (!a.seg_start) return cca_conv_rows(a);
  // Packed documents: per row, P zero rows before every document start after the first, then
  // the ordinary convolution from a zero state (as backend/cpu/ops_cca_segments.cpp).
  const int64_t C = a.C, T = a.T, P = (a.t0 - 1) + (a.t1 - 1);
  for (int64_t b = 0; b < a.B; ++b) {
    std::vector<int32_t> row_of;
    const int64_t Te = expanded_rows(a.seg_start + b * T, T, P, row_of);
    DeviceBuffer rows = upload(row_of.data(), T * 4);
    DeviceBuffer ue(this, Te * C * 4), ze(this, Te * C * 4), state(this, (P > 0 ? P : 1) * C * 4);
    fill(ue.f(), 0.0f, Te * C);
    fill(state.f(), 0.0f, P * C);
    launch_scatter_rows(stream_, a.u + b * T * C, rows.i(), T, C, ue.f(), false);
    CcaConvArgs row = a;
    row.seg_start = nullptr;
    row.B = 1; row.T = Te; row.u = ue.f(); row.z = ze.f(); row.state = state.f();
    cca_conv_rows(row);
    launch_gather_rows(stream_, ze.f(), rows.i(), T, C, a.z + b * T * C, false);
    if (a.state) copy(a.state + b * P * C, state.f(), P * C);
  }
}

void launch_rope_table(gpuStream_t s, const int64_t* positions, int64_t N, int64_t half, int64_t rotary_dim,
                       double theta, float* cs, float* sn) {
  gpu_launch(k_rope_table, gpu_blocks(N * half), kGpuThreads, 0, s, positions, N, half, rotary_dim, theta, cs,
             sn);
  GPU_LAUNCH_CHECK();
}

// Tokens up to which cca_qk computes the rotation in place rather than building the table.
constexpr int64_t kRopeInPlaceMaxTokens = 16;

void CudaBackend::cca_qk(const CcaQkArgs& a) {
  const int64_t N = a.N, half = a.rotary_dim / 2;
  if (N == 0) return;
  DeviceBuffer pos_holder;
  const auto* pos = static_cast<const int64_t*>(upload_reused(a.positions, N * 8, pos_holder));
  RopeSource rope;
  rope.positions = pos;
  rope.rotary_dim = a.rotary_dim;
  rope.theta = a.theta;
  DeviceBuffer cs, sn;
  if (half > 0 && N > kRopeInPlaceMaxTokens) {
    cs = DeviceBuffer(this, N * half * 4);
    sn = DeviceBuffer(this, N * half * 4);
    launch_rope_table(stream_, pos, N, half, a.rotary_dim, a.theta, cs.f(), sn.f());
    rope.cs = cs.f();
    rope.sn = sn.f();
  }
  gpu_launch(k_cca_qk, gpu_warp_blocks(N * (a.Hq + a.Hkv), warp_size_), kGpuThreads, 0, stream_, a.z, a.u,
             a.temp, rope, a.q, a.k, N, a.Hq, a.Hkv, a.dh, half);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::cca_values(const CcaValueArgs& a) {
  if (a.B * a.T == 0) return;
  DeviceBuffer seg;
  if (a.seg_start) seg = upload(a.seg_start, a.B * a.T * 4);
  gpu_launch(k_cca_values, gpu_blocks(a.B * a.T * 2 * a.half), kGpuThreads, 0, stream_, a.v_cur, a.v_del,
             a.v_state, a.seg_start ? seg.i() : nullptr, a.v, a.B, a.T, a.half);
  GPU_LAUNCH_CHECK();
}

void CudaBackend::cache_write(const float* src, float* cache, const int64_t* pos0, int64_t B, int64_t T, int64_t S,
                              int64_t W) {
  if (src == cache || B * T * W == 0) return;  // training: the chunk is the whole cache
  DeviceBuffer holder;
  const auto* p = static_cast<const int64_t*>(upload_reused(pos0, B * 8, holder));
  gpu_launch(k_cache_write, gpu_blocks(B * T * W), kGpuThreads, 0, stream_, src, cache, nullptr, nullptr, p, B, T,
             S, W);
  GPU_LAUNCH_CHECK();
}

// One launch for both (Backend's default: two).
void CudaBackend::cache_write_kv(const float* k, const float* v, float* k_cache, float* v_cache, const int64_t* pos0,
                                 int64_t B, int64_t T, int64_t S, int64_t W) {
  if (k == k_cache || v == v_cache) {  // training: a chunk that is the whole cache (checked one by one)
    Backend::cache_write_kv(k, v, k_cache, v_cache, pos0, B, T, S, W);
    return;
  }
  if (B * T * W == 0) return;
  DeviceBuffer holder;
  const auto* p = static_cast<const int64_t*>(upload_reused(pos0, B * 8, holder));
  gpu_launch(k_cache_write, gpu_blocks(2 * B * T * W), kGpuThreads, 0, stream_, k, k_cache, v, v_cache, p, B, T, S,
             W);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
