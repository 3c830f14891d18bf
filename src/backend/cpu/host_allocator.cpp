// The C allocator's large-block settings for the CPU backend (host_allocator.h).
#include "backend/cpu/host_allocator.h"

#include <mutex>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace zaya {

bool keep_large_blocks_in_heap() {
  static std::once_flag once;
  static bool in_effect = false;
  std::call_once(once, [] {
#if defined(__GLIBC__)
    // mallopt fixes both values (glibc otherwise moves its mmap threshold with the blocks freed).
    in_effect = mallopt(M_MMAP_THRESHOLD, int(kHeapBlockLimitBytes)) == 1 &&
                mallopt(M_TRIM_THRESHOLD, int(kHeapKeepFreeBytes)) == 1;
#endif
  });
  return in_effect;
}

}  // namespace zaya
