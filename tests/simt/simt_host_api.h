// The GPU runtime API as the backend's host code calls it (gpuMalloc, copies, streams, events,
// device queries, launch limits), emulated on the CPU for the host emulation of the GPU
// (ZAYA_SIMT): one device whose memory is the process's heap, and one in-order stream, so a copy
// or a launch is complete when its call returns. Device allocations are recorded: a copy that
// reaches past one, a copy between overlapping ranges (undefined in CUDA), or a free of a pointer
// never allocated, is an error. New allocations hold NaN bytes, and under ASan a kernel that
// reads past the requested size is reported (the backend's pool rounds requests up and reuses
// blocks up to twice a request, so an overrun that stays in a pool block is not). Included by
// simt_runtime.h.
#pragma once

#include <cstddef>
#include <cstdint>

struct dim3;  // simt_runtime.h

using gpuError_t = int;
using gpuStream_t = void*;
using gpuEvent_t = void*;
constexpr gpuError_t gpuSuccess = 0;
constexpr gpuError_t gpuErrorMemoryAllocation = 2;
constexpr gpuError_t gpuErrorInvalidValue = 1;
constexpr gpuError_t gpuErrorNotReady = 600;

enum gpuMemcpyKind { gpuMemcpyHostToDevice = 1, gpuMemcpyDeviceToHost = 2, gpuMemcpyDeviceToDevice = 3 };
enum gpuFuncAttribute { gpuFuncAttributeMaxDynamicSharedMemorySize = 8 };
constexpr unsigned gpuStreamNonBlocking = 1;
constexpr unsigned gpuEventDisableTiming = 2;
#define gpuStreamLegacy (static_cast<gpuStream_t>(nullptr))

const char* gpuGetErrorString(gpuError_t e);
gpuError_t gpuGetLastError();

gpuError_t gpuGetDeviceCount(int* count);
gpuError_t gpuSetDevice(int device);
gpuError_t gpuGetDevice(int* device);
gpuError_t gpuMemGetInfo(size_t* free_bytes, size_t* total_bytes);
gpuError_t gpuDeviceGetPCIBusId(char* bus_id, int length, int device);

gpuError_t gpuMalloc(void** p, size_t bytes);
gpuError_t gpuFree(void* p);
// Events: an event recorded since the last stream synchronisation answers its first query
// gpuErrorNotReady, which (as on HIP) the calling thread's next gpuGetLastError reports, so a
// backend that polls must clear it.
// Pinned host memory. A copy to the device from it is asynchronous on a GPU: it may read its
// source at any time until an event recorded after it has been waited for (or queried as done)
// or the stream synchronised. The emulation copies at once but keeps the source bytes, and those
// points compare them with the buffer: a source rewritten while its copy could still be reading
// it is an error (the call returns gpuErrorInvalidValue and names it on stderr).
gpuError_t gpuMallocHost(void** p, size_t bytes);
gpuError_t gpuFreeHost(void* p);
gpuError_t gpuMemcpyAsync(void* dst, const void* src, size_t bytes, gpuMemcpyKind kind, gpuStream_t stream);
gpuError_t gpuMemsetAsync(void* dst, int value, size_t bytes, gpuStream_t stream);

gpuError_t gpuStreamCreate(gpuStream_t* stream);
gpuError_t gpuStreamCreateWithFlags(gpuStream_t* stream, unsigned flags);
gpuError_t gpuStreamDestroy(gpuStream_t stream);
gpuError_t gpuStreamSynchronize(gpuStream_t stream);
gpuError_t gpuStreamWaitEvent(gpuStream_t stream, gpuEvent_t event, unsigned flags);

gpuError_t gpuEventCreate(gpuEvent_t* event);
gpuError_t gpuEventCreateWithFlags(gpuEvent_t* event, unsigned flags);
gpuError_t gpuEventDestroy(gpuEvent_t event);
gpuError_t gpuEventRecord(gpuEvent_t event, gpuStream_t stream);
gpuError_t gpuEventSynchronize(gpuEvent_t event);
gpuError_t gpuEventQuery(gpuEvent_t event);
gpuError_t gpuEventElapsedTime(float* ms, gpuEvent_t start, gpuEvent_t end);

// A kernel's largest dynamic shared memory (the only attribute the backend sets): recorded for
// check_launch; over the device's most (kSimtMaxSharedBytes) is an error, as on the hardware.
gpuError_t gpuFuncSetAttribute(const void* kernel, gpuFuncAttribute attribute, int value);

// The emulated device: GPU_WARP_SIZE lanes (the build's), compute capability 9 (mma.sync is
// emulated for 32-lane warps). Shared memory a block as the device the warp width stands for:
// with 32 lanes an H100's (48 KiB unless a kernel's attribute allows more, up to 227 KiB); with
// 64 lanes a CDNA GPU's (gfx90a, MI300X: 64 KiB of LDS per workgroup, the most any kernel may
// have, attribute or not), so a kernel the HIP build launches with more fails here as there.
#if defined(ZAYA_SIMT_WARP_SIZE) && ZAYA_SIMT_WARP_SIZE == 64
inline constexpr int kSimtDefaultSharedBytes = 64 << 10;
inline constexpr int kSimtMaxSharedBytes = 64 << 10;
#else
inline constexpr int kSimtDefaultSharedBytes = 48 << 10;
inline constexpr int kSimtMaxSharedBytes = 227 << 10;
#endif
int gpu_device_warp_size(int device);
// 8 multiprocessors: few, so that launches the backend sizes to the device (the attention
// forward's key splits, attention_key_splits.h) take their small-device form at test sizes.
inline int gpu_device_multiprocessors(int) { return 8; }
inline int gpu_device_compute_major(int) { return 9; }
inline int gpu_device_max_shared_per_block(int) { return kSimtMaxSharedBytes; }
// Whether p lies in a live emulated device allocation (*device = 0 then).
bool gpu_pointer_on_device(const void* p, int* device);

namespace zaya::simt {
// What the backend's host code asked of the runtime since the process began: kernels launched,
// copies by direction, and the waits that hold the host until the stream is done (stream and
// event synchronisations; a copy to host memory also waits for the stream on a GPU). Tests
// count them across a stretch of work (a decode step) as the GPU would pay them.
struct ApiCounts {
  int64_t launches = 0;
  int64_t copies_to_device = 0;
  int64_t copies_to_host = 0;
  int64_t copies_on_device = 0;
  int64_t synchronizations = 0;
};
ApiCounts api_counts();
// Bytes held in emulated device allocations now (simt_leak_check.cpp: none once every backend
// is gone).
size_t device_bytes_in_use();
// Whether [p, p + bytes) lies inside one live emulated device allocation.
bool range_on_device(const void* p, size_t bytes);
// Whether a launch of `kernel` with this configuration is one the hardware accepts: every grid
// dimension at least 1 (x below 2^31, y and z at most 65,535), 1 to 1,024 threads a block (z at
// most 64), and dynamic shared memory within kSimtDefaultSharedBytes or within what
// gpuFuncSetAttribute allowed this kernel. When not, it records the launch error that
// gpuGetLastError then returns (as a CUDA launch does) and the kernel must not run.
bool check_launch(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes);
}  // namespace zaya::simt
