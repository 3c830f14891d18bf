// CPU backward of the MoE op, in two passes of tiles shared out among the threads.
// Row tiles (at most kMoeRowTile rows of one expert): recompute the hidden activations
// H = X GateUp^T and act = SwiGLU(H); dA = dY Down with dY the unweighted output gradient; the
// router weight's gradient dweight = dA . act (= dY . expert(x), without recomputing the down
// GEMM); dAct = weight * dA; SwiGLU backward to dH; dX += dH GateUp.
// Weight-gradient tiles (a band of one expert's gradient rows): dDown += (weight*dY)^T act and
// dGateUp += dH^T X over all the expert's rows, so no two threads write the same gradient row.
// Skip-class tokens: dweight = dY . x and dX += weight * dY with skip_identity, else nothing.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vector_math.h"

namespace zaya {

namespace {
constexpr int64_t kMoeGradRowBand = 64;  // gradient rows per weight-gradient tile

std::vector<MoeTile> weight_gradient_tiles(const MoePlan& plan, int64_t E, int64_t D, int64_t I, bool gate_up,
                                           bool down) {
  std::vector<MoeTile> tiles;
  for (int64_t e = 0; e < E; ++e) {
    if (plan.offsets[size_t(e + 1)] == plan.offsets[size_t(e)]) continue;
    if (gate_up)
      for (int64_t r = 0; r < 2 * I; r += kMoeGradRowBand)
        tiles.push_back({e, r, std::min(kMoeGradRowBand, 2 * I - r), false});
    if (down)
      for (int64_t r = 0; r < D; r += kMoeGradRowBand)
        tiles.push_back({e, r, std::min(kMoeGradRowBand, D - r), true});
  }
  return tiles;
}
}  // namespace

void CpuBackend::moe_backward(const MoeArgs& a, const float* dout, float* dx, float* dweight, float* dgate_up,
                              float* ddown) {
  const int64_t N = a.N, D = a.D, I = a.I, E = a.E;
  const MoePlan plan = plan_moe(a.expert, N, E);
  const std::vector<int64_t>& offsets = plan.offsets;
  const std::vector<int64_t>& perm = plan.perm;
  const int64_t routed = offsets[size_t(E)];
  const std::vector<MoeTile> row_tiles = moe_row_tiles(plan, E, kMoeRowTile);
  const int64_t tile_rows = moe_largest_tile(row_tiles);
  const std::vector<MoeTile> grad_tiles =
      weight_gradient_tiles(plan, E, D, I, dgate_up != nullptr, ddown != nullptr);

  // Grouped rows the weight gradients read: the inputs, weight*dY, act and dH. Uninitialised:
  // the row tiles cover every routed row and write each of these rows whole.
  const std::unique_ptr<float[]> xs(new float[size_t(routed * D)]), dys(new float[size_t(routed * D)]),
      act(new float[size_t(routed * I)]), dhid(new float[size_t(routed * 2 * I)]);
  const bool parallel = routed * D > 65536;
  run_team(parallel, [&] {
    // Scratch for the largest tile, uninitialised.
    const std::unique_ptr<float[]> scratch(new float[size_t(tile_rows * (2 * D + 3 * I))]);
    float* dy_tile = scratch.get();
    float* hid = dy_tile + tile_rows * D;
    float* da = hid + tile_rows * 2 * I;
    float* dx_tile = da + tile_rows * I;
#pragma omp for schedule(dynamic)
    for (size_t t = 0; t < row_tiles.size(); ++t) {
      const MoeTile& tile = row_tiles[t];
      const int64_t r0 = tile.row0, rows = tile.rows;
      const float* GU = a.gate_up + tile.expert * 2 * I * D;
      const float* DN = a.down + tile.expert * D * I;
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t n = perm[size_t(r0 + i)];
        std::memcpy(xs.get() + (r0 + i) * D, a.x + n * D, size_t(D) * 4);
        std::memcpy(dy_tile + i * D, dout + n * D, size_t(D) * 4);
        for (int64_t d = 0; d < D; ++d) dys[size_t((r0 + i) * D + d)] = a.weight[n] * dout[n * D + d];
      }
      cpu_gemm(true, rows, 2 * I, D, 1.0f, xs.get() + r0 * D, D, GU, D, 0.0f, hid, 2 * I);
      cpu_gemm(false, rows, I, D, 1.0f, dy_tile, D, DN, I, 0.0f, da, I);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t n = perm[size_t(r0 + i)];
        const float w = a.weight[n];
        const float* gate = hid + i * 2 * I;
        const float* up = gate + I;
        const float* da_row = da + i * I;
        float* act_row = act.get() + (r0 + i) * I;
        float* dgate = dhid.get() + (r0 + i) * 2 * I;
        float* dup = dgate + I;
        for (int64_t j = 0; j < I; ++j) {
          const float g = gate[j], u = up[j];
          const float sg = 1.0f / (1.0f + exp_vectorisable(-g));
          const float silu = g * sg;
          act_row[j] = silu * u;
          const float dact = w * da_row[j];
          dgate[j] = dact * u * sg * (1.0f + g * (1.0f - sg));
          dup[j] = dact * silu;
        }
        dweight[n] = float(dot_of(da_row, act_row, I));
      }
      cpu_gemm(false, rows, D, 2 * I, 1.0f, dhid.get() + r0 * 2 * I, 2 * I, GU, D, 0.0f, dx_tile, D);
      for (int64_t i = 0; i < rows; ++i) {
        float* dxn = dx + perm[size_t(r0 + i)] * D;
        const float* g = dx_tile + i * D;
        for (int64_t d = 0; d < D; ++d) dxn[d] += g[d];
      }
    }
    // The implicit barrier of the loop above: every row's act, dY and dH is written.
#pragma omp for schedule(dynamic)
    for (size_t t = 0; t < grad_tiles.size(); ++t) {
      const MoeTile& tile = grad_tiles[t];
      const int64_t r0 = offsets[size_t(tile.expert)], rows = offsets[size_t(tile.expert + 1)] - r0;
      if (tile.down)
        cpu_gemm_tn(tile.rows, I, rows, 1.0f, dys.get() + r0 * D + tile.row0, D, act.get() + r0 * I, I, 1.0f,
                    ddown + tile.expert * D * I + tile.row0 * I, I);
      else
        cpu_gemm_tn(tile.rows, D, rows, 1.0f, dhid.get() + r0 * 2 * I + tile.row0, 2 * I, xs.get() + r0 * D,
                    D, 1.0f, dgate_up + tile.expert * 2 * I * D + tile.row0 * D, D);
    }
  });
#pragma omp parallel for if ((N - routed) * D > 65536)
  for (int64_t i = routed; i < N; ++i) {
    const int64_t n = perm[size_t(i)];
    double dw = 0;
    if (a.skip_identity) {
      const float* g = dout + n * D;
      const float* x = a.x + n * D;
      float* dxn = dx + n * D;
      for (int64_t d = 0; d < D; ++d) {
        dw += double(g[d]) * x[d];
        dxn[d] += a.weight[n] * g[d];
      }
    }
    dweight[n] = float(dw);
  }
}

}  // namespace zaya
