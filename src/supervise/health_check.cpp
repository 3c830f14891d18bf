// GEMM correctness, burn-in stability and rate, and an exact all-reduce on every rank; the
// ranks' results gathered into one report. See health_check.h.
#include "supervise/health_check.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/rng.h"
#include "dist/comm.h"

namespace zaya {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t fingerprint(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

void check_gemm(HealthGemm& gemm, const HealthCheckOptions& o, RankHealth& h) {
  const int64_t n = o.gemm_size;
  Rng rng(20251122);
  std::vector<float> x(size_t(n * n)), w(size_t(n * n)), y(size_t(n * n));
  for (float& v : x) v = float(rng.normal());
  for (float& v : w) v = float(rng.normal());
  gemm.load(x.data(), w.data(), n);
  gemm.run();
  gemm.read(y.data());
  h.gemm_max_error = 0;
  bool finite = true;
  for (int s = 0; s < 256; ++s) {
    const int64_t i = int64_t(rng.uniform() * double(n)), j = int64_t(rng.uniform() * double(n));
    double ref = 0, scale = 0;
    for (int64_t k = 0; k < n; ++k) {
      const double p = double(x[size_t(i * n + k)]) * double(w[size_t(j * n + k)]);
      ref += p;
      scale += std::fabs(p);
    }
    const double got = y[size_t(i * n + j)];
    if (!std::isfinite(got)) finite = false;
    h.gemm_max_error = std::max(h.gemm_max_error, std::fabs(got - ref) / std::max(scale, 1e-30));
  }
  h.gemm_ok = finite && h.gemm_max_error <= o.gemm_tolerance;
  // Burn-in: batches of runs with one read each (so the copy does not dominate the timing), until
  // burn_in_seconds have passed; every read must equal the first result bit for bit.
  const uint64_t first = fingerprint(y);
  h.repeat_ok = true;
  constexpr int kRunsPerRead = 4;
  int64_t runs = 0;
  const double t0 = now_seconds();
  double elapsed = 0;
  do {
    for (int r = 0; r < kRunsPerRead; ++r) gemm.run();
    gemm.read(y.data());
    runs += kRunsPerRead;
    if (fingerprint(y) != first) h.repeat_ok = false;
    elapsed = now_seconds() - t0;
  } while (elapsed < o.burn_in_seconds);
  h.gemm_gflops = 2.0 * double(n) * double(n) * double(n) * double(runs) / elapsed / 1e9;
}

void check_allreduce(Comm& comm, const HealthCheckOptions& o, RankHealth& h) {
  const int64_t count = std::max<int64_t>(1, o.allreduce_bytes / int64_t(sizeof(float)));
  const int ranks = comm.size();
  std::vector<float> send(static_cast<size_t>(count)), recv(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) send[size_t(i)] = float((comm.rank() + 1) * (i % 13 + 1));
  const double rank_sum = double(ranks) * double(ranks + 1) / 2;
  h.allreduce_ok = true;
  double timed = 0;
  for (int it = 0; it < 4; ++it) {  // one warm-up, three timed
    std::fill(recv.begin(), recv.end(), -1.0f);
    const double t0 = now_seconds();
    comm.all_reduce(send.data(), recv.data(), count, CommType::F32, ReduceOp::Sum)->wait();
    if (it > 0) timed += now_seconds() - t0;
    for (int64_t i = 0; i < count; ++i)
      if (recv[size_t(i)] != float(rank_sum * double(i % 13 + 1))) h.allreduce_ok = false;
  }
  const double bytes = double(count) * sizeof(float);
  h.allreduce_gbps = ranks > 1 ? bytes * 2.0 * (ranks - 1) / ranks / (timed / 3) / 1e9 : 0;
}

}  // namespace

bool HealthReport::ok() const {
  return !ranks.empty() &&
         std::all_of(ranks.begin(), ranks.end(), [](const RankHealth& r) { return r.ok(); });
}

std::string HealthReport::table() const {
  std::string out =
      "rank  host                  GEMM GFLOP/s  max rel err  repeat  all-reduce GB/s  verdict\n";
  for (const RankHealth& r : ranks) {
    std::string problems;
    auto add = [&](const char* p) { problems += (problems.empty() ? "" : ", ") + std::string(p); };
    if (!r.gemm_ok) add("wrong GEMM results");
    if (!r.repeat_ok) add("GEMM results change between repetitions");
    if (!r.allreduce_ok) add("wrong all-reduce sums");
    if (r.slow) add("GEMM rate below the minimum fraction of the median");
    char line[320];
    std::snprintf(line, sizeof line, "%4d  %-20.20s  %12.1f  %11.2e  %-6s  %15.2f  %s\n", r.rank,
                  r.host.c_str(), r.gemm_gflops, r.gemm_max_error, r.repeat_ok ? "ok" : "BAD",
                  r.allreduce_gbps, problems.empty() ? "ok" : ("FAILED: " + problems).c_str());
    out += line;
  }
  return out;
}

HealthReport run_health_check(HealthGemm& gemm, Comm& comm, const HealthCheckOptions& o) {
  RankHealth mine;
  mine.rank = comm.rank();
  check_gemm(gemm, o, mine);
  check_allreduce(comm, o, mine);

  // Share: six numbers and a 64-byte host name per rank.
  const int ranks = comm.size();
  constexpr int kFields = 6, kHost = 64;
  std::vector<double> fields = {mine.gemm_gflops,       mine.gemm_max_error,       double(mine.gemm_ok),
                                double(mine.repeat_ok), double(mine.allreduce_ok), mine.allreduce_gbps};
  std::vector<double> all_fields(size_t(kFields * ranks));
  comm.all_gather(fields.data(), all_fields.data(), std::vector<int64_t>(size_t(ranks), kFields),
                  CommType::F64)
      ->wait();
  std::vector<char> host(kHost, '\0'), all_hosts(size_t(kHost * ranks));
  if (gethostname(host.data(), kHost - 1) != 0) host[0] = '\0';
  comm.all_gather(host.data(), all_hosts.data(), std::vector<int64_t>(size_t(ranks), kHost), CommType::U8)
      ->wait();

  HealthReport report;
  for (int r = 0; r < ranks; ++r) {
    const double* f = &all_fields[size_t(r * kFields)];
    RankHealth h;
    h.rank = r;
    h.host = std::string(&all_hosts[size_t(r * kHost)], strnlen(&all_hosts[size_t(r * kHost)], kHost));
    h.gemm_gflops = f[0];
    h.gemm_max_error = f[1];
    h.gemm_ok = f[2] != 0;
    h.repeat_ok = f[3] != 0;
    h.allreduce_ok = f[4] != 0;
    h.allreduce_gbps = f[5];
    report.ranks.push_back(h);
  }
  flag_slow_ranks(report, o.min_gemm_ratio);
  return report;
}

void flag_slow_ranks(HealthReport& report, double min_ratio) {
  if (report.ranks.empty()) return;
  std::vector<double> rates;
  for (const RankHealth& h : report.ranks) rates.push_back(h.gemm_gflops);
  std::sort(rates.begin(), rates.end());
  const size_t n = rates.size();
  const double median = n % 2 ? rates[n / 2] : 0.5 * (rates[n / 2 - 1] + rates[n / 2]);
  for (RankHealth& h : report.ranks) h.slow = h.gemm_gflops < min_ratio * median;
}

}  // namespace zaya
