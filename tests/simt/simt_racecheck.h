// Race checking for the host emulation of the GPU (zaya_simt_racecheck_tests): with
// ZAYA_SIMT_RACECHECK defined, the fiber scheduler (simt_runtime.cpp) tells ThreadSanitizer which
// GPU thread runs and what orders what, and the backend's kernels, compiled with
// -fsanitize=thread, report two threads touching the same bytes unordered, at least one of them
// writing. Without the define every hook is an empty inline function.
//
// The order the hooks declare is the one the hardware promises, not the emulation's:
//   - a launch's blocks are unordered. The emulation runs them one after another, so two
//     consecutive blocks run on distinct sets of sanitizer fibers (block b on set b % 2), which
//     nothing orders: a block that reads what the next one writes, or two blocks adding into one
//     float without atomicAdd, is reported. Blocks two apart share fibers and are not compared;
//   - within a block, a barrier (__syncthreads) orders what every thread did before it before
//     what any does after it, and a warp-wide instruction (shuffle, __syncwarp, mma, ldmatrix)
//     does the same for the warp's lanes (lenient for shuffles, which order registers only);
//   - a thread's exit counts as its arrival at the block's later barriers (as on the hardware);
//   - kernels on the one stream are ordered: the host's writes before a launch come before every
//     block, and every block before anything the host does after it.
// An asynchronous copy (cp.async) writes its shared destination at its issue and again at its
// thread's wait (simt_runtime.cpp): the hardware may land it at any moment between.
// Shared memory is new at each block (the hardware gives a block its own): the dynamic buffer and
// the static __shared__ arrays (which simt_runtime.h places in one section for this) are
// forgotten before the block starts. The lanes of a warp share a sanitizer fiber (fiber()).
#pragma once

#include <cstddef>

namespace zaya::simt::racecheck {

// Distinct sets of fibers that consecutive blocks run on (1 without race checking).
#if defined(ZAYA_SIMT_RACECHECK)
constexpr int kFiberSets = 2;
#else
constexpr int kFiberSets = 1;
#endif

#if defined(ZAYA_SIMT_RACECHECK)
// The sanitizer's fiber for the GPU threads of warp `warp` of set `set`, created at first use.
// The lanes of a warp share one: races between the lanes of a warp are not looked for (a fiber
// each made every barrier cost as much as the threads of a block: GpuCca.Conv took 53 s against
// the emulation's 0.9 s, and 13 s with a fiber per warp).
void* fiber(int set, int warp);
// The host thread's own context (the scheduler runs on it).
void* host_fiber();
// Call immediately before switching stacks to the context `to` is the fiber of. No order is
// implied by the switch itself.
void switching_to(void* to);
void release(const void* sync);
void acquire(const void* sync);
// The running GPU thread reads or writes [p, p + bytes) in the scheduler's own code, which is
// not instrumented (cp.async, ldmatrix).
void reads(const void* p, size_t bytes);
void writes(const void* p, size_t bytes);
// The block's dynamic shared memory: kDynamicSharedBytes in the section of the static __shared__
// arrays, so that reset_shared() forgets both.
constexpr size_t kDynamicSharedBytes = size_t(228) << 10;
unsigned char* dynamic_shared_memory();
// Forgets every access recorded to shared memory, the static __shared__ arrays and the dynamic
// buffer: a new block's.
void reset_shared();
// While one lives, the running fiber's accesses (the scheduler's bookkeeping, through libc's
// memcpy) are not recorded.
class Quiet {
 public:
  Quiet();
  ~Quiet();
  Quiet(const Quiet&) = delete;
  Quiet& operator=(const Quiet&) = delete;
};
#else
inline void* fiber(int, int) { return nullptr; }
inline void* host_fiber() { return nullptr; }
inline void switching_to(void*) {}
inline void release(const void*) {}
inline void acquire(const void*) {}
inline void reads(const void*, size_t) {}
inline void writes(const void*, size_t) {}
inline void reset_shared() {}
class Quiet {
 public:
  Quiet() {}  // user-provided: an unused Quiet is not a warning
};
#endif

}  // namespace zaya::simt::racecheck
