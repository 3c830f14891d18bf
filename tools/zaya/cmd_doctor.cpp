// `zaya doctor`: node health checks on every rank (under mpirun: every rank of the job) before
// trusting the machines with a run: GEMM correctness and burn-in on the backend, and an exact
// all-reduce across ranks (src/supervise/health_check.h). Exits 1 when any rank fails; `zaya
// launch --preflight` runs it before every attempt.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/backend.h"
#include "commands.h"
#include "core/error.h"
#include "dist/comm.h"
#include "supervise/health_check.h"

namespace zaya::cli {

namespace {

// The GEMM under test on a zaya backend: its `linear` op on its own memory.
class BackendGemm : public HealthGemm {
 public:
  explicit BackendGemm(Backend& be) : be_(be) {}
  ~BackendGemm() override { release(); }
  void load(const float* x, const float* w, int64_t n) override {
    release();
    n_ = n;
    x_ = be_.alloc(n * n);
    w_ = be_.alloc(n * n);
    y_ = be_.alloc(n * n);
    be_.from_host(x_, x, n * n * 4);
    be_.from_host(w_, w, n * n * 4);
  }
  void run() override { be_.linear(x_, w_, nullptr, y_, n_, n_, n_); }
  void read(float* y) override { be_.to_host(y, y_, n_ * n_ * 4); }
  void release() {
    for (float* p : {x_, w_, y_})
      if (p) be_.free(p);
    x_ = w_ = y_ = nullptr;
  }

 private:
  Backend& be_;
  int64_t n_ = 0;
  float *x_ = nullptr, *w_ = nullptr, *y_ = nullptr;
};

struct DoctorOptions {
  std::string backend = "cpu";
  int64_t gemm_size = 0;
  double burn_in = 2, allreduce_mb = 16, min_gemm_ratio = 0.5, comm_timeout = 120;
};

void run_doctor(const DoctorOptions& o) {
  CommOptions co;
  co.timeout_s = o.comm_timeout;
  std::unique_ptr<Comm> comm = make_comm(co);
  auto be = make_backend(o.backend, comm->local_rank());
  const bool cpu = be->name() == "cpu";
  HealthCheckOptions ho;
  ho.gemm_size = o.gemm_size > 0 ? o.gemm_size : (cpu ? 1024 : 8192);
  // Matmuls on a GPU take bf16 operands (8 significant bits) with fp32 accumulation.
  ho.gemm_tolerance = cpu ? 1e-5 : 2e-2;
  ho.burn_in_seconds = o.burn_in;
  ho.allreduce_bytes = std::max<int64_t>(4, int64_t(o.allreduce_mb * double(1 << 20)));
  ho.min_gemm_ratio = o.min_gemm_ratio;
  BackendGemm gemm(*be);
  const HealthReport report = run_health_check(gemm, *comm, ho);
  if (comm->rank() == 0) {
    std::printf("zaya doctor: %d rank%s over %s, backend %s, GEMM %lld^3 for %.1f s, all-reduce %.1f MiB\n",
                comm->size(), comm->size() == 1 ? "" : "s", comm->name().c_str(), be->name().c_str(),
                (long long)ho.gemm_size, ho.burn_in_seconds, double(ho.allreduce_bytes) / double(1 << 20));
    std::printf("%s", report.table().c_str());
    std::printf("zaya doctor: %s\n", report.ok() ? "all ranks healthy" : "UNHEALTHY");
    std::fflush(stdout);
  }
  if (!report.ok()) std::exit(1);  // every rank: the verdict is shared
}

}  // namespace

void add_doctor(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "doctor", "Health checks on every rank: GEMM correctness and burn-in, an exact all-reduce");
  static DoctorOptions o;
  cmd->add_option("--backend", o.backend, "cpu, or cuda in a GPU build")->capture_default_str();
  cmd->add_option("--gemm-size", o.gemm_size, "GEMM side n (0 = 1024 on the CPU, 8192 on a GPU)")
      ->capture_default_str();
  cmd->add_option("--burn-in", o.burn_in, "Seconds of repeated GEMMs")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--allreduce-mb", o.allreduce_mb, "All-reduce size in MiB")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--min-gemm-ratio", o.min_gemm_ratio,
                  "A rank below this fraction of the median GEMM rate fails")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--comm-timeout", o.comm_timeout, "Watchdog seconds per collective")->capture_default_str();
  cmd->callback([] { run_doctor(o); });
}

}  // namespace zaya::cli
