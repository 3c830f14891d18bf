// Compile-only stand-in for RCCL's <rccl/rccl.h>. It declares just the subset of the public API
// that zaya uses (the src/backend/cuda/comm_nccl*.cu communicator), under the library's
// documented names, signatures and enumerator values, so that CI can compile the RCCL path of the
// HIP build (scripts/hip_standin_check.sh) on a machine without RCCL. Nothing here is ever
// linked, installed or run; where a real RCCL is installed, cmake/cuda.cmake finds its header
// under /opt/rocm and that one is always preferred.
//
// RCCL declares NCCL's C API under NCCL's names; only the stream type differs (hipStream_t).
// Reference: the RCCL API documentation (rocm.docs.amd.com) and NCCL's user guide for the
// shared names. Add a declaration here only when zaya starts using it.
#pragma once

#include <cstddef>

#include <hip/hip_runtime.h>  // hipStream_t

// The version this stand-in describes: NCCL API 2.20.5, as RCCL of ROCm 6.2/6.3 reports it. It
// is recent enough for every optional call zaya makes (ncclGetLastError: 2.13 and later).
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 22005

extern "C" {

// ROCm 6.3's RCCL makes the handle point to a const object (NCCL and older RCCL do not); the
// stand-in does the same, so the code must compile with either.
typedef const struct ncclComm* ncclComm_t;

// Made by one rank, sent to the others by the caller (128 opaque bytes).
typedef struct {
  char internal[128];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclInProgress = 7,  // the failures (1 to 6) are only ever turned into text by the library
} ncclResult_t;

typedef enum {
  ncclSum = 0,
  ncclMax = 2,
  ncclMin = 3,
} ncclRedOp_t;

typedef enum {
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt64 = 4,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
} ncclDataType_t;

// Communicators and errors.
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);

// Collectives and point-to-point: enqueued on stream.
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, hipStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      hipStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      hipStream_t stream);

// Groups: calls between start and end are issued together at the end.
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

}  // extern "C"
