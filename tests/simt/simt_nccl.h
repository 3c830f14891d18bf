// NCCL's API as the NCCL communicator (src/backend/cuda/comm_nccl*.cu) calls it, emulated on the
// CPU for the host emulation of the GPU (ZAYA_SIMT), so that the communicator runs in CI: with
// one rank in the emulated backend's tests, and with several ranks under mpirun
// (zaya_simt_nccl_check). Included by gpu_runtime.h when a file asks for the collectives.
//
// Semantics kept from NCCL (its user guide): the names, enumerator values and argument orders;
// counts in elements; in-place forms (recvbuff == sendbuff for AllReduce and Broadcast;
// recvbuff == sendbuff + rank * recvcount for ReduceScatter; sendbuff == recvbuff + rank *
// sendcount for AllGather); ncclGroupStart/End defer the calls between them and issue them
// together at the end, so sends and receives in one group cannot deadlock; messages between two
// ranks match in issue order; a communicator needs every rank to call ncclCommInitRank.
//
// What the emulation does differently: the ranks' data moves over zaya's MPI communicator
// (dist/comm_mpi.h) on the emulated device memory, which is host memory; a call (or a group, at
// ncclGroupEnd) returns when its data has arrived, as the emulated stream is in order and
// complete when a call returns; the ranks must be all of MPI_COMM_WORLD, with the communicator's
// rank equal to the world rank (zaya bootstraps from the MPI communicator, so they are); one rank
// needs no MPI. Every buffer must lie in emulated device memory (a host pointer is an
// ncclInvalidArgument, where NCCL would fault). ncclCommAbort cannot interrupt a call blocked in
// MPI; the watchdog exits the process right after it, as with NCCL.
#pragma once

#include <cstddef>

#include "simt_host_api.h"  // gpuStream_t

#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 22005  // the API of NCCL 2.20.5, which has every call zaya makes

struct ncclComm;
typedef struct ncclComm* ncclComm_t;

typedef struct {
  char internal[128];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
} ncclResult_t;

typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
} ncclDataType_t;

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, gpuStream_t stream);
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, gpuStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, gpuStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, gpuStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, gpuStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      gpuStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      gpuStream_t stream);

ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

namespace zaya::simt {
// Test hook: from the `after`-th data call on (counting from 1) of every communicator created
// afterwards in this process, ncclCommGetAsyncError reports ncclRemoteError, as NCCL does when a
// peer fails; 0 turns it off. The environment's ZAYA_SIMT_NCCL_ASYNC_ERROR_AFTER sets it too.
void nccl_fail_async_after(long after);
}  // namespace zaya::simt
