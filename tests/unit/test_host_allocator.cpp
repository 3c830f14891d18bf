// The CPU backend keeps large freed blocks in the heap (backend/cpu/host_allocator.h): blocks
// freed and allocated again reuse memory already mapped, so a repeated step costs no page faults
// (by default glibc unmaps such blocks on free and every later step faults them in again).
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/host_allocator.h"

namespace zaya {
namespace {

long minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
// One "step": the blocks of a training step's ops, allocated, written and freed in turn.
void one_step(CpuBackend& cpu) {
  const int64_t mib_floats = int64_t(1) << 18;
  std::vector<float*> blocks;
  blocks.reserve(5);  // before the blocks, so that no small allocation sits between them
  for (int64_t mib : {48, 4, 40, 2, 1}) {
    blocks.push_back(cpu.alloc(mib * mib_floats));
    std::memset(blocks.back(), 1, size_t(mib * mib_floats) * 4);
  }
  for (float* b : blocks) cpu.free(b);
}

TEST(HostAllocator, RepeatedStepsReuseTheirLargeBlocksWithoutPageFaults) {
  CpuBackend cpu;  // applies the settings
  EXPECT_TRUE(keep_large_blocks_in_heap());
  // The heap settles on a layout that fits the step within a few steps (9 here); by default the
  // blocks above 32 MiB (glibc's largest automatic mmap threshold) are mapped and unmapped every
  // step, about 22,000 page faults each.
  for (int warmup = 0; warmup < 16; ++warmup) one_step(cpu);
  const long before = minor_faults();
  for (int step = 0; step < 4; ++step) one_step(cpu);
  const long faults = minor_faults() - before;
  // The 4 steps touch 380 MiB (97,000 pages of 4 KiB); memory kept in the heap needs none of
  // them faulted in again.
  EXPECT_LT(faults, 256) << "4 repeated steps of 95 MiB in 5 blocks faulted " << faults << " pages";
}
#else
TEST(HostAllocator, RepeatedStepsReuseTheirLargeBlocksWithoutPageFaults) {
  GTEST_SKIP() << "skipped: the C library is not glibc, or a sanitizer replaced the allocator";
}
#endif

}  // namespace
}  // namespace zaya
