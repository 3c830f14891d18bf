// How sensitive Muon's Newton-Schulz (5 quintic steps, the coefficients of
// src/backend/cuda/ops_optim.cu) is to bf16 operands, measured on the host: why the GPU tests
// of bf16 Newton-Schulz (the GPU backend's default) cannot compare element by element, and the
// size of the error that bf16 operands bring (docs/gpu.md, "Precision policy").
// For a few shapes it compares, by max|a - b| / max|b| over the output (and, for the bf16
// rows, by the Frobenius norm ||a - b|| / ||b||, the *_rel_l2 fields):
//   bf16_vs_fp32        bf16-rounded GEMM operands against fp32 operands (both OpenBLAS sgemm);
//   bf16_order          two bf16-operand runs that differ only in accumulation order (sgemm
//                       against sums in double): how far apart two correct bf16 implementations
//                       (a GPU and the CPU) can land;
//   fp32_order          the same for fp32 operands;
//   iter_vs_fp32,       the same two measures with bf16 iterates as well (X, A and B stored in
//   iter_order          bf16 between the products, as CudaBackendOptions::newton_schulz_bf16_iterates
//                       runs it): its error, and the spread between two correct implementations.
// Prints one JSON object per shape on stdout.
//   build/bin/ns_bf16_study
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace {

using Matrix = std::vector<float>;

float round_bf16(float x) { return zaya::bf16_to_f32(zaya::f32_to_bf16(x)); }  // nearest even, as the GPU

enum class Sum { Sgemm, Double };

// Operands, iterates or neither in bf16.
enum class Precision { Fp32, Bf16Operands, Bf16Iterates };

void round_all(Matrix& m) {
  for (float& v : m) v = round_bf16(v);
}

// C[M, N] = alpha * A[M, K] op(B) + beta * C, op(B) = B^T ([N, K] stored) when b_trans.
void gemm(Sum sum, bool bf16, int M, int N, int K, float alpha, const Matrix& A, const Matrix& B, bool b_trans,
          float beta, Matrix& C) {
  Matrix a = A, b = B;
  if (bf16) {
    for (float& x : a) x = round_bf16(x);
    for (float& x : b) x = round_bf16(x);
  }
  if (sum == Sum::Sgemm) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, b_trans ? CblasTrans : CblasNoTrans, M, N, K, alpha, a.data(), K,
                b.data(), b_trans ? K : N, beta, C.data(), N);
    return;
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        s += double(a[size_t(i) * K + k]) * (b_trans ? b[size_t(j) * K + k] : b[size_t(k) * N + j]);
      C[size_t(i) * N + j] = float(alpha * s + beta * double(C[size_t(i) * N + j]));
    }
}

Matrix newton_schulz(Matrix x, int r, int c, Sum sum, Precision p) {
  const float a = 3.4445f, b = -4.7750f, cc = 2.0315f;
  const bool bf16 = p != Precision::Fp32, iterates = p == Precision::Bf16Iterates;
  double ss = 0;
  for (float v : x) ss += double(v) * v;
  const float inv = float(1.0 / (std::sqrt(ss) + 1e-7));
  for (float& v : x) v *= inv;
  if (iterates) round_all(x);
  for (int step = 0; step < 5; ++step) {
    Matrix A(size_t(r) * r), y = x;
    gemm(sum, bf16, r, r, c, 1.0f, x, x, true, 0.0f, A);  // A = X X^T
    if (iterates) round_all(A);
    Matrix B = A;
    gemm(sum, bf16, r, r, r, cc, A, A, false, b, B);  // B = b A + c A A
    if (iterates) round_all(B);
    gemm(sum, bf16, r, c, r, 1.0f, B, x, false, a, y);  // Y = a X + B X
    if (iterates) round_all(y);
    x = y;
  }
  return x;
}

double max_rel(const Matrix& got, const Matrix& ref) {
  double m = 0, e = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    m = std::max(m, double(std::fabs(ref[i])));
    e = std::max(e, double(std::fabs(got[i] - ref[i])));
  }
  return e / m;
}

double rel_l2(const Matrix& got, const Matrix& ref) {  // ||got - ref||_F / ||ref||_F
  double d = 0, n = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    d += double(got[i] - ref[i]) * double(got[i] - ref[i]);
    n += double(ref[i]) * ref[i];
  }
  return std::sqrt(d / n);
}

}  // namespace

int main() {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  // The last four are the wide orientations of tests/gpu/test_gpu_ns_bf16.cpp's shapes.
  const int shapes[][2] = {{8, 8}, {64, 96}, {50, 200}, {256, 512}, {40, 130}, {64, 64}, {48, 80}, {40, 96}};
  for (const auto& shape : shapes) {
    const int r = shape[0], c = shape[1];
    Matrix x(size_t(r) * c);
    for (float& v : x) v = nd(rng);
    const Matrix f32 = newton_schulz(x, r, c, Sum::Sgemm, Precision::Fp32);
    const Matrix f32_double = newton_schulz(x, r, c, Sum::Double, Precision::Fp32);
    const Matrix b16 = newton_schulz(x, r, c, Sum::Sgemm, Precision::Bf16Operands);
    const Matrix b16_double = newton_schulz(x, r, c, Sum::Double, Precision::Bf16Operands);
    const Matrix it = newton_schulz(x, r, c, Sum::Sgemm, Precision::Bf16Iterates);
    const Matrix it_double = newton_schulz(x, r, c, Sum::Double, Precision::Bf16Iterates);
    std::printf(
        "{\"rows\": %d, \"cols\": %d, \"bf16_vs_fp32\": %.3g, \"bf16_order\": %.3g, \"fp32_order\": %.3g, "
        "\"bf16_vs_fp32_rel_l2\": %.3g, \"bf16_order_rel_l2\": %.3g, \"iter_vs_fp32_rel_l2\": %.3g, "
        "\"iter_order_rel_l2\": %.3g}\n",
        r, c, max_rel(b16, f32), max_rel(b16, b16_double), max_rel(f32, f32_double), rel_l2(b16, f32),
        rel_l2(b16, b16_double), rel_l2(it, f32), rel_l2(it, it_double));
  }
  return 0;
}
