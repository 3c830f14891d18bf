// The emulated GPU runtime API (simt_host_api.h): device memory from the heap, recorded in an
// ordered map so that copies and frees are checked against live allocations; streams and events
// are tokens, since every call completes before it returns; copies from pinned memory keep
// their source bytes until an event or synchronisation says they have run, and are checked then.
#include "simt_runtime.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define ZAYA_SIMT_HOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZAYA_SIMT_HOST_ASAN 1
#endif
#endif
#if defined(ZAYA_SIMT_HOST_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace {

std::mutex g_mutex;
std::map<uintptr_t, size_t> g_allocations;  // start -> bytes
size_t g_in_use = 0;
std::atomic<gpuError_t> g_last_error{gpuSuccess};  // the watchdog thread of the NCCL communicator calls in too
constexpr size_t kEmulatedMemory = size_t(16) << 30;

gpuError_t record(gpuError_t e) {
  if (e != gpuSuccess) g_last_error = e;
  return e;
}

// Whether [p, p + bytes) lies inside one live allocation.
bool inside_allocation(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

struct Event {
  std::chrono::steady_clock::time_point at;
  uint64_t pinned_copies = 0;  // copies from pinned memory enqueued before the event was recorded
  uint64_t stream_syncs = 0;   // g_stream_syncs when it was recorded
  bool queried = false;        // queried since it was recorded
};
// Stream synchronisations so far: an event recorded since the last one reports "not ready" to
// its first query, as a GPU still running the work before it would (HIP then keeps "not ready"
// as the calling thread's last error: t_query_not_ready, reported by gpuGetLastError).
std::atomic<uint64_t> g_stream_syncs{0};
thread_local bool t_query_not_ready = false;

// Copies to the device from pinned memory that a GPU could still be running: the source range,
// its bytes when the copy was enqueued, and the copy's number (g_pinned_copies at the time).
struct PinnedCopy {
  const unsigned char* src;
  std::vector<unsigned char> bytes;
  uint64_t number;
};
std::map<uintptr_t, size_t> g_pinned;  // pinned allocations: start -> bytes
std::vector<PinnedCopy> g_pinned_in_flight;
uint64_t g_pinned_copies = 0;

bool inside_pinned(const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = g_pinned.upper_bound(a);
  if (it == g_pinned.begin()) return false;
  --it;
  return a + bytes <= it->first + it->second;
}

// The pinned copies numbered up to `last` have run: each source must still hold the bytes the
// copy was given (else the host rewrote them while the copy could be reading them).
gpuError_t retire_pinned_copies(uint64_t last) {
  std::lock_guard<std::mutex> lock(g_mutex);
  gpuError_t result = gpuSuccess;
  std::vector<PinnedCopy> still;
  for (PinnedCopy& c : g_pinned_in_flight) {
    if (c.number > last) {
      still.push_back(std::move(c));
      continue;
    }
    if (std::memcmp(c.src, c.bytes.data(), c.bytes.size()) != 0) {
      std::fprintf(stderr, "simt: the pinned source of a copy to the device (%zu bytes at %p) was rewritten before "
                   "the copy was known to have run\n", c.bytes.size(), static_cast<const void*>(c.src));
      result = gpuErrorInvalidValue;
    }
  }
  g_pinned_in_flight = std::move(still);
  return record(result);
}

// zaya::simt::api_counts(): atomics, as the NCCL communicator's watchdog thread calls in too.
struct Counts {
  std::atomic<int64_t> launches{0}, copies_to_device{0}, copies_to_host{0}, copies_on_device{0},
      synchronizations{0};
};
Counts g_counts;

}  // namespace

const char* gpuGetErrorString(gpuError_t e) {
  switch (e) {
    case gpuSuccess: return "no error";
    case gpuErrorInvalidValue:
      return "invalid argument (emulated GPU: a copy or free outside device memory, a copy between overlapping "
             "ranges, or a launch configuration the hardware refuses)";
    case gpuErrorMemoryAllocation: return "out of memory (emulated GPU)";
    case gpuErrorNotReady: return "not ready";
    default: return "unknown error (emulated GPU)";
  }
}

gpuError_t gpuGetLastError() {
  const gpuError_t e = g_last_error.exchange(gpuSuccess);
  const bool not_ready = t_query_not_ready;
  t_query_not_ready = false;
  return e != gpuSuccess ? e : not_ready ? gpuErrorNotReady : gpuSuccess;
}

gpuError_t gpuGetDeviceCount(int* count) {
  *count = 1;
  return gpuSuccess;
}
gpuError_t gpuSetDevice(int device) { return record(device == 0 ? gpuSuccess : gpuErrorInvalidValue); }
gpuError_t gpuGetDevice(int* device) {
  *device = 0;
  return gpuSuccess;
}
// Each process is its own emulated GPU: its bus id names the process (or is
// ZAYA_SIMT_PCI_BUS_ID, so that a test can put two ranks on one GPU).
gpuError_t gpuDeviceGetPCIBusId(char* bus_id, int length, int device) {
  if (bus_id == nullptr || length <= 0 || device != 0) return record(gpuErrorInvalidValue);
  const char* forced = std::getenv("ZAYA_SIMT_PCI_BUS_ID");
  if (forced != nullptr)
    std::snprintf(bus_id, size_t(length), "%s", forced);
  else
    std::snprintf(bus_id, size_t(length), "emulated:%ld", long(getpid()));
  return gpuSuccess;
}
gpuError_t gpuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  *total_bytes = kEmulatedMemory;
  *free_bytes = g_in_use < kEmulatedMemory ? kEmulatedMemory - g_in_use : 0;
  return gpuSuccess;
}

gpuError_t gpuMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (bytes == 0) return gpuSuccess;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_in_use + bytes > kEmulatedMemory) return record(gpuErrorMemoryAllocation);
  }
  // 256-byte aligned, as cudaMalloc's, and NaN (0xff bytes) until written. Under ASan the
  // alignment padding past `bytes` is poisoned, so a kernel that reads past the end is reported.
  const size_t padded = (bytes + 255) / 256 * 256;
  void* q = std::aligned_alloc(256, padded);
  if (!q) return record(gpuErrorMemoryAllocation);
  std::memset(q, 0xff, bytes);
#if defined(ZAYA_SIMT_HOST_ASAN)
  ASAN_POISON_MEMORY_REGION(static_cast<unsigned char*>(q) + bytes, padded - bytes);
#endif
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[reinterpret_cast<uintptr_t>(q)] = bytes;
  g_in_use += bytes;
  *p = q;
  return gpuSuccess;
}

gpuError_t gpuMallocHost(void** p, size_t bytes) {
  *p = nullptr;
  if (bytes == 0) return gpuSuccess;
  void* q = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!q) return record(gpuErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pinned[reinterpret_cast<uintptr_t>(q)] = bytes;
  *p = q;
  return gpuSuccess;
}

gpuError_t gpuFreeHost(void* p) {
  if (!p) return gpuSuccess;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_pinned.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_pinned.end()) return record(gpuErrorInvalidValue);
  for (const PinnedCopy& c : g_pinned_in_flight)
    if (reinterpret_cast<uintptr_t>(c.src) >= it->first && reinterpret_cast<uintptr_t>(c.src) < it->first + it->second) {
      std::fprintf(stderr, "simt: pinned memory freed while a copy from it could still be running\n");
      return record(gpuErrorInvalidValue);
    }
  g_pinned.erase(it);
  std::free(p);
  return gpuSuccess;
}

gpuError_t gpuFree(void* p) {
  if (!p) return gpuSuccess;
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocations.end()) return record(gpuErrorInvalidValue);
  g_in_use -= it->second;
#if defined(ZAYA_SIMT_HOST_ASAN)
  ASAN_UNPOISON_MEMORY_REGION(p, (it->second + 255) / 256 * 256);
#endif
  g_allocations.erase(it);
  std::free(p);
  return gpuSuccess;
}

gpuError_t gpuMemcpyAsync(void* dst, const void* src, size_t bytes, gpuMemcpyKind kind, gpuStream_t) {
  if (bytes == 0) return gpuSuccess;
  (kind == gpuMemcpyHostToDevice   ? g_counts.copies_to_device
   : kind == gpuMemcpyDeviceToHost ? g_counts.copies_to_host
                                   : g_counts.copies_on_device) += 1;
  const bool dst_device = kind == gpuMemcpyHostToDevice || kind == gpuMemcpyDeviceToDevice;
  const bool src_device = kind == gpuMemcpyDeviceToHost || kind == gpuMemcpyDeviceToDevice;
  if ((dst_device && !inside_allocation(dst, bytes)) || (src_device && !inside_allocation(src, bytes)))
    return record(gpuErrorInvalidValue);
  // Overlapping ranges are undefined for cudaMemcpy: refused here, so a backend relying on them shows.
  const auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (d < s + bytes && s < d + bytes) return record(gpuErrorInvalidValue);
  std::memcpy(dst, src, bytes);
  if (kind == gpuMemcpyHostToDevice) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (inside_pinned(src, bytes)) {
      const auto* from = static_cast<const unsigned char*>(src);
      g_pinned_in_flight.push_back({from, std::vector<unsigned char>(from, from + bytes), ++g_pinned_copies});
    }
  }
  return gpuSuccess;
}

gpuError_t gpuMemsetAsync(void* dst, int value, size_t bytes, gpuStream_t) {
  if (bytes == 0) return gpuSuccess;
  if (!inside_allocation(dst, bytes)) return record(gpuErrorInvalidValue);
  std::memset(dst, value, bytes);
  return gpuSuccess;
}

gpuError_t gpuStreamCreate(gpuStream_t* stream) { return gpuStreamCreateWithFlags(stream, 0); }
gpuError_t gpuStreamCreateWithFlags(gpuStream_t* stream, unsigned) {
  static int token;
  *stream = &token;
  return gpuSuccess;
}
gpuError_t gpuStreamDestroy(gpuStream_t) { return gpuSuccess; }
gpuError_t gpuStreamSynchronize(gpuStream_t) {
  g_counts.synchronizations += 1;
  g_stream_syncs += 1;
  return retire_pinned_copies(UINT64_MAX);
}
gpuError_t gpuStreamWaitEvent(gpuStream_t, gpuEvent_t, unsigned) { return gpuSuccess; }

gpuError_t gpuEventCreate(gpuEvent_t* event) { return gpuEventCreateWithFlags(event, 0); }
gpuError_t gpuEventCreateWithFlags(gpuEvent_t* event, unsigned) {
  *event = new Event{std::chrono::steady_clock::now()};
  return gpuSuccess;
}
gpuError_t gpuEventDestroy(gpuEvent_t event) {
  delete static_cast<Event*>(event);
  return gpuSuccess;
}
gpuError_t gpuEventRecord(gpuEvent_t event, gpuStream_t) {
  auto* e = static_cast<Event*>(event);
  e->at = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(g_mutex);
  e->pinned_copies = g_pinned_copies;
  e->stream_syncs = g_stream_syncs;
  e->queried = false;
  return gpuSuccess;
}
gpuError_t gpuEventSynchronize(gpuEvent_t event) {
  g_counts.synchronizations += 1;
  return retire_pinned_copies(static_cast<Event*>(event)->pinned_copies);
}
// The emulated stream has run every call to the end, but an event recorded since the last
// stream synchronisation answers its first query "not ready" (see g_stream_syncs), so the
// backend's not-ready paths run too.
gpuError_t gpuEventQuery(gpuEvent_t event) {
  auto* e = static_cast<Event*>(event);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!e->queried && e->stream_syncs == g_stream_syncs) {
      e->queried = true;
      t_query_not_ready = true;
      return gpuErrorNotReady;
    }
  }
  return retire_pinned_copies(e->pinned_copies);
}
gpuError_t gpuEventElapsedTime(float* ms, gpuEvent_t start, gpuEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(static_cast<Event*>(end)->at - static_cast<Event*>(start)->at).count();
  return gpuSuccess;
}

namespace {
std::map<const void*, int> g_shared_allowed;  // kernel -> its MaxDynamicSharedMemorySize
}  // namespace

gpuError_t gpuFuncSetAttribute(const void* kernel, gpuFuncAttribute attribute, int value) {
  if (attribute != gpuFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > kSimtMaxSharedBytes)
    return record(gpuErrorInvalidValue);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_shared_allowed[kernel] = value;
  return gpuSuccess;
}

int gpu_device_warp_size(int) { return GPU_WARP_SIZE; }

bool gpu_pointer_on_device(const void* p, int* device) {
  if (!inside_allocation(p, 1)) return false;
  *device = 0;
  return true;
}

namespace zaya::simt {
bool check_launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  bool ok = grid.x >= 1 && grid.y >= 1 && grid.z >= 1 && grid.x < (1u << 31) && grid.y <= 65535 &&
            grid.z <= 65535 && threads >= 1 && threads <= 1024 && block.z <= 64;
  if (ok && shared_bytes > size_t(kSimtDefaultSharedBytes)) {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_shared_allowed.find(kernel);
    ok = it != g_shared_allowed.end() && shared_bytes <= size_t(it->second);
  }
  if (!ok) record(gpuErrorInvalidValue);
  else g_counts.launches += 1;
  return ok;
}

ApiCounts api_counts() {
  ApiCounts c;
  c.launches = g_counts.launches;
  c.copies_to_device = g_counts.copies_to_device;
  c.copies_to_host = g_counts.copies_to_host;
  c.copies_on_device = g_counts.copies_on_device;
  c.synchronizations = g_counts.synchronizations;
  return c;
}

bool range_on_device(const void* p, size_t bytes) { return inside_allocation(p, bytes); }

size_t device_bytes_in_use() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_in_use;
}
}  // namespace zaya::simt
