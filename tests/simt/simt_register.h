// Makes the host emulation of the GPU reachable through zaya_lib's factories in a build without
// CUDA: make_backend("cuda" / "cuda-fp32") returns the emulated GPU backend and make_device_comm
// the NCCL communicator on the emulated NCCL, so that programs built on the trainer (the
// data-parallel check, tests/dp/dp_check.cpp) run their GPU paths on the CPU.
#pragma once

namespace zaya::simt {
// Registers both; call once, before the first make_backend.
void register_emulated_gpu();
}  // namespace zaya::simt
