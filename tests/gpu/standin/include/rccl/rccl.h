// Compile-only stand-in for RCCL's <rccl/rccl.h>. It declares just the subset of the public API
// that zaya uses (the src/backend/cuda/comm_nccl*.cu communicator), under the library's
// documented names, signatures and enumerator values, so that CI can compile the RCCL path of the
// HIP build (scripts/hip_standin_check.sh) on a machine without RCCL. Nothing here is ever
// linked, installed or run; where a real RCCL is installed, cmake/cuda.cmake finds its header
// under /opt/rocm and that one is always preferred.
//
// RCCL declares NCCL's C API under NCCL's names; only the stream type differs (hipStream_t).
// Reference: the RCCL API documentation (rocm.docs.amd.com) and NCCL's user guide for the
// shared names. The declarations are tests/common/nccl_subset.h, which the host emulation's NCCL
// shares.
#pragma once

#include <hip/hip_runtime.h>  // hipStream_t

// ROCm 6.3's RCCL makes the handle point to a const object (NCCL and older RCCL do not); the
// stand-in does the same, so the code must compile with either.
typedef const struct ncclComm* ncclComm_t;
typedef hipStream_t zaya_nccl_stream_t;

#include "../../../../common/nccl_subset.h"
