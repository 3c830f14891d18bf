// Plain C++ entry points of the GPU backend (no vendor header): what make_backend("cuda") and
// the GPU tests call. Defined in cuda_backend.cu; only linked when zaya is configured with
// -DZAYA_CUDA=ON (compile definition ZAYA_CUDA).
#pragma once
#include <memory>

#include "backend/backend.h"

namespace zaya {

struct CudaBackendOptions {
  int device = 0;
  // true: linear and MoE GEMMs take bf16 operands (fp32 accumulation, fp32 outputs), the
  // project's GPU precision policy. false: every GEMM in fp32 (for exact comparisons).
  bool bf16_matmul = true;
  // true: our tiled GEMM kernel even where cuBLASLt/hipBLASLt exists (tests the HIP path on CUDA).
  bool portable_gemm = false;
  // true (with bf16_matmul): the MoE's experts run as grouped GEMMs driven by the routing
  // offsets on the device, with no host round trip per layer (gpu_grouped_gemm.h; tensor cores
  // on CUDA sm_80+, FMAs on HIP or with portable_gemm).
  // false: one BLASLt GEMM per expert after copying the offsets to the host. Off by default
  // until the grouped kernels have been checked on a GPU; make_backend turns it on when the
  // environment sets ZAYA_MOE_DEVICE_GROUPED=1.
  bool moe_device_grouped = false;
};

// The GPU backend (CUDA, or HIP when built with hipcc). Throws zaya::Error("cuda", ...) when
// no device is usable.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});

// Number of usable GPUs (0 when there is no driver or no device); never throws.
int cuda_device_count();

}  // namespace zaya
