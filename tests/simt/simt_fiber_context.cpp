// The fiber switch (simt_fiber_context.h): a few instructions of x86-64 assembly, or ucontext.
#include "simt_fiber_context.h"

#include <cstdint>

#if defined(__x86_64__)
// zaya_simt_switch(void** save_sp, void* next_sp): pushes the callee-saved registers, stores
// the stack pointer in *save_sp, then loads next_sp and pops the same set from there, returning
// into the other fiber.
extern "C" void zaya_simt_switch(void** save_sp, void* next_sp);
asm(R"(
  .pushsection .text
  .globl zaya_simt_switch
  .hidden zaya_simt_switch
  .type zaya_simt_switch, @function
zaya_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size zaya_simt_switch, .-zaya_simt_switch
  .popsection
)");
#endif

namespace zaya::simt {

#if defined(__x86_64__)

void fiber_context_init(FiberContext& c, unsigned char* stack, size_t bytes, void (*entry)()) {
  // The frame zaya_simt_switch pops, from the lowest address: r15, r14, r13, r12, rbx, rbp (all
  // zero), then the address its `ret` jumps to (entry) and a null return address for entry
  // itself. The stack top is 16-byte aligned, so entry starts with rsp + 8 aligned to 16, as
  // after a call.
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
  auto* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                   // entry's return address: it never returns
  *--sp = reinterpret_cast<uint64_t>(entry);   // where the first switch's ret lands
  for (int r = 0; r < 6; ++r) *--sp = 0;       // rbp, rbx, r12, r13, r14, r15
  c.sp = sp;
}

void fiber_switch(FiberContext& from, FiberContext& to) { zaya_simt_switch(&from.sp, to.sp); }

#else

void fiber_context_init(FiberContext& c, unsigned char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}

void fiber_switch(FiberContext& from, FiberContext& to) { swapcontext(&from.uc, &to.uc); }

#endif

}  // namespace zaya::simt
