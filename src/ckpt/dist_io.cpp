// File names of sharded checkpoints (see dist_io.h).
#include "ckpt/dist_io.h"

#include <cstdio>

namespace zaya::dist_io {

std::string rank_file_name(int rank) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "rank-%05d.bin", rank);
  return buf;
}

}  // namespace zaya::dist_io
