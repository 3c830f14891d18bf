// Deterministic random numbers that are identical on every platform and compiler: a
// counter-based splitmix64 stream with Box–Muller normals. Used for initialisation and
// sampling; its whole state is one counter, so it checkpoints trivially.
#pragma once
#include <cmath>
#include <cstdint>

namespace zaya {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : seed_(seed) {}
  uint64_t next_u64() {
    uint64_t z = seed_ + 0x9e3779b97f4a7c15ull * ++counter_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return double(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t counter() const { return counter_; }
  void set_counter(uint64_t c) { counter_ = c; }
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace zaya
