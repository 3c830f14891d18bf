// GPU backward of the CCA ops: the two causal convolutions (zero state: training runs fresh
// sequences; the grouped stage as GEMMs, ops_cca_grouped_gemm.cu, and the depthwise weight
// gradient as column sums), the mean paths + QK-norm + temperature + RoPE (recomputed per token
// and group), and the value shift. Weight gradients are reduced in a fixed order (no atomics).
// fp32 throughout. Passed against the CPU backend on an H100.
#include <cfloat>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/ops_cca_common.h"

namespace zaya {

namespace {

// du[b, t, c] += sum_k w_dw[c, k] * dy[b, t + P - k, c]   (ext row t + P is u row t)
__global__ void k_conv_depthwise_du(const float* dy, const float* w_dw, float* du, int64_t B, int64_t T, int64_t C,
                                    int64_t P, int64_t t0, int64_t Ly) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < B * T * C; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % C, t = (i / C) % T, b = i / (C * T);
    float acc = 0.0f;
    for (int64_t k = t0 - 1; k >= 0; --k) {
      const int64_t s = t + P - k;
      if (s >= 0 && s < Ly) acc += w_dw[c * t0 + k] * dy[(b * Ly + s) * C + c];
    }
    du[i] += acc;
  }
}

// dw_dw[c * t0 + k] += taps[k * C + c]
__global__ void k_add_depthwise_taps(const float* taps, float* dw_dw, int64_t C, int64_t t0) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < C * t0; i += int64_t(gridDim.x) * blockDim.x)
    dw_dw[i] += taps[(i % t0) * C + i / t0];
}

// d(pre-rotation) element i from d(out) (inverse NeoX rotation on the first 2*half dims).
__device__ inline double unrotate(const float* dout, const float* cs, const float* sn, int64_t i, int64_t half) {
  if (i < half) return double(dout[i]) * cs[i] + double(dout[i + half]) * sn[i];
  if (i < 2 * half) return -double(dout[i - half]) * sn[i - half] + double(dout[i]) * cs[i - half];
  return dout[i];
}

// Pre-norm values as the CPU backward recomputes them.
__device__ inline float q_pre(const float* z, const float* u, int64_t h, int64_t g, int64_t i, int64_t dh,
                              int64_t Dq) {
  return z[h * dh + i] + 0.5f * (u[h * dh + i] + u[Dq + g * dh + i]);
}
__device__ inline float k_pre(const float* z, const float* u, int64_t g, int64_t i, int64_t dh, int64_t Dq,
                              int64_t rep) {
  float mq = 0.0f;
  for (int64_t r = 0; r < rep; ++r) mq += u[(g * rep + r) * dh + i];
  return z[Dq + g * dh + i] + 0.5f * mq / float(rep) + 0.5f * u[Dq + g * dh + i];
}

// One warp per (token, KV group): the group's query heads, then its key head. The lanes stride
// over a head's dims (coalesced) and each lane owns the du elements of its dims (its group's q
// heads and k head), so there are no races; the norms' sums are fixed butterflies.
__global__ void k_cca_qk_backward(const float* zz, const float* uu, const float* temp, const float* cs_t,
                                  const float* sn_t, const float* dq, const float* dk, float* dzz, float* duu,
                                  double* dtemp_tok, int64_t N, int64_t Hq, int64_t Hkv, int64_t dh, int64_t half) {
  const int64_t C = (Hq + Hkv) * dh, Dq = Hq * dh, rep = Hq / Hkv;
  const double sdh = sqrt(double(dh));
  const int64_t lane = threadIdx.x % GPU_WARP_SIZE, warps = int64_t(gridDim.x) * (blockDim.x / GPU_WARP_SIZE);
  for (int64_t item = int64_t(blockIdx.x) * (blockDim.x / GPU_WARP_SIZE) + threadIdx.x / GPU_WARP_SIZE;
       item < N * Hkv; item += warps) {
    const int64_t n = item / Hkv, g = item % Hkv;
    const float* z = zz + n * C;
    const float* u = uu + n * C;
    float* dz = dzz + n * C;
    float* du = duu + n * C;
    const float* cs = cs_t + n * half;
    const float* sn = sn_t + n * half;
    for (int64_t h = g * rep; h < (g + 1) * rep; ++h) {
      const float* dout = dq + (n * Hq + h) * dh;
      double ss = 0, vda = 0;
      for (int64_t i = lane; i < dh; i += GPU_WARP_SIZE) {
        const double v = q_pre(z, u, h, g, i, dh, Dq);
        ss += v * v;
        vda += v * unrotate(dout, cs, sn, i, half);
      }
      ss = warp_sum(ss);
      vda = warp_sum(vda);
      const double nrm = sqrt(ss);
      for (int64_t i = lane; i < dh; i += GPU_WARP_SIZE) {
        const double da = unrotate(dout, cs, sn, i, half);
        const double dv = nrm > FLT_EPSILON ? sdh / nrm * (da - double(q_pre(z, u, h, g, i, dh, Dq)) * vda / ss)
                                            : sdh / double(FLT_EPSILON) * da;
        dz[h * dh + i] = float(dv);
        du[h * dh + i] += float(0.5 * dv);
        du[Dq + g * dh + i] += float(0.5 * dv);
      }
    }
    const float* dout = dk + (n * Hkv + g) * dh;
    const double mult = temp[g];
    double ss = 0, vda = 0;
    for (int64_t i = lane; i < dh; i += GPU_WARP_SIZE) {
      const double v = k_pre(z, u, g, i, dh, Dq, rep);
      ss += v * v;
      vda += v * unrotate(dout, cs, sn, i, half);
    }
    ss = warp_sum(ss);
    vda = warp_sum(vda);
    const double nrm = sqrt(ss);
    if (lane == 0) dtemp_tok[n * Hkv + g] = vda * sdh / (nrm > double(FLT_EPSILON) ? nrm : double(FLT_EPSILON));
    for (int64_t i = lane; i < dh; i += GPU_WARP_SIZE) {
      const double da = unrotate(dout, cs, sn, i, half);
      const double dv = nrm > FLT_EPSILON
                            ? sdh * mult / nrm * (da - double(k_pre(z, u, g, i, dh, Dq, rep)) * vda / ss)
                            : sdh * mult / double(FLT_EPSILON) * da;
      dz[Dq + g * dh + i] = float(dv);
      du[Dq + g * dh + i] += float(0.5 * dv);
      for (int64_t r = 0; r < rep; ++r) du[(g * rep + r) * dh + i] += float(0.5 * dv / double(rep));
    }
  }
}

// One block per KV group: dtemp[g] += sum over tokens of dtemp_tok[n, g], in a fixed order
// (each thread's strided partial, then the block's tree).
__global__ void k_dtemp(const double* dtemp_tok, float* dtemp, int64_t N, int64_t Hkv) {
  __shared__ double sh[kGpuThreads];
  const int64_t g = blockIdx.x;
  double s = 0;
  for (int64_t n = threadIdx.x; n < N; n += blockDim.x) s += dtemp_tok[n * Hkv + g];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) dtemp[g] += float(s);
}

__global__ void k_values_backward(const float* dv, float* dv_cur, float* dv_del, const int32_t* seg, int64_t B,
                                  int64_t T, int64_t h) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < B * T * h; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % h, t = (i / h) % T, b = i / (h * T);
    dv_cur[i] = dv[(b * T + t) * 2 * h + j];
    // dv_del[t] comes from the delayed half of token t + 1 (none for the last token, none
    // across a document start).
    const bool has_next = t + 1 < T && !(seg && seg[b * T + t + 1] == t + 1);
    dv_del[i] = has_next ? dv[(b * T + t + 1) * 2 * h + h + j] : 0.0f;
  }
}

}  // namespace

void CudaBackend::cca_conv_backward_rows(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw,
                                         float* db_dw, float* dw_grp, float* db_grp) {
  const int64_t B = a.B, T = a.T, C = a.C, P = (a.t0 - 1) + (a.t1 - 1), G = a.group, Ly = T + a.t1 - 1;
  if (B * T == 0) return;
  DeviceBuffer y(this, B * Ly * C * 4), dy(this, B * Ly * C * 4);
  launch_conv_depthwise(stream_, a.u, nullptr, a.w_dw, a.b_dw, y.f(), B, T, C, P, a.t0, a.t1);
  grouped_conv_gemm_backward(*this, dz, y.f(), a.w_grp, dy.f(), dw_grp, B, T, C, G, a.t1);
  if (db_grp) gpu_column_sums(*this, B * T, C, db_grp, dz, C, nullptr, nullptr, nullptr, nullptr);
  gpu_launch(k_conv_depthwise_du, gpu_blocks(B * T * C), kGpuThreads, 0, stream_, dy.f(), a.w_dw, du, B, T, C,
             P, a.t0, Ly);
  GPU_LAUNCH_CHECK();
  if (dw_dw) {
    // Tap k: dw_dw[c, k] = sum_b sum_s dy[b, s, c] u[b, s + k - P, c] over the rows s >= P - k
    // (earlier ones read the zero state), as deterministic column sums of products.
    DeviceBuffer taps(this, a.t0 * C * 4);
    fill(taps.f(), 0.0f, a.t0 * C);
    for (int64_t k = 0; k < a.t0; ++k) {
      const int64_t s0 = P - k, rows = Ly - s0;
      if (rows <= 0) continue;
      for (int64_t b = 0; b < B; ++b)
        gpu_column_sums(*this, rows, C, taps.f() + k * C, dy.f() + (b * Ly + s0) * C, C, a.u + b * T * C, nullptr,
                        nullptr, nullptr);
    }
    gpu_launch(k_add_depthwise_taps, gpu_blocks(C * a.t0), kGpuThreads, 0, stream_, taps.f(), dw_dw, C, a.t0);
    GPU_LAUNCH_CHECK();
  }
  if (db_dw) gpu_column_sums(*this, B * Ly, C, db_dw, dy.f(), C, nullptr, nullptr, nullptr, nullptr);
}

void CudaBackend::cca_conv_backward(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw, float* db_dw,
                                    float* dw_grp, float* db_grp) {
  if (!a.seg_start) return cca_conv_backward_rows(a, dz, du, dw_dw, db_dw, dw_grp, db_grp);
  // Packed documents: the ordinary backward over the expanded rows (zero output gradient on
  // the inserted ones), as backend/cpu/ops_cca_segments.cpp.
  const int64_t C = a.C, T = a.T, P = (a.t0 - 1) + (a.t1 - 1);
  for (int64_t b = 0; b < a.B; ++b) {
    std::vector<int32_t> row_of;
    const int64_t Te = expanded_rows(a.seg_start + b * T, T, P, row_of);
    DeviceBuffer rows = upload(row_of.data(), T * 4);
    DeviceBuffer ue(this, Te * C * 4), dze(this, Te * C * 4), due(this, Te * C * 4);
    fill(ue.f(), 0.0f, Te * C);
    fill(dze.f(), 0.0f, Te * C);
    fill(due.f(), 0.0f, Te * C);
    launch_scatter_rows(stream_, a.u + b * T * C, rows.i(), T, C, ue.f(), false);
    launch_scatter_rows(stream_, dz + b * T * C, rows.i(), T, C, dze.f(), false);
    CcaConvArgs row = a;
    row.seg_start = nullptr;
    row.B = 1; row.T = Te; row.u = ue.f(); row.z = nullptr; row.state = nullptr;
    cca_conv_backward_rows(row, dze.f(), due.f(), dw_dw, db_dw, dw_grp, db_grp);
    launch_gather_rows(stream_, due.f(), rows.i(), T, C, du + b * T * C, true);
  }
}

void CudaBackend::cca_qk_backward(const CcaQkArgs& a, const float* dq, const float* dk, float* dz, float* du,
                                  float* dtemp) {
  const int64_t N = a.N, half = a.rotary_dim / 2;
  if (N == 0) return;
  DeviceBuffer pos_holder;
  const auto* pos = static_cast<const int64_t*>(upload_reused(a.positions, N * 8, pos_holder));
  DeviceBuffer cs(this, (half > 0 ? N * half : 1) * 4), sn(this, (half > 0 ? N * half : 1) * 4);
  DeviceBuffer tok(this, N * a.Hkv * 8);
  if (half > 0) launch_rope_table(stream_, pos, N, half, a.rotary_dim, a.theta, cs.f(), sn.f());
  gpu_launch(k_cca_qk_backward, gpu_warp_blocks(N * a.Hkv, warp_size_), kGpuThreads, 0, stream_, a.z, a.u,
             a.temp, cs.f(), sn.f(), dq, dk, dz, du, tok.d(), N, a.Hq, a.Hkv, a.dh, half);
  GPU_LAUNCH_CHECK();
  if (dtemp) {
    gpu_launch(k_dtemp, unsigned(a.Hkv), kGpuThreads, 0, stream_, tok.d(), dtemp, N, a.Hkv);
    GPU_LAUNCH_CHECK();
  }
}

void CudaBackend::cca_values_backward(const float* dv, float* dv_cur, float* dv_del, int64_t B, int64_t T,
                                      int64_t half, const int32_t* seg_start) {
  if (B * T * half == 0) return;
  DeviceBuffer seg;
  if (seg_start) seg = upload(seg_start, B * T * 4);
  gpu_launch(k_values_backward, gpu_blocks(B * T * half), kGpuThreads, 0, stream_, dv, dv_cur, dv_del,
             seg_start ? seg.i() : nullptr, B, T, half);
  GPU_LAUNCH_CHECK();
}

}  // namespace zaya
