// Node health checks run before a job starts (`zaya doctor`, and `zaya launch --preflight` before
// every attempt; spec D.7's "GEMM burn-in + all-reduce check"). Every rank:
//   1. GEMM: multiplies random matrices on its backend and checks sampled outputs against a
//      float64 dot product (a wrong answer is a broken device);
//   2. burn-in: repeats that GEMM for a while, timing it (GFLOP/s) and checking that every
//      repetition gives bitwise the same result (an unstable device differs);
//   3. all-reduce: sums a buffer over all ranks, checks every element exactly and times it
//      (bus bandwidth, as NCCL's tests define it: algorithm bandwidth x 2(n-1)/n).
// The ranks then share their results; a rank fails when a check fails or when its GEMM rate is
// below min_gemm_ratio x the median rank's (a straggler slows every step of a synchronous job).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zaya {

class Comm;

// The GEMM under test, y[n,n] = x[n,n] w[n,n]^T on some device: load() copies the host operands
// in, run() multiplies (it may return before the device has finished), read() waits for the
// device and copies y out to the host.
class HealthGemm {
 public:
  virtual ~HealthGemm() = default;
  virtual void load(const float* x, const float* w, int64_t n) = 0;
  virtual void run() = 0;
  virtual void read(float* y) = 0;
};

struct HealthCheckOptions {
  int64_t gemm_size = 1024;      // M = N = K
  double gemm_tolerance = 1e-5;  // |y - ref| <= tol * sum_k |x w| per sampled element (bf16: 1e-2)
  double burn_in_seconds = 2;    // GEMM repetitions for at least this long (at least 4)
  int64_t allreduce_bytes = int64_t(16) << 20;
  double min_gemm_ratio = 0.5;  // a rank below this fraction of the median GEMM rate fails
};

struct RankHealth {
  int rank = 0;
  std::string host;
  double gemm_gflops = 0;
  double gemm_max_error = 0;  // worst sampled |y - ref| / sum_k |x w|
  bool gemm_ok = false;       // within the tolerance
  bool repeat_ok = false;     // every burn-in repetition bitwise equal
  bool allreduce_ok = false;  // every element exact
  double allreduce_gbps = 0;  // bus bandwidth, GB/s (0 with one rank)
  bool slow = false;          // below min_gemm_ratio x the median rate
  bool ok() const { return gemm_ok && repeat_ok && allreduce_ok && !slow; }
};

struct HealthReport {
  std::vector<RankHealth> ranks;  // every rank's, in rank order (on every rank)
  bool ok() const;
  std::string table() const;  // one line per rank, with what failed
};

// Sets each rank's `slow`: its GEMM rate is below min_ratio x the median rank's.
void flag_slow_ranks(HealthReport& report, double min_ratio);

// Collective: every rank of comm calls it with the same options.
HealthReport run_health_check(HealthGemm& gemm, Comm& comm, const HealthCheckOptions& options);

}  // namespace zaya
