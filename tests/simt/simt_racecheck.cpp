// The ThreadSanitizer side of the emulation's race checking (simt_racecheck.h), compiled only
// into the race checking's runtime (tests/simt/racecheck.cmake), whose kernels are compiled with
// -fsanitize=thread. This file itself is not instrumented (the scheduler's own bookkeeping is not
// what is checked).
#include "simt_racecheck.h"

#if defined(ZAYA_SIMT_RACECHECK)

#include <sanitizer/tsan_interface.h>

#include <vector>

// ThreadSanitizer's entry points that no public header of this compiler declares: accesses made
// by code that is not instrumented, accesses not to record, and the Java heap's allocation, the
// one way its interface offers to forget what was recorded for a range (the shared memory
// section is declared as that heap).
extern "C" void __tsan_read_range(void* addr, unsigned long size);
extern "C" void __tsan_write_range(void* addr, unsigned long size);
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
extern "C" void __tsan_java_init(unsigned long heap_begin, unsigned long heap_size);
extern "C" void __tsan_java_alloc(unsigned long ptr, unsigned long size);
extern "C" void __tsan_java_free(unsigned long ptr, unsigned long size);

// The section the static __shared__ arrays are placed in (simt_runtime.h), with the dynamic
// shared memory below.
extern "C" unsigned char __start_zaya_simt_shared[];
extern "C" unsigned char __stop_zaya_simt_shared[];

namespace zaya::simt::racecheck {

namespace {
std::vector<void*> g_fibers[kFiberSets];
void* g_host = nullptr;
void* g_running = nullptr;
bool g_heap_declared = false;
__attribute__((section("zaya_simt_shared"))) alignas(128) unsigned char g_dynamic_shared[kDynamicSharedBytes];

// The section's bounds, rounded inwards to the heap's 8-byte granule (it starts 128-byte aligned,
// g_dynamic_shared's alignment, and every array in it is a multiple of 8 bytes long or padded).
unsigned long heap_begin() { return (reinterpret_cast<unsigned long>(__start_zaya_simt_shared) + 7) & ~7ul; }
unsigned long heap_size() {
  return (reinterpret_cast<unsigned long>(__stop_zaya_simt_shared) & ~7ul) - heap_begin();
}
}  // namespace

void* fiber(int set, int warp) {
  std::vector<void*>& fibers = g_fibers[set];
  while (fibers.size() <= size_t(warp)) fibers.push_back(__tsan_create_fiber(0));
  return fibers[size_t(warp)];
}

void* host_fiber() {
  if (!g_host) g_host = __tsan_get_current_fiber();
  if (!g_running) g_running = g_host;
  return g_host;
}

void switching_to(void* to) {
  if (to == g_running) return;
  g_running = to;
  __tsan_switch_to_fiber(to, __tsan_switch_to_fiber_no_sync);
}

void release(const void* sync) { __tsan_release(const_cast<void*>(sync)); }

void acquire(const void* sync) { __tsan_acquire(const_cast<void*>(sync)); }

void reads(const void* p, size_t bytes) { __tsan_read_range(const_cast<void*>(p), bytes); }

void writes(const void* p, size_t bytes) { __tsan_write_range(const_cast<void*>(p), bytes); }

unsigned char* dynamic_shared_memory() { return g_dynamic_shared; }

void reset_shared() {
  if (!g_heap_declared) {
    __tsan_java_init(heap_begin(), heap_size());
    g_heap_declared = true;
  } else {
    __tsan_java_free(heap_begin(), heap_size());
  }
  __tsan_java_alloc(heap_begin(), heap_size());
}

Quiet::Quiet() { __tsan_ignore_thread_begin(); }
Quiet::~Quiet() { __tsan_ignore_thread_end(); }

}  // namespace zaya::simt::racecheck

#endif
