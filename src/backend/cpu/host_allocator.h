// How the CPU backend asks the C allocator to treat large blocks. Its ops allocate their
// activations and scratch per call (megabytes each, freed within the step); by default glibc
// serves blocks above its mmap threshold (never more than 32 MiB) with a fresh mmap and unmaps
// them on free, so every step faults in (and zeroes) the same memory again: about 70,000 page
// faults and a fifth of the CPU time of a `make demo` step. Keeping such blocks in the heap for
// reuse removes that.
#pragma once

namespace zaya {

// Blocks below kHeapBlockLimitBytes come from the heap, and up to kHeapKeepFreeBytes of free
// memory at the heap's top stay mapped for reuse. Process-wide and idempotent (the first call
// sets them; later calls do nothing); a no-op where the C library is not glibc, or where a
// sanitizer has replaced the allocator. Returns whether the settings are in effect.
constexpr long kHeapBlockLimitBytes = 256L << 20;
constexpr long kHeapKeepFreeBytes = 1L << 30;
bool keep_large_blocks_in_heap();

}  // namespace zaya
