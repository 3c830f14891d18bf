// Warp-level tensor-core and copy primitives for CUDA sm_80 and newer, with each fragment's
// register layout written out, so a kernel can mask, exponentiate and rescale a product in
// registers (flash attention) instead of round-tripping it through shared memory as WMMA's
// opaque fragments force:
//   mma_16816      D[16x8] += A[16x16] B[16x8], bf16 operands, fp32 accumulators;
//   load_a / load_a_trans / load_b / load_b_trans   fragments from bf16 tiles in shared memory;
//   pack_bf16x2    two fp32 values rounded (to nearest even) into one bf16 pair;
//   c_to_a, mma_rows   a product's C fragments as the next product's A, times a [k][n] tile;
//   cp_async16     a 16-byte global -> shared copy that does not hold the thread (or_zero: zero
//                  fill for the parts of a tile past a matrix's edge).
// Fragment layout (PTX ISA, mma.m16n8k16, lane = 4 * group + quad):
//   A: a[0] = (row group,     cols 2 quad, 2 quad + 1)   a[1] = (row group + 8, same cols)
//      a[2] = (row group,     cols 2 quad + 8, + 9)      a[3] = (row group + 8, cols + 8)
//   B: b[0] = (rows 2 quad, 2 quad + 1, col group)       b[1] = (rows + 8, col group)
//   C: c[0], c[1] = (row group, cols 2 quad, 2 quad + 1) c[2], c[3] = (row group + 8, same)
// A register holds the lower-indexed element of its pair in its low 16 bits. CUDA only (HIP
// keeps the portable kernels); the instructions trap below sm_80, where callers never go. Under
// ZAYA_SIMT (the host emulation of tests/simt) the warp-wide instructions are emulated there,
// from the same layouts as the PTX ISA states them.
#pragma once

#include <cstdint>

#include "backend/cuda/gpu_device.h"

#if (defined(ZAYA_GPU_CUDA) && defined(__CUDACC__)) || defined(ZAYA_SIMT)

namespace zaya::mma {

__device__ inline int group_of(int lane) { return lane >> 2; }
__device__ inline int quad_of(int lane) { return lane & 3; }

__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#elif defined(ZAYA_SIMT)
  simt::mma_m16n8k16_bf16(d, a, b);
#else
  (void)d; (void)a; (void)b;
  __trap();
#endif
}

// bf16(lo) in the low half, bf16(hi) in the high half, both rounded to nearest even.
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return uint32_t(f32_to_bf16(lo)) | (uint32_t(f32_to_bf16(hi)) << 16);
#endif
}

__device__ inline uint32_t load_pair(const bf16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

// The A fragment of rows r0..r0+15, columns k0..k0+15 of a row-major tile (row stride ld, even).
__device__ inline void load_a(uint32_t (&a)[4], const bf16_t* tile, int ld, int r0, int k0, int lane) {
  const bf16_t* p = tile + (r0 + group_of(lane)) * ld + k0 + 2 * quad_of(lane);
  a[0] = load_pair(p);
  a[1] = load_pair(p + 8 * ld);
  a[2] = load_pair(p + 8);
  a[3] = load_pair(p + 8 * ld + 8);
}

// The B fragment (k0..k0+15 x n0..n0+7) of a matrix held transposed, as a row-major [n][k]
// tile: B(k, n) = tile[n * ld + k]. This is K for S = Q K^T: its rows are the columns of B.
__device__ inline void load_b(uint32_t (&b)[2], const bf16_t* tile, int ld, int n0, int k0, int lane) {
  const bf16_t* p = tile + (n0 + group_of(lane)) * ld + k0 + 2 * quad_of(lane);
  b[0] = load_pair(p);
  b[1] = load_pair(p + 8);
}

// The B fragment (k0..k0+15 x n0..n0+7) of a row-major [k][n] tile, B(k, n) = tile[k * ld + n]
// (V for O = P V), through ldmatrix's transposing load. ld * 2 bytes and n0 must keep every row
// address 16-byte aligned.
__device__ inline void load_b_trans(uint32_t (&b)[2], const bf16_t* tile, int ld, int k0, int n0, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Lanes 0-7 address rows k0..k0+7 (the first 8x8 matrix), lanes 8-15 rows k0+8..k0+15; the
  // addresses of lanes 16-31 are not read by .x2 (they repeat 0-15).
  const bf16_t* row = tile + (k0 + (lane & 15)) * ld + n0;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(b[0]), "=r"(b[1])
               : "r"(addr)
               : "memory");  // reads shared memory the compiler cannot see: no plain stores move past it
#elif defined(ZAYA_SIMT)
  simt::ldmatrix_trans2(b, tile + (k0 + (lane & 15)) * ld + n0);
#else
  (void)b; (void)tile; (void)ld; (void)k0; (void)n0; (void)lane;
  __trap();
#endif
}

// The A fragment (rows m0..m0+15, k0..k0+15) of a matrix held transposed, as a row-major [k][m]
// tile: A(m, k) = tile[k * ld + m] (a weight gradient's A^T), through ldmatrix's transposing
// load of four 8x8 matrices. Same alignment rule as load_b_trans.
__device__ inline void load_a_trans(uint32_t (&a)[4], const bf16_t* tile, int ld, int m0, int k0, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  // Lane l addresses row (l & 7) of matrix l >> 3: matrices 0..3 are a[0] (k0.., m0..),
  // a[1] (k0.., m0+8..), a[2] (k0+8.., m0..) and a[3] (k0+8.., m0+8..).
  const int which = lane >> 3;
  const bf16_t* row = tile + (k0 + (lane & 7) + (which >> 1) * 8) * ld + m0 + (which & 1) * 8;
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr)
               : "memory");
#elif defined(ZAYA_SIMT)
  const int which = lane >> 3;
  simt::ldmatrix_trans4(a, tile + (k0 + (lane & 7) + (which >> 1) * 8) * ld + m0 + (which & 1) * 8);
#else
  (void)a; (void)tile; (void)ld; (void)m0; (void)k0; (void)lane;
  __trap();
#endif
}

// The A fragment of k-step kk (columns 16 kk .. 16 kk + 15) of a 16-row product held as C
// fragments c[n] (columns 8 n .. 8 n + 7), rounded to bf16: the C layout of two neighbouring
// column blocks is the A layout of their k-step, so one product feeds the next in registers.
template <int NT>
__device__ inline void c_to_a(uint32_t (&a)[4], const float (&c)[NT][4], int kk) {
  a[0] = pack_bf16x2(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack_bf16x2(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// acc[nd] += a * B for every column block nd < ND, where B is rows k0..k0+15 of a row-major
// [k][n] tile and block nd its columns 8 nd .. 8 nd + 7 (P V, dS K, P^T dO, dS^T Q).
template <int ND>
__device__ inline void mma_rows(float (&acc)[ND][4], const uint32_t (&a)[4], const bf16_t* tile, int ld, int k0,
                                int lane) {
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) {
    uint32_t b[2];
    load_b_trans(b, tile, ld, k0, 8 * nd, lane);
    mma_16816(acc[nd], a, b);
  }
}

// 16 bytes from global to shared memory, asynchronously; both addresses 16-byte aligned.
__device__ inline void cp_async16(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(global_src) : "memory");
#elif defined(ZAYA_SIMT)
  simt::cp_async16(shared_dst, global_src, true);
#else
  (void)shared_dst; (void)global_src;
  __trap();
#endif
}

// As cp_async16 when `valid`, else 16 zero bytes into shared memory (nothing is read: src may be
// any 16-byte-aligned mapped address).
__device__ inline void cp_async16_or_zero(void* shared_dst, const void* global_src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(global_src), "r"(bytes) : "memory");
#elif defined(ZAYA_SIMT)
  simt::cp_async16(shared_dst, global_src, valid);
#else
  (void)shared_dst; (void)global_src; (void)valid;
  __trap();
#endif
}

// Closes the group of copies issued since the last commit.
__device__ inline void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(ZAYA_SIMT)
  simt::cp_async_commit();
#endif
}

// Waits until at most `pending` of this thread's committed groups are still in flight.
template <int pending>
__device__ inline void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
#elif defined(ZAYA_SIMT)
  simt::cp_async_wait(pending);
#endif
}

}  // namespace zaya::mma

#endif
