// File names of sharded checkpoints and the slow-disk test hook (see dist_io.h).
#include "ckpt/dist_io.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace zaya::dist_io {

std::string rank_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

int test_disk_delay_ms() {
  static const int ms = [] {
    const char* d = std::getenv("ZAYA_CKPT_TEST_DISK_DELAY_MS");
    return d ? std::max(0, std::atoi(d)) : 0;
  }();
  return ms;
}

void test_disk_delay() {
  if (const int ms = test_disk_delay_ms(); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

}  // namespace zaya::dist_io
