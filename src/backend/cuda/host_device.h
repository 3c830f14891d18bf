// ZAYA_HOST_DEVICE marks plain C++ functions that both the GPU kernels and the CPU unit tests
// compile (index arithmetic, number formats), so that the host can check them: __host__
// __device__ under nvcc or hipcc, nothing in a host-only build. No vendor header.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__)
#define ZAYA_HOST_DEVICE __host__ __device__
#else
#define ZAYA_HOST_DEVICE
#endif
