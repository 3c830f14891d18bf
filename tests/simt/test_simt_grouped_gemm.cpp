// The pipelined tensor-core grouped GEMMs (src/backend/cuda/gpu_grouped_gemm_mma_kernels.h), run on
// the CPU by the host GPU emulation (simt_runtime.h), against plain products in double of the same
// bf16 operands. The kernels are the very source nvcc compiles; the launches repeat
// grouped_gemm_rows_mma / grouped_gemm_weights_mma's grids. Shapes cover ragged experts (one
// empty, one over a 128-row tile), K and N off the 32 / 128 tile edges (the zero-filled copies),
// both stored orders of B, alpha and beta. bf16 products are exact in fp32, so the only difference
// is fp32 summation order: 1e-5 of the largest magnitude.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/gpu_grouped_gemm_mma_kernels.h"
#include "test_helpers.h"

namespace zaya {
namespace {

using grouped_mma::kBM;
using grouped_mma::kBN;
using grouped_mma::kThreads;

constexpr double kTol = 1e-5;

// Random bf16 values (stored) and their exact fp32 values (the conversions are gpu_device.h's,
// plain C++ under the emulation).
struct Bf16Matrix {
  std::vector<uint16_t> bits;
  std::vector<float> values;
};

Bf16Matrix random_bf16(size_t n, uint64_t seed) {
  const std::vector<float> v = test::random_vector(n, seed);
  Bf16Matrix m;
  for (float x : v) {
    m.bits.push_back(f32_to_bf16(x));
    m.values.push_back(bf16_to_f32(m.bits.back()));
  }
  return m;
}

int64_t tiles(int64_t n, int64_t tile) { return (n + tile - 1) / tile; }

void expect_close(const std::vector<float>& got, const std::vector<double>& want, const std::string& what) {
  const std::vector<float> w(want.begin(), want.end());
  const double err = test::max_rel_err(got.data(), w.data(), got.size());
  EXPECT_LT(err, kTol) << what << ": max rel err " << err;
}

// Rows kind: C[r, :] = alpha A[r, :] op(B_e) + beta C[r, :] for the rows r of every expert e.
void check_rows(const std::vector<int32_t>& offsets, int64_t N, int64_t K, bool b_trans, float alpha, float beta,
                uint64_t seed) {
  const int64_t E = int64_t(offsets.size()) - 1, rows = offsets.back();
  const std::string what = "rows kind E " + std::to_string(E) + " rows " + std::to_string(rows) + " N " +
                           std::to_string(N) + " K " + std::to_string(K) + (b_trans ? " B [N, K]" : " B [K, N]") +
                           " beta " + std::to_string(beta);
  const int64_t lda = K + 8, ldb = b_trans ? K : N, stride_b = N * K + 16, ldc = N + 4;
  const Bf16Matrix A = random_bf16(size_t(rows * lda), seed), B = random_bf16(size_t(E * stride_b), seed + 1);
  std::vector<float> C = test::random_vector(size_t(rows * ldc), seed + 2);
  std::vector<double> want(C.begin(), C.end());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = offsets[size_t(e)]; r < offsets[size_t(e + 1)]; ++r)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          const float b = B.values[size_t(e * stride_b + (b_trans ? n * ldb + k : k * ldb + n))];
          s += double(A.values[size_t(r * lda + k)]) * b;
        }
        want[size_t(r * ldc + n)] = alpha * s + beta * double(C[size_t(r * ldc + n)]);
      }
  const dim3 grid(unsigned(tiles(rows, kBM) + E), unsigned(tiles(N, kBN)));
  if (b_trans)
    simt::launch(grid, dim3(kThreads), grouped_mma::smem_bytes<true, true>(), [&] {
      grouped_mma::k_grouped_rows_mma<true>(offsets.data(), E, N, K, alpha, A.bits.data(), lda, B.bits.data(), ldb,
                                            stride_b, beta, C.data(), ldc);
    });
  else
    simt::launch(grid, dim3(kThreads), grouped_mma::smem_bytes<true, false>(), [&] {
      grouped_mma::k_grouped_rows_mma<false>(offsets.data(), E, N, K, alpha, A.bits.data(), lda, B.bits.data(), ldb,
                                             stride_b, beta, C.data(), ldc);
    });
  expect_close(C, want, what);
}

// Weights kind: C_e = alpha A_e^T B_e + beta C_e, the expert's rows being the K dimension.
void check_weights(const std::vector<int32_t>& offsets, int64_t M, int64_t N, float alpha, float beta,
                   uint64_t seed) {
  const int64_t E = int64_t(offsets.size()) - 1, rows = offsets.back();
  const std::string what = "weights kind E " + std::to_string(E) + " rows " + std::to_string(rows) + " M " +
                           std::to_string(M) + " N " + std::to_string(N) + " beta " + std::to_string(beta);
  const int64_t lda = M + 8, ldb = N, ldc = N + 4, stride_c = M * ldc + 12;
  const Bf16Matrix A = random_bf16(size_t(rows * lda), seed), B = random_bf16(size_t(rows * ldb), seed + 1);
  std::vector<float> C = test::random_vector(size_t(E * stride_c), seed + 2);
  std::vector<double> want(C.begin(), C.end());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double s = 0;
        for (int64_t r = offsets[size_t(e)]; r < offsets[size_t(e + 1)]; ++r)
          s += double(A.values[size_t(r * lda + m)]) * B.values[size_t(r * ldb + n)];
        const size_t at = size_t(e * stride_c + m * ldc + n);
        want[at] = alpha * s + beta * double(C[at]);
      }
  const dim3 grid(unsigned(tiles(M, kBM) * tiles(N, kBN)), 1, unsigned(E));
  simt::launch(grid, dim3(kThreads), grouped_mma::smem_bytes<false, false>(), [&] {
    grouped_mma::k_grouped_weights_mma(offsets.data(), M, N, alpha, A.bits.data(), lda, B.bits.data(), ldb, beta,
                                       C.data(), ldc, stride_c);
  });
  expect_close(C, want, what);
}

// Warps in step, warp 0 ahead (copies at the wait, then at issue), the last warp ahead.
const simt::Schedule kSchedules[] = {{true, false, false}, {false, false, false}, {false, true, false},
                                     {false, false, true}};

TEST(SimtGroupedGemm, RowsKindMatchesPlainProducts) {
  uint64_t seed = 7;
  for (const simt::Schedule& schedule : kSchedules) {
    simt::set_schedule(schedule);
    check_rows({0, 37, 37, 200}, 72, 40, true, 1.0f, 0.0f, seed += 10);    // an empty expert, K off the 32 edge
    check_rows({0, 130, 150}, 136, 96, false, 0.5f, 1.0f, seed += 10);     // N past one 128 tile, accumulate
    check_rows({0, 8, 16, 24, 32}, 8, 16, true, 1.0f, 0.25f, seed += 10);  // tiny experts, one k step
    check_rows({0, 50, 90}, 75, 24, true, 1.0f, 0.0f, seed += 10);  // an odd N (B stored [N, K]): C's padding kept
  }
  simt::set_schedule({});
}

TEST(SimtGroupedGemm, WeightsKindMatchesPlainProducts) {
  uint64_t seed = 101;
  for (const simt::Schedule& schedule : kSchedules) {
    simt::set_schedule(schedule);
    check_weights({0, 37, 37, 200}, 40, 72, 1.0f, 0.0f, seed += 10);  // an empty expert (C_e = beta C_e)
    check_weights({0, 70, 100}, 136, 24, 2.0f, 1.0f, seed += 10);     // M past one 128 tile
  }
  simt::set_schedule({});
}

}  // namespace
}  // namespace zaya
