// error_of(f): the message of the zaya::Error that f throws, or "" when it throws none. Shared
// by the checkpoint tests (tests/unit/test_dist_checkpoint.cpp, tests/mpi/dist_ckpt_check.cpp).
#pragma once
#include <functional>
#include <string>

#include "core/error.h"

namespace zaya::test {

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace zaya::test
