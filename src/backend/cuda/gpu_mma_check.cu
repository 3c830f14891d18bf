// A self-check of the warp-level tensor-core primitives (gpu_mma.h) on the device at hand: one
// warp runs each primitive on small random integers and the host compares the results with plain
// products of the same values. Integers in [-3, 3] keep every product, sum and bf16 rounding
// exact, so the comparison is for equality and any fragment-layout mistake shows as a wrong
// element. The cases:
//   mma          load_a + load_b + mma_16816            D = C + A B      (B held as [n][k])
//   b_trans      load_a + load_b_trans (ldmatrix)       D = C + A B      (B held as [k][n])
//   a_trans      load_a_trans (ldmatrix) + load_b       D = C + A B      (A held as [k][m])
//   chain        mma, c_to_a, mma_rows<2>               D = C + (A B1) V (a product fed on in registers,
//                                                       V two column blocks wide)
//   cp_async     cp_async16_or_zero, commit, wait<1>,   two groups of 16-byte rows, the invalid ones
//                wait<0>                                zeroed; the older group read after wait<1>
//   pack         pack_bf16x2 (cvt.rn.bf16x2)            round to nearest even, as f32_to_bf16
// The backend runs it once at start on sm_80 and newer when the flash attention or the
// device-grouped MoE is asked for (CudaBackend::CudaBackend), and keeps both of their mma.sync
// kernels off when it fails; tests/gpu runs it with fresh inputs. In a build without the
// mma.sync kernels (HIP, 64-lane emulation) it does not run.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_factory.h"
#include "backend/cuda/gpu_device.h"
#include "backend/cuda/gpu_mma.h"
#include "core/rng.h"

namespace zaya {
namespace {
namespace mma_check {

// bf16 inputs, in elements: each tile's offset in the input buffer and in shared memory (every
// offset a multiple of 8 elements, so every row the ldmatrix and cp.async reads is 16-byte aligned).
constexpr int kA = 0;        // A   [16][16], row-major [m][k]
constexpr int kBt = 256;     // B   as [8][16], [n][k]
constexpr int kBkn = 384;    // B   as [16][8], [k][n]
constexpr int kAt = 512;     // A   as [16][16], [k][m]
constexpr int kB1t = 768;    // B1  as [16][16], [n][k] (the chain's first product: 16 columns)
constexpr int kV = 1024;     // V   [16][16], [k][n] (the chain's second product: two column blocks)
constexpr int kTiles = 1280;  // the tiles staged to shared memory
constexpr int kCopySrc = kTiles;     // 16 rows of 8 bf16 in global memory, copied by cp.async
constexpr int kInputs = kTiles + 128;
constexpr int kCopyDst = kTiles;           // where the first group lands in shared memory
constexpr int kCopyDst2 = kTiles + 128;    // and the second
constexpr int kSharedBytes = (kTiles + 256) * 2;
constexpr int kPairs = 32;           // pack_bf16x2: one pair a lane
constexpr int kProducts = 5;         // mma, b_trans, a_trans, chain (two): [16][8] fp32 each
constexpr int kCopied = 256;         // the two groups' rows as read back

#if defined(ZAYA_GPU_MMA_SYNC)

__device__ inline void load_c(float (&d)[4], const float* c, int lane) {
  const int g = mma::group_of(lane), q = mma::quad_of(lane);
  d[0] = c[g * 8 + 2 * q];
  d[1] = c[g * 8 + 2 * q + 1];
  d[2] = c[(g + 8) * 8 + 2 * q];
  d[3] = c[(g + 8) * 8 + 2 * q + 1];
}

__device__ inline void store_c(float* out, const float (&d)[4], int lane) {
  const int g = mma::group_of(lane), q = mma::quad_of(lane);
  out[g * 8 + 2 * q] = d[0];
  out[g * 8 + 2 * q + 1] = d[1];
  out[(g + 8) * 8 + 2 * q] = d[2];
  out[(g + 8) * 8 + 2 * q + 1] = d[3];
}

// One warp. products: kProducts x [16][8]; copied: the 128 values cp.async wrote; packed: kPairs
// pairs by cvt.rn.bf16x2, and packed_want the same pairs by the kernels' software rounding.
__global__ void k_mma_check(const bf16_t* in, const float* c, const float* pack_in, float* products,
                            float* copied, uint32_t* packed, uint32_t* packed_want) {
  ZAYA_DYNAMIC_SHARED(smem);
  bf16_t* s = reinterpret_cast<bf16_t*>(smem);
  const int lane = int(threadIdx.x);
  for (int i = lane; i < kTiles; i += GPU_WARP_SIZE) s[i] = in[i];
  __syncthreads();

  uint32_t a[4], b[2];
  float d[4];
  mma::load_a(a, s + kA, 16, 0, 0, lane);  // mma
  mma::load_b(b, s + kBt, 16, 0, 0, lane);
  load_c(d, c, lane);
  mma::mma_16816(d, a, b);
  store_c(products, d, lane);

  mma::load_b_trans(b, s + kBkn, 8, 0, 0, lane);  // b_trans (a: A as before)
  load_c(d, c, lane);
  mma::mma_16816(d, a, b);
  store_c(products + 128, d, lane);

  mma::load_a_trans(a, s + kAt, 16, 0, 0, lane);  // a_trans
  mma::load_b(b, s + kBt, 16, 0, 0, lane);
  load_c(d, c, lane);
  mma::mma_16816(d, a, b);
  store_c(products + 256, d, lane);

  mma::load_a(a, s + kA, 16, 0, 0, lane);  // chain: S = A B1 in two column blocks, then S V
  float prod[2][4] = {};
  for (int nb = 0; nb < 2; ++nb) {
    mma::load_b(b, s + kB1t, 16, 8 * nb, 0, lane);
    mma::mma_16816(prod[nb], a, b);
  }
  uint32_t a2[4];
  mma::c_to_a<2>(a2, prod, 0);
  float acc[2][4];
  load_c(acc[0], c, lane);
  load_c(acc[1], c, lane);
  mma::mma_rows<2>(acc, a2, s + kV, 16, 0, lane);
  store_c(products + 384, acc[0], lane);
  store_c(products + 512, acc[1], lane);

  // cp_async: two groups from the same rows; the first copies the even rows and zero-fills the
  // odd ones, the second the other way round. wait<1> must have completed the first. The
  // destinations hold NaN first, so a copy not yet landed cannot pass for one that did.
  for (int i = lane; i < 256; i += GPU_WARP_SIZE) s[kCopyDst + i] = bf16_t(0x7fc0u);
  __syncthreads();
  if (lane < 16) mma::cp_async16_or_zero(s + kCopyDst + 8 * lane, in + kCopySrc + 8 * lane, lane % 2 == 0);
  mma::cp_async_commit();
  if (lane < 16) mma::cp_async16_or_zero(s + kCopyDst2 + 8 * lane, in + kCopySrc + 8 * lane, lane % 2 == 1);
  mma::cp_async_commit();
  mma::cp_async_wait<1>();
  __syncthreads();
  for (int i = lane; i < 128; i += GPU_WARP_SIZE) copied[i] = bf16_to_f32(s[kCopyDst + i]);
  mma::cp_async_wait<0>();
  __syncthreads();
  for (int i = lane; i < 128; i += GPU_WARP_SIZE) copied[128 + i] = bf16_to_f32(s[kCopyDst2 + i]);

  if (lane < kPairs) {
    const float lo = pack_in[2 * lane], hi = pack_in[2 * lane + 1];
    packed[lane] = mma::pack_bf16x2(lo, hi);
    packed_want[lane] = uint32_t(f32_to_bf16(lo)) | (uint32_t(f32_to_bf16(hi)) << 16);
  }
}

// "name: n of m elements differ; first [r][c] = got (expected want)", or "" when all agree.
std::string compare(const std::string& name, const std::vector<float>& got, const std::vector<float>& want,
                    int cols) {
  int wrong = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (!(got[i] == want[i])) {
      if (first < 0) first = int(i);
      ++wrong;
    }
  if (wrong == 0) return "";
  char line[256];
  std::snprintf(line, sizeof line, "%s: %d of %zu elements differ; first [%d][%d] = %g (expected %g)", name.c_str(),
                wrong, want.size(), first / cols, first % cols, double(got[size_t(first)]),
                double(want[size_t(first)]));
  return line;
}

// D = C + A B for A [16][16] and B [16][8] given as functions of (row, col).
template <typename AOf, typename BOf>
std::vector<float> plain_product(const std::vector<float>& c, AOf a_of, BOf b_of) {
  std::vector<float> d(128);
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 8; ++n) {
      float sum = c[size_t(m * 8 + n)];
      for (int k = 0; k < 16; ++k) sum += a_of(m, k) * b_of(k, n);
      d[size_t(m * 8 + n)] = sum;
    }
  return d;
}

// Values that test rounding: halfway cases both ways, subnormals, signs, the largest finite
// float, infinities and NaN; the rest random.
std::vector<float> pack_inputs(Rng& rng) {
  std::vector<float> v = {1.0f + 0x1p-8f,  1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 1.0f + 0x1p-8f + 0x1p-20f,
                          0x1p-130f,       -0x1.02p-127f,       3.4028235e38f,     -0.0f,
                          INFINITY,        -INFINITY,           NAN,               2.5f};
  while (v.size() < size_t(2 * kPairs))
    v.push_back(float(rng.normal() * std::ldexp(1.0, int(rng.next_u64() % 40) - 20)));
  return v;
}

#endif  // ZAYA_GPU_MMA_SYNC

}  // namespace mma_check
}  // namespace

std::vector<std::string> CudaBackend::check_mma_primitives(uint64_t seed) {
#if defined(ZAYA_GPU_MMA_SYNC)
  using namespace mma_check;
  Rng rng(seed);
  auto small_int = [&rng] { return float(int(rng.next_u64() % 7) - 3); };
  std::vector<float> tiles(kInputs);
  for (float& x : tiles) x = small_int();
  std::vector<float> c(128);
  for (float& x : c) x = small_int();
  const std::vector<float> pack_in = pack_inputs(rng);

  DeviceBuffer tiles_d = upload(tiles.data(), int64_t(tiles.size()) * 4);
  DeviceBuffer c_d = upload(c.data(), int64_t(c.size()) * 4);
  DeviceBuffer pack_d = upload(pack_in.data(), int64_t(pack_in.size()) * 4);
  DeviceBuffer in_d(this, kInputs * 2), products_d(this, kProducts * 128 * 4), copied_d(this, kCopied * 4),
      packed_d(this, kPairs * 4), packed_want_d(this, kPairs * 4);
  GPU_CHECK(gpuMemsetAsync(products_d.f(), 0xff, kProducts * 128 * 4, stream_));  // NaN until written
  GPU_CHECK(gpuMemsetAsync(copied_d.f(), 0xff, kCopied * 4, stream_));
  gpu_to_bf16(stream_, tiles_d.f(), 1, kInputs, kInputs, in_d.h());
  gpu_launch(k_mma_check, 1, warp_size_, kSharedBytes, stream_, in_d.h(), c_d.f(), pack_d.f(), products_d.f(),
             copied_d.f(), reinterpret_cast<uint32_t*>(packed_d.i()), reinterpret_cast<uint32_t*>(packed_want_d.i()));
  GPU_LAUNCH_CHECK();
  std::vector<float> products(kProducts * 128), copied(kCopied);
  std::vector<uint32_t> packed(kPairs), packed_want(kPairs);
  to_host(products.data(), products_d.f(), int64_t(products.size()) * 4);
  to_host(copied.data(), copied_d.f(), int64_t(copied.size()) * 4);
  to_host(packed.data(), packed_d.i(), int64_t(packed.size()) * 4);
  to_host(packed_want.data(), packed_want_d.i(), int64_t(packed_want.size()) * 4);

  auto at = [&tiles](int base, int ld) {  // element (r, col) of the tile at `base`, row stride ld
    return [&tiles, base, ld](int r, int col) { return tiles[size_t(base + r * ld + col)]; };
  };
  const auto A = at(kA, 16);
  const auto Bt = at(kBt, 16);
  const auto Bkn = at(kBkn, 8);
  const auto At = at(kAt, 16);
  const auto B1t = at(kB1t, 16);
  const auto V = at(kV, 16);
  std::vector<float> s(256);  // the chain's A B1, [16][16]: entries within 144, exact in bf16
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float sum = 0;
      for (int k = 0; k < 16; ++k) sum += A(m, k) * B1t(n, k);
      s[size_t(m * 16 + n)] = sum;
    }
  const auto S = [&s](int m, int k) { return s[size_t(m * 16 + k)]; };
  auto part = [&products](int i) {
    return std::vector<float>(products.begin() + i * 128, products.begin() + (i + 1) * 128);
  };
  std::vector<std::string> found = {
      compare("mma.m16n8k16 (load_a, load_b)", part(0),
              plain_product(c, A, [&](int k, int n) { return Bt(n, k); }), 8),
      compare("ldmatrix.x2.trans (load_b_trans)", part(1), plain_product(c, A, Bkn), 8),
      compare("ldmatrix.x4.trans (load_a_trans)", part(2),
              plain_product(c, [&](int m, int k) { return At(k, m); }, [&](int k, int n) { return Bt(n, k); }), 8),
      compare("c_to_a + mma_rows<2> (a product fed on in registers), column block 0", part(3),
              plain_product(c, S, V), 8),
      compare("c_to_a + mma_rows<2> (a product fed on in registers), column block 1", part(4),
              plain_product(c, S, [&](int k, int n) { return V(k, n + 8); }), 8)};

  std::vector<float> copied_want(kCopied);
  for (int i = 0; i < 128; ++i) {
    const bool even_row = (i / 8) % 2 == 0;
    copied_want[size_t(i)] = even_row ? tiles[size_t(kCopySrc + i)] : 0.0f;
    copied_want[size_t(128 + i)] = even_row ? 0.0f : tiles[size_t(kCopySrc + i)];
  }
  found.push_back(compare("cp.async (cp_async16_or_zero, commit, wait<1>, wait<0>)", copied, copied_want, 8));

  auto is_nan = [](uint16_t h) { return (h & 0x7fffu) > 0x7f80u; };
  int wrong_pairs = 0;
  std::string first_pair;
  for (int p = 0; p < kPairs; ++p)
    for (int half = 0; half < 2; ++half) {
      const uint16_t got = uint16_t(packed[size_t(p)] >> (16 * half));
      const uint16_t want = uint16_t(packed_want[size_t(p)] >> (16 * half));
      if (is_nan(want) ? is_nan(got) : got == want) continue;
      if (wrong_pairs++ == 0) {
        char line[160];
        std::snprintf(line, sizeof line, "; first %a -> 0x%04x (expected 0x%04x)",
                      double(pack_in[size_t(2 * p + half)]), unsigned(got), unsigned(want));
        first_pair = line;
      }
    }
  if (wrong_pairs > 0)
    found.push_back("cvt.rn.bf16x2 (pack_bf16x2): " + std::to_string(wrong_pairs) + " of " +
                    std::to_string(2 * kPairs) + " values round differently" + first_pair);

  std::vector<std::string> mismatches;
  for (auto& f : found)
    if (!f.empty()) mismatches.push_back(std::move(f));
  return mismatches;
#else
  (void)seed;
  return {};
#endif
}

MmaSelfCheck cuda_mma_self_check(Backend& gpu, uint64_t seed) {
  auto* be = dynamic_cast<CudaBackend*>(&gpu);
  if (be == nullptr) fail("cuda", "cuda_mma_self_check needs the GPU backend, got " + gpu.name());
  MmaSelfCheck r;
  r.ran = cuda_tensor_core_kernels_built() && be->wmma();
  if (r.ran) r.mismatches = be->check_mma_primitives(seed);
  return r;
}

}  // namespace zaya
