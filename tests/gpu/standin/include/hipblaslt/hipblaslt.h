// Compile-only stand-in for hipBLASLt's <hipblaslt/hipblaslt.h>. It declares just the subset of
// the public API that zaya uses (src/backend/cuda/gpu_runtime.h and gpu_gemm.cu), under the
// library's documented names, signatures and enumerator values, so that CI can compile the
// hipBLASLt path of the HIP build (scripts/hip_standin_check.sh) on a machine without hipBLASLt.
// Nothing here is ever linked, installed or run; where a real hipBLASLt (ROCm >= 6) is installed,
// cmake/cuda.cmake finds its header under /opt/rocm and that one is always preferred.
//
// Reference: the hipBLASLt API reference (rocm.docs.amd.com/projects/hipBLASLt) and, for the
// status / operation / compute-type enums the real header takes from hipblas-common, that
// library's documentation. Add a declaration here only when zaya starts using it.
#pragma once

#include <cstddef>
#include <cstdint>

#include <hip/hip_runtime.h>  // hipStream_t; hipDataType (hip/library_types.h)

// hipDataType comes from HIP itself. ROCm 6 lists the bf16 enumerator (value 14); older HIP
// headers, such as Debian's 5.2, stop at the fp16/32/64 types, so only that one name is added.
#if HIP_VERSION_MAJOR < 6 && !defined(HIP_R_16BF)
#define HIP_R_16BF (static_cast<hipDataType>(14))
#endif

// ---- From hipblas-common (a separate header in real ROCm) ----

typedef enum {
  HIPBLAS_STATUS_SUCCESS = 0,  // the failures (1 and up) are only ever printed as numbers
} hipblasStatus_t;

typedef enum {
  HIPBLAS_OP_N = 111,
  HIPBLAS_OP_T = 112,
} hipblasOperation_t;

typedef enum {
  HIPBLAS_COMPUTE_32F = 2,
  HIPBLAS_COMPUTE_32F_FAST_TF32 = 6,
} hipblasComputeType_t;

// ---- hipBLASLt ----

typedef enum {
  HIPBLASLT_EPILOGUE_BIAS = 4,
} hipblasLtEpilogue_t;

typedef enum {
  HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 0,           // int32_t
  HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 1,  // int64_t, in elements
} hipblasLtMatrixLayoutAttribute_t;

typedef enum {
  HIPBLASLT_MATMUL_DESC_TRANSA = 0,          // int32_t (hipblasOperation_t)
  HIPBLASLT_MATMUL_DESC_TRANSB = 1,          // int32_t (hipblasOperation_t)
  HIPBLASLT_MATMUL_DESC_EPILOGUE = 2,        // uint32_t (hipblasLtEpilogue_t)
  HIPBLASLT_MATMUL_DESC_BIAS_POINTER = 3,    // const void*
  HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 4,  // int32_t (hipDataType)
} hipblasLtMatmulDescAttributes_t;

typedef enum {
  HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,  // uint64_t
} hipblasLtMatmulPreferenceAttributes_t;

// The handle is an untyped pointer; descriptors point to opaque objects the library owns.
typedef void* hipblasLtHandle_t;
typedef struct zaya_standin_hipblaslt_matmul_desc* hipblasLtMatmulDesc_t;
typedef struct zaya_standin_hipblaslt_matrix_layout* hipblasLtMatrixLayout_t;
typedef struct zaya_standin_hipblaslt_preference* hipblasLtMatmulPreference_t;

// An algorithm as the heuristic returns it: plain bytes the caller keeps and passes back.
struct hipblasLtMatmulAlgo_t {
  uint8_t data[16] = {};
  size_t max_workspace_bytes = 0;
};

// One entry of the heuristic's answer; state tells whether algo is usable.
struct hipblasLtMatmulHeuristicResult_t {
  hipblasLtMatmulAlgo_t algo;
  size_t workspaceSize = 0;
  hipblasStatus_t state = HIPBLAS_STATUS_SUCCESS;
  float wavesCount = 1.0f;
  int reserved[4];
};

extern "C" {

hipblasStatus_t hipblasLtCreate(hipblasLtHandle_t* handle);
hipblasStatus_t hipblasLtDestroy(const hipblasLtHandle_t handle);

hipblasStatus_t hipblasLtMatrixLayoutCreate(hipblasLtMatrixLayout_t* matLayout, hipDataType type, uint64_t rows,
                                            uint64_t cols, int64_t ld);
hipblasStatus_t hipblasLtMatrixLayoutDestroy(const hipblasLtMatrixLayout_t matLayout);
hipblasStatus_t hipblasLtMatrixLayoutSetAttribute(hipblasLtMatrixLayout_t matLayout,
                                                  hipblasLtMatrixLayoutAttribute_t attr, const void* buf,
                                                  size_t sizeInBytes);

hipblasStatus_t hipblasLtMatmulDescCreate(hipblasLtMatmulDesc_t* matmulDesc, hipblasComputeType_t computeType,
                                          hipDataType scaleType);
hipblasStatus_t hipblasLtMatmulDescDestroy(const hipblasLtMatmulDesc_t matmulDesc);
hipblasStatus_t hipblasLtMatmulDescSetAttribute(hipblasLtMatmulDesc_t matmulDesc,
                                                hipblasLtMatmulDescAttributes_t attr, const void* buf,
                                                size_t sizeInBytes);

hipblasStatus_t hipblasLtMatmulPreferenceCreate(hipblasLtMatmulPreference_t* pref);
hipblasStatus_t hipblasLtMatmulPreferenceDestroy(const hipblasLtMatmulPreference_t pref);
hipblasStatus_t hipblasLtMatmulPreferenceSetAttribute(hipblasLtMatmulPreference_t pref,
                                                      hipblasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                      size_t sizeInBytes);

hipblasStatus_t hipblasLtMatmulAlgoGetHeuristic(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t matmulDesc,
                                                hipblasLtMatrixLayout_t Adesc, hipblasLtMatrixLayout_t Bdesc,
                                                hipblasLtMatrixLayout_t Cdesc, hipblasLtMatrixLayout_t Ddesc,
                                                hipblasLtMatmulPreference_t pref, int requestedAlgoCount,
                                                hipblasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                                int* returnAlgoCount);

hipblasStatus_t hipblasLtMatmul(hipblasLtHandle_t handle, hipblasLtMatmulDesc_t matmulDesc, const void* alpha,
                                const void* A, hipblasLtMatrixLayout_t Adesc, const void* B,
                                hipblasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                                hipblasLtMatrixLayout_t Cdesc, void* D, hipblasLtMatrixLayout_t Ddesc,
                                const hipblasLtMatmulAlgo_t* algo, void* workspace, size_t workspaceSizeInBytes,
                                hipStream_t stream);

}  // extern "C"
