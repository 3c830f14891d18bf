// Backend buffers owned for the duration of one call (forward, training step), freed on exit.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace zaya {

class Scratch {
 public:
  explicit Scratch(Backend& be) : be_(be) {}
  ~Scratch() {
    for (void* p : owned_) be_.free(p);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* f(int64_t n) {
    float* p = be_.alloc(n);
    owned_.push_back(p);
    return p;
  }
  int32_t* i(int64_t n) { return reinterpret_cast<int32_t*>(f(n)); }

 private:
  Backend& be_;
  std::vector<void*> owned_;
};

}  // namespace zaya
