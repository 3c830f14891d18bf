// The GPU as kernels see it, emulated on the CPU: with ZAYA_SIMT defined, gpu_runtime.h includes
// this file instead of a vendor header, and the backend's sources (src/backend/cuda/*.cu and
// their *_kernels.h) compile as plain C++. simt::launch then runs every thread of every block as
// a fiber on one CPU thread: __syncthreads is a block barrier, and the warp-wide instructions
// (mma.sync, ldmatrix, shuffles) are collectives of the warp's lanes, computed from the register
// layouts the PTX ISA states. cp.async copies reach shared memory only when the issuing thread
// waits for them, and dynamic shared memory starts filled with NaN bytes, so a kernel that reads
// a tile before it has landed reads NaN. The runtime API is in simt_host_api.h.
// It checks what a kernel computes, never how fast: tests/simt/test_simt_*.cpp for the kernels
// in headers, and tests/gpu's tests for the whole backend (tests/simt/CMakeLists.txt).
#pragma once

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) uint2 {
  uint32_t x, y;
};
struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

#include "simt_host_api.h"

#define __global__ inline
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// One instance, shared by the block's fibers (blocks run one at a time). Race checking forgets
// what each block did to them before the next starts, and finds them in their own section.
#if defined(ZAYA_SIMT_RACECHECK)
#define __shared__ static __attribute__((section("zaya_simt_shared")))
#else
#define __shared__ static
#endif
// Lanes per warp: 32 (NVIDIA) unless the build asks for 64 (CDNA's wavefronts); the tensor-core
// instructions exist only for 32.
#if !defined(ZAYA_SIMT_WARP_SIZE)
#define ZAYA_SIMT_WARP_SIZE 32
#endif
#define GPU_WARP_SIZE ZAYA_SIMT_WARP_SIZE

namespace zaya::simt {

// The coordinates of the thread being run.
const dim3& thread_idx();
const dim3& block_idx();
const dim3& block_dim();
const dim3& grid_dim();
int lane();
// The block's dynamic shared memory (launch's smem_bytes), 128-byte aligned.
unsigned char* dynamic_shared();
// __syncthreads: waits for every thread of the block that has not exited.
void sync_block();

// What a warp-wide instruction is, so that lanes meeting at different ones (a divergent warp)
// are reported rather than mixed.
enum class Collective { Shuffle, Mma, Ldmatrix2, Ldmatrix4, SyncWarp };

// The most bytes one lane deposits at a warp-wide instruction, and the stride between lanes'
// deposits.
constexpr size_t kWarpDepositBytes = 32;

// Every lane's deposit at the warp-wide instruction just completed. A lane reads only the
// deposits it needs (a shuffle reads one), so an instruction costs O(warp) rather than
// O(warp^2). Valid until the calling lane's next warp-wide instruction: the deposits are double
// buffered, and the buffer is reused only after every lane, the caller too, reaches the next one.
class WarpDeposits {
 public:
  explicit WarpDeposits(const unsigned char* lanes) : lanes_(lanes) {}
  template <typename T>
  T of(int lane) const {
    static_assert(sizeof(T) <= kWarpDepositBytes, "a deposit holds at most kWarpDepositBytes");
    T v;
    std::memcpy(&v, lanes_ + size_t(lane) * kWarpDepositBytes, sizeof(T));
    return v;
  }

 private:
  const unsigned char* lanes_;
};

// Every lane of the calling thread's warp deposits `bytes` (<= kWarpDepositBytes) bytes; once
// all GPU_WARP_SIZE lanes have, each may read any lane's deposit.
WarpDeposits warp_exchange(Collective kind, const void* mine, size_t bytes);

template <typename T>
T shfl_xor(T v, int mask) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  return warp_exchange(Collective::Shuffle, &v, sizeof(T)).template of<T>(lane() ^ (mask & (GPU_WARP_SIZE - 1)));
}

// __syncwarp: waits for every lane of the calling thread's warp.
void sync_warp();

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d += A B over the warp's fragments.
void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
// ldmatrix.sync.aligned.m8n8.x2/.x4.trans.shared.b16: `row` is this lane's row address (lanes
// 8j..8j+7 address the rows of matrix j); register j receives matrix j's elements
// (2 quad, group) and (2 quad + 1, group).
void ldmatrix_trans2(uint32_t (&r)[2], const uint16_t* row);
void ldmatrix_trans4(uint32_t (&r)[4], const uint16_t* row);

// cp.async.cg.shared.global of 16 bytes (zeros when !valid), cp.async.commit_group and
// cp.async.wait_group: the source is read at issue, the destination written at the wait.
void cp_async16(void* shared_dst, const void* global_src, bool valid);
void cp_async_commit();
void cp_async_wait(int pending);

// How the emulation orders what the hardware leaves unordered, to expose a kernel that relies on
// one order. round_robin: each runnable thread in turn runs until it waits (the warps of a block
// advance together); otherwise the lowest-numbered runnable thread always runs next (warp 0 runs
// ahead to the next barrier before warp 1 starts: a missing barrier shows). copies_at_issue: a
// cp.async lands at once (a tile overwritten while another warp still reads it shows); otherwise
// only when its thread waits for it (a tile read before it landed shows). reverse: threads are
// taken from the highest-numbered down (the last warp goes first: a kernel that relies on thread
// 0 reading before another thread writes shows).
// The environment sets the schedule a process starts with: ZAYA_SIMT_SCHEDULE, a comma-separated
// list of "ahead" (not round_robin), "reverse" and "copies_at_issue" (tests/simt/CMakeLists.txt
// runs the emulated op tests so).
struct Schedule {
  bool round_robin = true;
  bool copies_at_issue = false;
  bool reverse = false;
};
void set_schedule(const Schedule& s);
const Schedule& schedule();

// Runs kernel() as every thread of every block of the grid, one block after another, with
// smem_bytes of dynamic shared memory per block. Throws zaya::Error when the threads of a block
// can no longer all make progress (a barrier or a warp-wide instruction some threads never reach).
void launch(dim3 grid, dim3 block, size_t smem_bytes, const std::function<void()>& kernel);

}  // namespace zaya::simt

#define threadIdx (::zaya::simt::thread_idx())
#define blockIdx (::zaya::simt::block_idx())
#define blockDim (::zaya::simt::block_dim())
#define gridDim (::zaya::simt::grid_dim())
#define ZAYA_DYNAMIC_SHARED(name) unsigned char* name = ::zaya::simt::dynamic_shared()

inline void __syncthreads() { ::zaya::simt::sync_block(); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
  return ::zaya::simt::shfl_xor(v, mask);
}
#define gpu_shfl_xor(v, mask) __shfl_xor_sync(0xffffffffu, (v), (mask))

inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
[[noreturn]] inline void __trap() { std::abort(); }
// Blocks run one at a time on one CPU thread, and a thread is only ever switched out at a
// barrier or a warp-wide instruction, so a plain read-modify-write would do; an atomic one tells
// the race checking (simt_racecheck.h) that blocks adding into one place do not race.
template <typename T>
inline T atomicAdd(T* p, T v) {
  return std::atomic_ref<T>(*p).fetch_add(v);
}
inline void __syncwarp(unsigned = 0xffffffffu) { ::zaya::simt::sync_warp(); }
