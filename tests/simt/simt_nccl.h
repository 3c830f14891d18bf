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

#include "simt_host_api.h"  // gpuStream_t

struct ncclComm;
typedef struct ncclComm* ncclComm_t;
typedef gpuStream_t zaya_nccl_stream_t;

#include "../common/nccl_subset.h"

namespace zaya::simt {
// Test hook: from the `after`-th data call on (counting from 1) of every communicator created
// afterwards in this process, ncclCommGetAsyncError reports ncclRemoteError, as NCCL does when a
// peer fails; 0 turns it off. The environment's ZAYA_SIMT_NCCL_ASYNC_ERROR_AFTER sets it too.
void nccl_fail_async_after(long after);
}  // namespace zaya::simt
