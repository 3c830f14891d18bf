// CPU mixture-of-experts op: plan (per-expert histogram, offsets, token permutation), then tiles
// of at most kMoeRowTile rows of one expert each, shared out among the threads: gather the
// tile's tokens, gate_up GEMM, SwiGLU, down GEMM, and a scatter that applies the unbiased router
// weight. Skip-class tokens output 0 or weight*x.
#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/vector_math.h"

namespace zaya {

MoePlan plan_moe(const int32_t* expert, int64_t N, int64_t E) {
  MoePlan p;
  p.offsets.assign(static_cast<size_t>(E + 2), 0);
  for (int64_t n = 0; n < N; ++n) p.offsets[size_t(expert[n]) + 1]++;
  for (int64_t e = 0; e <= E; ++e) p.offsets[size_t(e + 1)] += p.offsets[size_t(e)];
  p.perm.resize(static_cast<size_t>(N));
  std::vector<int64_t> cursor(p.offsets.begin(), p.offsets.end() - 1);
  for (int64_t n = 0; n < N; ++n) p.perm[size_t(cursor[size_t(expert[n])]++)] = n;
  return p;
}

std::vector<MoeTile> moe_row_tiles(const MoePlan& plan, int64_t E, int64_t max_rows) {
  std::vector<MoeTile> tiles;
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = plan.offsets[size_t(e)]; r < plan.offsets[size_t(e + 1)]; r += max_rows)
      tiles.push_back({e, r, std::min(max_rows, plan.offsets[size_t(e + 1)] - r)});
  return tiles;
}

int64_t moe_largest_tile(const std::vector<MoeTile>& tiles) {
  int64_t rows = 0;
  for (const MoeTile& t : tiles) rows = std::max(rows, t.rows);
  return rows;
}

void CpuBackend::moe(const MoeArgs& a) {
  const int64_t N = a.N, D = a.D, I = a.I, E = a.E;
  const MoePlan plan = plan_moe(a.expert, N, E);
  const std::vector<int64_t>& perm = plan.perm;
  const int64_t routed = plan.offsets[size_t(E)];
  const std::vector<MoeTile> tiles = moe_row_tiles(plan, E, kMoeRowTile);
  const int64_t tile_rows = moe_largest_tile(tiles);

  // Tiles run one per thread, each GEMM single-threaded inside the team; a small batch runs its
  // tiles in turn on this thread, with the BLAS's own threads.
  run_team(routed * D > 65536, [&] {
    // Scratch for the largest tile, uninitialised (a decode step's single row needs one row).
    const std::unique_ptr<float[]> scratch(new float[size_t(tile_rows * (2 * D + 3 * I))]);
    float* xs = scratch.get();
    float* hidden = xs + tile_rows * D;
    float* act = hidden + tile_rows * 2 * I;
    float* ys = act + tile_rows * I;
#pragma omp for schedule(dynamic)
    for (size_t t = 0; t < tiles.size(); ++t) {
      const MoeTile& tile = tiles[t];
      const int64_t rows = tile.rows;
      for (int64_t i = 0; i < rows; ++i)
        std::memcpy(xs + i * D, a.x + perm[size_t(tile.row0 + i)] * D, size_t(D) * 4);
      cpu_gemm(true, rows, 2 * I, D, 1.0f, xs, D, a.gate_up + tile.expert * 2 * I * D, D, 0.0f, hidden,
               2 * I);
      for (int64_t i = 0; i < rows; ++i) {
        const float* gate = hidden + i * 2 * I;
        const float* up = gate + I;
        float* o = act + i * I;
        for (int64_t j = 0; j < I; ++j) o[j] = gate[j] / (1.0f + exp_vectorisable(-gate[j])) * up[j];
      }
      cpu_gemm(true, rows, D, I, 1.0f, act, I, a.down + tile.expert * D * I, I, 0.0f, ys, D);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t n = perm[size_t(tile.row0 + i)];
        const float w = a.weight[n];
        const float* y = ys + i * D;
        float* out = a.out + n * D;
        for (int64_t d = 0; d < D; ++d) out[d] = w * y[d];
      }
    }
  });
  // Skip-class tokens: weight*x or 0.
#pragma omp parallel for if ((N - routed) * D > 65536)
  for (int64_t i = routed; i < N; ++i) {
    const int64_t n = perm[size_t(i)];
    float* out = a.out + n * D;
    if (a.skip_identity) {
      const float w = a.weight[n];
      const float* x = a.x + n * D;
      for (int64_t d = 0; d < D; ++d) out[d] = w * x[d];
    } else {
      std::memset(out, 0, size_t(D) * 4);
    }
  }
}

}  // namespace zaya
