// The one vendor header of the GPU backend: maps the runtime names our kernels use (streams,
// memory, copies, events, errors, warp shuffles, the warp-size query) to CUDA or to HIP, and
// selects the collective library (NCCL or RCCL) for the files that ask for it.
// Everything else in src/backend/cuda/ includes this file and never a vendor header.
//
// HIP is selected by ZAYA_HIP (set by cmake/cuda.cmake for hipcc builds) or by hipcc's own
// __HIP_PLATFORM_AMD__. bf16 is carried as raw 16-bit storage (bf16_t, see gpu_device.h), so
// no vendor bf16 type is needed: BLAS libraries only see its bytes.
//
// ZAYA_GPU_MMA_SYNC marks the builds whose kernels may use the PTX tensor-core instructions
// (CUDA, and the host emulation with 32-lane warps); their launchers are left out elsewhere.
//
// Warp size: 32 on NVIDIA, 64 on CDNA (gfx90a). Device code uses GPU_WARP_SIZE (a compile-time
// constant of the device target); host code asks the device (gpu_device_warp_size()) and the backend
// checks at start-up that both agree. No kernel hard-codes 32.
//
// Status: compiled for sm_80/sm_90 (nvcc) and gfx90a (hipcc); the CUDA side ran on an H100,
// nothing has run on an AMD GPU. The hipBLASLt and RCCL paths below are compiled (CI) against our
// stand-in declarations only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/error.h"

#if defined(ZAYA_SIMT)
// The host emulation of the GPU (tests/simt/simt_runtime.h): kernels compiled as plain C++ and
// run by fibers on the CPU, and the runtime API on host memory (tests/simt/simt_host_api.h), so
// that tests run the whole backend without a GPU. No BLASLt: GEMMs take our tiled kernel.
#include "simt_runtime.h"
#if GPU_WARP_SIZE == 32
#define ZAYA_GPU_MMA_SYNC 1  // mma.sync, ldmatrix and cp.async are emulated for 32-lane warps
#endif
#elif defined(ZAYA_HIP) || defined(__HIP_PLATFORM_AMD__)
#define ZAYA_GPU_HIP 1
#include <hip/hip_runtime.h>

using gpuError_t = hipError_t;
using gpuStream_t = hipStream_t;
using gpuEvent_t = hipEvent_t;
#define gpuSuccess hipSuccess
#define gpuErrorMemoryAllocation hipErrorOutOfMemory
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuSetDevice hipSetDevice
#define gpuGetDevice hipGetDevice
#define gpuDeviceGetPCIBusId hipDeviceGetPCIBusId
#define gpuMalloc hipMalloc
#define gpuFuncSetAttribute hipFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define gpuMemGetInfo hipMemGetInfo
#define gpuFree hipFree
#define gpuMallocHost(p, bytes) hipHostMalloc((p), (bytes), hipHostMallocDefault)
#define gpuFreeHost hipHostFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuStreamCreate hipStreamCreate
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuEventCreate hipEventCreate
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuErrorNotReady hipErrorNotReady
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamWaitEvent hipStreamWaitEvent
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuEventQuery hipEventQuery
// The null stream: HIP gives it the legacy semantics (it orders with every blocking stream).
#define gpuStreamLegacy (static_cast<hipStream_t>(nullptr))

inline int gpu_device_warp_size(int device) {
  int v = 0;
  if (hipDeviceGetAttribute(&v, hipDeviceAttributeWarpSize, device) != hipSuccess) return 0;
  return v;
}

// The device's multiprocessors (compute units on AMD; 0 when it cannot be read).
inline int gpu_device_multiprocessors(int device) {
  int v = 0;
  if (hipDeviceGetAttribute(&v, hipDeviceAttributeMultiprocessorCount, device) != hipSuccess) return 0;
  return v;
}

// Whether p is device (or managed) memory; *device is then the GPU it belongs to. Never throws.
inline bool gpu_pointer_on_device(const void* p, int* device) {
  hipPointerAttribute_t a{};
  if (hipPointerGetAttributes(&a, p) != hipSuccess) {
    (void)hipGetLastError();  // plain host memory is an error here, not a sticky one
    return false;
  }
#if HIP_VERSION_MAJOR >= 6
  const bool on_device = a.type == hipMemoryTypeDevice || a.type == hipMemoryTypeManaged;
#else
  const bool on_device = a.memoryType == hipMemoryTypeDevice || a.isManaged != 0;
#endif
  if (on_device) *device = a.device;
  return on_device;
}

// Device-side warp size of the target being compiled (64 on gfx90a). The host pass of hipcc
// does not define __AMDGCN_WAVEFRONT_SIZE; host code must use gpu_device_warp_size() instead.
// (Newer ROCm deprecates the macro; the backend's start-up check catches any mismatch.)
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define GPU_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define GPU_WARP_SIZE 64
#endif
#define gpu_shfl_xor(v, mask) __shfl_xor((v), (mask))

#else  // CUDA
#define ZAYA_GPU_CUDA 1
#define ZAYA_GPU_MMA_SYNC 1  // the tensor-core kernels' mma.sync, ldmatrix and cp.async (sm_80+)
#include <cuda_runtime.h>
#if defined(__CUDACC__)
#include <mma.h>  // WMMA tensor-core fragments (gpu_grouped_gemm.cu); brings cuda_bf16.h
#endif

using gpuError_t = cudaError_t;
using gpuStream_t = cudaStream_t;
using gpuEvent_t = cudaEvent_t;
#define gpuSuccess cudaSuccess
#define gpuErrorMemoryAllocation cudaErrorMemoryAllocation
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuSetDevice cudaSetDevice
#define gpuGetDevice cudaGetDevice
#define gpuDeviceGetPCIBusId cudaDeviceGetPCIBusId
#define gpuMalloc cudaMalloc
#define gpuFuncSetAttribute cudaFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define gpuMemGetInfo cudaMemGetInfo
#define gpuFree cudaFree
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuStreamCreate cudaStreamCreate
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuEventCreate cudaEventCreate
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuErrorNotReady cudaErrorNotReady
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamWaitEvent cudaStreamWaitEvent
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventQuery cudaEventQuery
// The legacy default stream (orders with every blocking stream), even under per-thread default streams.
#define gpuStreamLegacy cudaStreamLegacy

inline int gpu_device_warp_size(int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, device) != cudaSuccess) return 0;
  return v;
}

// The device's multiprocessors (0 when it cannot be read).
inline int gpu_device_multiprocessors(int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) return 0;
  return v;
}

// The device's compute capability major number (0 when it cannot be read).
inline int gpu_device_compute_major(int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return 0;
  return v;
}

// The most dynamic shared memory one block may ask for (bytes; 0 when it cannot be read).
inline int gpu_device_max_shared_per_block(int device) {
  int v = 0;
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return 0;
  return v;
}

// Whether p is device (or managed) memory; *device is then the GPU it belongs to. Never throws.
inline bool gpu_pointer_on_device(const void* p, int* device) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  const bool on_device = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  if (on_device) *device = a.device;
  return on_device;
}

#define GPU_WARP_SIZE 32
#define gpu_shfl_xor(v, mask) __shfl_xor_sync(0xffffffffu, (v), (mask))
#endif

// ---- BLASLt (cuBLASLt on CUDA; hipBLASLt on HIP when ZAYA_HAVE_HIPBLASLT is defined) ----
// Without a BLASLt library the GEMM falls back to our own tiled kernel (gpu_gemm_tiled.cu).
#if defined(ZAYA_GPU_CUDA)
#define ZAYA_GPU_BLASLT 1
#include <cublasLt.h>
using gpuBlasLtHandle_t = cublasLtHandle_t;
using gpuBlasLtMatmulDesc_t = cublasLtMatmulDesc_t;
using gpuBlasLtMatrixLayout_t = cublasLtMatrixLayout_t;
using gpuBlasLtPreference_t = cublasLtMatmulPreference_t;
using gpuBlasLtHeuristic_t = cublasLtMatmulHeuristicResult_t;
using gpuBlasStatus_t = cublasStatus_t;
using gpuBlasOp_t = cublasOperation_t;
#define GPU_BLAS_SUCCESS CUBLAS_STATUS_SUCCESS
#define GPU_BLAS_OP_N CUBLAS_OP_N
#define GPU_BLAS_OP_T CUBLAS_OP_T
#define GPU_BLAS_COMPUTE_32F CUBLAS_COMPUTE_32F
#define GPU_BLAS_COMPUTE_32F_FAST_TF32 CUBLAS_COMPUTE_32F_FAST_TF32
#define GPU_R_32F CUDA_R_32F
#define GPU_R_16BF CUDA_R_16BF
#define GPU_BLASLT_DESC_TRANSA CUBLASLT_MATMUL_DESC_TRANSA
#define GPU_BLASLT_DESC_TRANSB CUBLASLT_MATMUL_DESC_TRANSB
#define GPU_BLASLT_DESC_EPILOGUE CUBLASLT_MATMUL_DESC_EPILOGUE
#define GPU_BLASLT_DESC_BIAS_POINTER CUBLASLT_MATMUL_DESC_BIAS_POINTER
#define GPU_BLASLT_DESC_BIAS_DATA_TYPE CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
using gpuDataType_t = cudaDataType_t;
#define GPU_BLASLT_EPILOGUE_BIAS CUBLASLT_EPILOGUE_BIAS
using gpuBlasLtEpilogue_t = cublasLtEpilogue_t;
#define GPU_BLASLT_PREF_MAX_WORKSPACE CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#define GPU_BLASLT_HAS_ALIGNMENT_PREFS 1
#define gpuBlasLtCreate cublasLtCreate
#define gpuBlasLtDestroy cublasLtDestroy
#define gpuBlasLtMatmulDescCreate cublasLtMatmulDescCreate
#define gpuBlasLtMatmulDescDestroy cublasLtMatmulDescDestroy
#define gpuBlasLtMatmulDescSetAttribute cublasLtMatmulDescSetAttribute
#define gpuBlasLtMatrixLayoutCreate cublasLtMatrixLayoutCreate
#define gpuBlasLtMatrixLayoutDestroy cublasLtMatrixLayoutDestroy
#define gpuBlasLtPreferenceCreate cublasLtMatmulPreferenceCreate
#define gpuBlasLtPreferenceDestroy cublasLtMatmulPreferenceDestroy
#define gpuBlasLtPreferenceSetAttribute cublasLtMatmulPreferenceSetAttribute
#define gpuBlasLtAlgoGetHeuristic cublasLtMatmulAlgoGetHeuristic
#define gpuBlasLtMatmul cublasLtMatmul
#define gpuBlasLtMatrixLayoutSetAttribute cublasLtMatrixLayoutSetAttribute
#define GPU_BLASLT_LAYOUT_BATCH_COUNT CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT
#define GPU_BLASLT_LAYOUT_BATCH_STRIDE CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
#elif defined(ZAYA_HAVE_HIPBLASLT)
// Written against the hipBLASLt API (ROCm >= 6: hipDataType, hipblasComputeType_t). Debian has no
// hipBLASLt: CI compiles this path against our stand-in declarations
// (tests/gpu/standin/include/hipblaslt/hipblaslt.h, scripts/hip_standin_check.sh), never against
// the real library, and it has never run.
#define ZAYA_GPU_BLASLT 1
#include <hipblaslt/hipblaslt.h>
using gpuBlasLtHandle_t = hipblasLtHandle_t;
using gpuBlasLtMatmulDesc_t = hipblasLtMatmulDesc_t;
using gpuBlasLtMatrixLayout_t = hipblasLtMatrixLayout_t;
using gpuBlasLtPreference_t = hipblasLtMatmulPreference_t;
using gpuBlasLtHeuristic_t = hipblasLtMatmulHeuristicResult_t;
using gpuBlasStatus_t = hipblasStatus_t;
using gpuBlasOp_t = hipblasOperation_t;
#define GPU_BLAS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define GPU_BLAS_OP_N HIPBLAS_OP_N
#define GPU_BLAS_OP_T HIPBLAS_OP_T
#define GPU_BLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define GPU_BLAS_COMPUTE_32F_FAST_TF32 HIPBLAS_COMPUTE_32F_FAST_TF32
#define GPU_R_32F HIP_R_32F
#define GPU_R_16BF HIP_R_16BF
#define GPU_BLASLT_DESC_TRANSA HIPBLASLT_MATMUL_DESC_TRANSA
#define GPU_BLASLT_DESC_TRANSB HIPBLASLT_MATMUL_DESC_TRANSB
#define GPU_BLASLT_DESC_EPILOGUE HIPBLASLT_MATMUL_DESC_EPILOGUE
#define GPU_BLASLT_DESC_BIAS_POINTER HIPBLASLT_MATMUL_DESC_BIAS_POINTER
#define GPU_BLASLT_DESC_BIAS_DATA_TYPE HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
using gpuDataType_t = hipDataType;
#define GPU_BLASLT_EPILOGUE_BIAS HIPBLASLT_EPILOGUE_BIAS
using gpuBlasLtEpilogue_t = hipblasLtEpilogue_t;
#define GPU_BLASLT_PREF_MAX_WORKSPACE HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#define gpuBlasLtCreate hipblasLtCreate
#define gpuBlasLtDestroy hipblasLtDestroy
#define gpuBlasLtMatmulDescCreate hipblasLtMatmulDescCreate
#define gpuBlasLtMatmulDescDestroy hipblasLtMatmulDescDestroy
#define gpuBlasLtMatmulDescSetAttribute hipblasLtMatmulDescSetAttribute
#define gpuBlasLtMatrixLayoutCreate hipblasLtMatrixLayoutCreate
#define gpuBlasLtMatrixLayoutDestroy hipblasLtMatrixLayoutDestroy
#define gpuBlasLtPreferenceCreate hipblasLtMatmulPreferenceCreate
#define gpuBlasLtPreferenceDestroy hipblasLtMatmulPreferenceDestroy
#define gpuBlasLtPreferenceSetAttribute hipblasLtMatmulPreferenceSetAttribute
#define gpuBlasLtAlgoGetHeuristic hipblasLtMatmulAlgoGetHeuristic
#define gpuBlasLtMatmul hipblasLtMatmul
#define gpuBlasLtMatrixLayoutSetAttribute hipblasLtMatrixLayoutSetAttribute
#define GPU_BLASLT_LAYOUT_BATCH_COUNT HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT
#define GPU_BLASLT_LAYOUT_BATCH_STRIDE HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET
#endif

// ---- Collectives: NCCL on CUDA, RCCL on HIP (only where ZAYA_HAVE_RCCL is defined) ----
// Opt-in: a file that needs them defines ZAYA_GPU_WANT_COLLECTIVES before including this header
// (only the comm_nccl*.cu files do), so the other kernels neither pull in nccl.h (and its fp16/bf16/fp8
// headers) nor need NCCL installed. ZAYA_GPU_COLLECTIVES is then 1 when the library's header was
// included. RCCL declares the nccl* API under the same names (ncclComm_t, ncclAllReduce, ...), so
// the two differ only in the header. RCCL's header is <rccl/rccl.h> from ROCm 5.x on (older
// releases: <rccl.h>). Debian has no RCCL package: CI compiles the HIP side against our stand-in
// declarations (tests/gpu/standin/include/rccl/rccl.h, scripts/hip_standin_check.sh), never
// against RCCL's own header, and it has never run. The host emulation (ZAYA_SIMT) has an NCCL of
// its own, over MPI.
#if defined(ZAYA_GPU_WANT_COLLECTIVES)
#if defined(ZAYA_SIMT)
// The host emulation's NCCL (tests/simt/simt_nccl.h): the same API over MPI on host memory.
#include "simt_nccl.h"
#define ZAYA_GPU_COLLECTIVES 1
#elif defined(ZAYA_GPU_HIP)
#if defined(ZAYA_HAVE_RCCL)
#if __has_include(<rccl/rccl.h>)
#include <rccl/rccl.h>
#else
#include <rccl.h>
#endif
#define ZAYA_GPU_COLLECTIVES 1
#endif
#else  // CUDA
#include <nccl.h>
#define ZAYA_GPU_COLLECTIVES 1
#endif
#if defined(ZAYA_GPU_COLLECTIVES) && defined(NCCL_VERSION_CODE) && defined(NCCL_VERSION)
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
#define ZAYA_GPU_NCCL_LAST_ERROR 1  // ncclGetLastError(comm): the library's detail on the last error
#endif
#endif
#endif

namespace zaya {

// Throws zaya::Error("cuda", "<call> failed: <vendor error string> at file:line").
inline void gpu_check(gpuError_t e, const char* call, const char* file, int line) {
  if (e == gpuSuccess) return;
  fail("cuda", std::string(call) + " failed: " + gpuGetErrorString(e) + " at " + file + ":" + std::to_string(line),
       "check that a supported GPU is present and has enough free memory");
}

// Launches `kernel` over grid x block threads with `shared_bytes` of dynamic shared memory on
// `stream`: the one launch site of the backend (kernel<<<grid, block, shared_bytes, stream>>>
// on CUDA and HIP). The arguments convert to the kernel's parameter types here, as in a
// triple-chevron launch. Under the host emulation (ZAYA_SIMT) the grid runs at once on the CPU.
#if defined(ZAYA_SIMT)
template <typename... Params>
void gpu_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, gpuStream_t stream,
                std::type_identity_t<Params>... args) {
  (void)stream;  // one stream: kernels run in launch order, each to completion
  if (!::zaya::simt::check_launch(reinterpret_cast<const void*>(kernel), grid, block, shared_bytes))
    return;  // refused, as the hardware would: gpuGetLastError reports it (GPU_LAUNCH_CHECK)
  ::zaya::simt::launch(grid, block, shared_bytes, [&] { kernel(args...); });
}
#elif defined(__CUDACC__) || defined(__HIPCC__)
template <typename... Params>
void gpu_launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, gpuStream_t stream,
                std::type_identity_t<Params>... args) {
  kernel<<<grid, block, shared_bytes, stream>>>(args...);
}
#endif

}  // namespace zaya

#define GPU_CHECK(call) ::zaya::gpu_check((call), #call, __FILE__, __LINE__)
// After every kernel launch: reports launch-configuration errors at the launch site.
#define GPU_LAUNCH_CHECK() ::zaya::gpu_check(gpuGetLastError(), "kernel launch", __FILE__, __LINE__)
