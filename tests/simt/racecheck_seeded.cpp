// Kernels with and without a race, for the race checking of the host emulation
// (simt_racecheck.h): `zaya_simt_racecheck_seeded CASE` launches one and prints "ran CASE".
// tests/simt/racecheck.cmake runs each case: a racy one passes only if ThreadSanitizer reports a
// data race, a race-free one only if it reports nothing. So a race checking that stops seeing
// races (a barrier that orders too much, blocks on one fiber) fails, and so does one that
// reports races where the hardware has none (shared memory kept from block to block, a barrier
// that orders too little).
// Compiled with -fsanitize=thread and ZAYA_SIMT_RACECHECK, as the backend's kernels are there.
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/cuda/gpu_mma.h"
#include "backend/cuda/gpu_runtime.h"

namespace {

constexpr int kThreads = 128;  // four warps of 32, two of 64

// Each thread writes its slot of a shared array, then reads the slot of a thread in another
// warp: racy without the barrier between.
__global__ void k_neighbour(float* out, bool barrier) {
  __shared__ float slots[kThreads];
  const int t = int(threadIdx.x);
  slots[t] = float(t + blockIdx.x);
  if (barrier) __syncthreads();
  out[blockIdx.x * kThreads + t] = slots[(t + GPU_WARP_SIZE) % kThreads];
}

// The same through dynamic shared memory, which each block fills before reading: racy only
// without the barrier (a block never sees the previous block's values).
__global__ void k_neighbour_dynamic(float* out, bool barrier) {
  ZAYA_DYNAMIC_SHARED(raw);
  float* slots = reinterpret_cast<float*>(raw);
  const int t = int(threadIdx.x);
  slots[t] = float(t * 2 + blockIdx.x);
  if (barrier) __syncthreads();
  out[blockIdx.x * kThreads + t] = slots[(t + GPU_WARP_SIZE) % kThreads];
}

// Thread 0 of every block adds into one float: racy as a plain addition, not with atomicAdd.
__global__ void k_accumulate(float* total, bool atomic) {
  if (threadIdx.x != 0) return;
  if (atomic) atomicAdd(total, 1.0f);
  else *total += 1.0f;
}

// Block b reads what block b + 1 writes in the same launch: racy (the blocks are unordered).
__global__ void k_read_next_block(float* rows, float* out) {
  const int t = int(threadIdx.x), b = int(blockIdx.x);
  rows[b * kThreads + t] = float(b);
  if (b + 1 < int(gridDim.x)) out[b * kThreads + t] = rows[(b + 1) * kThreads + t];
}

// The next launch reads what the previous one wrote: ordered by the kernel boundary.
__global__ void k_read_previous_launch(const float* rows, float* out) {
  const int t = int(threadIdx.x), b = int(blockIdx.x);
  out[b * kThreads + t] = rows[((b + 1) % int(gridDim.x)) * kThreads + t];
}

// A warp-wide reduction through shared memory that a barrier orders: race-free.
__global__ void k_warp_sums(float* out) {
  __shared__ float partial[kThreads / GPU_WARP_SIZE];
  const int t = int(threadIdx.x);
  float v = float(t);
  for (int m = GPU_WARP_SIZE / 2; m > 0; m /= 2) v += gpu_shfl_xor(v, m);
  if (t % GPU_WARP_SIZE == 0) partial[t / GPU_WARP_SIZE] = v;
  __syncthreads();
  if (t == 0) {
    float s = 0;
    for (int w = 0; w < kThreads / GPU_WARP_SIZE; ++w) s += partial[w];
    out[blockIdx.x] = s;
  }
}

// A double-buffered pipeline of asynchronous copies, as the flash and grouped GEMM kernels run
// one: each iteration prefetches the next tile into the other buffer, waits for the current
// one, and reads a slot another warp copied. Without the barrier at the end of each iteration, a
// warp's prefetch into a buffer can land while another warp is still reading that buffer's
// previous tile: racy (the copy's write counts from its issue, not only from its wait).
constexpr int kPrefetchTiles = 4;
constexpr size_t kPrefetchBufferBytes = sizeof(float) * 2 * kThreads * 4;
__global__ void k_prefetch(const float* src, float* out, bool trailing_barrier) {
  ZAYA_DYNAMIC_SHARED(raw);  // two buffers of 4 floats a thread
  float* tiles = reinterpret_cast<float*>(raw);
  const int t = int(threadIdx.x);
  const auto buffer = [&](int tile) { return tiles + (tile & 1) * kThreads * 4; };
  const auto stage = [&](int tile) {
    zaya::mma::cp_async16(buffer(tile) + t * 4, src + (size_t(tile) * kThreads + size_t(t)) * 4);
  };
  stage(0);
  zaya::mma::cp_async_commit();
  float sum = 0.0f;
  for (int it = 0; it < kPrefetchTiles; ++it) {
    if (it + 1 < kPrefetchTiles) stage(it + 1);
    zaya::mma::cp_async_commit();
    zaya::mma::cp_async_wait<1>();
    __syncthreads();
    sum += buffer(it)[((t + GPU_WARP_SIZE) % kThreads) * 4];
    if (trailing_barrier) __syncthreads();
  }
  zaya::mma::cp_async_wait<0>();
  out[blockIdx.x * kThreads + t] = sum;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "";
  constexpr int kBlocks = 4;
  float* a = nullptr;
  float* b = nullptr;
  gpuMalloc(reinterpret_cast<void**>(&a), sizeof(float) * kBlocks * kThreads);
  gpuMalloc(reinterpret_cast<void**>(&b), sizeof(float) * kBlocks * kThreads);
  gpuMemsetAsync(a, 0, sizeof(float) * kBlocks * kThreads, nullptr);
  float* tiles = nullptr;  // the pipeline's source: kPrefetchTiles tiles of 4 floats a thread
  const size_t tile_bytes = sizeof(float) * kPrefetchTiles * kThreads * 4;
  gpuMalloc(reinterpret_cast<void**>(&tiles), tile_bytes);
  gpuMemsetAsync(tiles, 0, tile_bytes, nullptr);
  const size_t dynamic_bytes = sizeof(float) * kThreads;
  if (which == "shared_without_barrier") zaya::gpu_launch(k_neighbour, kBlocks, kThreads, 0, nullptr, a, false);
  else if (which == "shared_with_barrier") zaya::gpu_launch(k_neighbour, kBlocks, kThreads, 0, nullptr, a, true);
  else if (which == "dynamic_without_barrier")
    zaya::gpu_launch(k_neighbour_dynamic, kBlocks, kThreads, dynamic_bytes, nullptr, a, false);
  else if (which == "dynamic_with_barrier")
    zaya::gpu_launch(k_neighbour_dynamic, kBlocks, kThreads, dynamic_bytes, nullptr, a, true);
  else if (which == "blocks_add_plainly") zaya::gpu_launch(k_accumulate, kBlocks, kThreads, 0, nullptr, a, false);
  else if (which == "blocks_add_atomically") zaya::gpu_launch(k_accumulate, kBlocks, kThreads, 0, nullptr, a, true);
  else if (which == "block_reads_the_next") zaya::gpu_launch(k_read_next_block, kBlocks, kThreads, 0, nullptr, a, b);
  else if (which == "launch_reads_the_previous") {
    zaya::gpu_launch(k_read_next_block, 1, kThreads, 0, nullptr, a, b);  // one block: no race
    zaya::gpu_launch(k_read_previous_launch, kBlocks, kThreads, 0, nullptr, a, b);
  } else if (which == "warp_sums") zaya::gpu_launch(k_warp_sums, kBlocks, kThreads, 0, nullptr, a);
  else if (which == "prefetch_over_unread_tile")
    zaya::gpu_launch(k_prefetch, kBlocks, kThreads, kPrefetchBufferBytes, nullptr, tiles, a, false);
  else if (which == "prefetch_after_barrier")
    zaya::gpu_launch(k_prefetch, kBlocks, kThreads, kPrefetchBufferBytes, nullptr, tiles, a, true);
  else {
    std::fprintf(stderr, "usage: zaya_simt_racecheck_seeded CASE (got '%s')\n", which.c_str());
    return 2;
  }
  gpuStreamSynchronize(nullptr);
  gpuFree(a);
  gpuFree(b);
  gpuFree(tiles);
  std::printf("ran %s\n", which.c_str());
  return 0;
}
