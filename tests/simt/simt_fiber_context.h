// The fiber switch of the host GPU emulation (simt_runtime.cpp): every GPU thread of a block is a
// fiber with its own stack, and the scheduler switches to and from it at each barrier and
// warp-wide instruction, so a block of 256 threads switches thousands of times per kernel.
// On x86-64 a switch saves and restores the registers the System V ABI says a call preserves
// (rbx, rbp, r12-r15 and the stack pointer; the floating-point control words too are preserved
// by the ABI, but nothing in the emulation changes them, so every fiber has the same): tens of
// nanoseconds, against about a microsecond for swapcontext, which also saves the signal mask
// with a system call. Elsewhere it is ucontext.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace zaya::simt {

struct FiberContext {
#if defined(__x86_64__)
  void* sp = nullptr;  // the saved stack pointer; the saved registers lie above it
#else
  ucontext_t uc{};
#endif
};

// Prepares `c` to start entry() on the stack [stack, stack + bytes) when it is first switched
// to. entry must never return (it switches away for the last time instead).
void fiber_context_init(FiberContext& c, unsigned char* stack, size_t bytes, void (*entry)());

// Saves the running context in `from` and continues `to`; returns when something switches back
// to `from`.
void fiber_switch(FiberContext& from, FiberContext& to);

}  // namespace zaya::simt
