// Finite-difference gradient checking, shared by the per-backend gradient tests.
//
// Method. A backward op is checked through a scalar objective L(x) = sum(c * f(x)) with a fixed
// random cotangent c: c is fed to the backward op as the output gradient, and every analytic
// input gradient g is compared with central differences of L, where L is evaluated with the
// *forward* op (float32 outputs, summed in double so the sum adds no error of its own).
//
// Numerics in float32. With a step h the central difference carries
//   truncation  ~ h^2 |f'''| / 6                    (zero for ops linear in the perturbed input)
//   rounding    ~ eps32 * |sum of c*f over the outputs the element reaches| / h
// Outputs a perturbation does not reach are recomputed bit-identically and cancel exactly, and
// the step actually taken is the float-rounded (x+h) - (x-h), so representing x+h adds nothing.
// The step is uniform over a tensor, h = rel_step * rms(x) (or abs_step): a relative step of
// 1e-2..1e-3 balances the two terms at roughly 1e-5..1e-4 of the gradient's scale.
//
// Checks, both with the same tolerance `tol`:
//  * element-wise, on every element of a small tensor or on a random subset (always including
//    the first and last elements and any `extra` indices) of a large one, with fd_i from
//    perturbing x_i alone:
//        |g_i - fd_i| <= tol * (|fd_i| + s),   s = rms of fd over the checked elements,
//    i.e. relative error for large entries and error relative to the tensor's gradient scale for
//    entries near zero (so a gradient that should be 0 must come out ~0);
//  * directional, along one random direction d over the whole tensor (catches an error anywhere,
//    including elements the subset skipped):
//        |sum_i g_i delta_i - (L(x+hd) - L(x-hd))| <= tol * max(|sum_i g_i delta_i|, ||g * delta||_2),
//    with delta_i = (x_i+h d_i) - (x_i-h d_i) as rounded to float.
// NaN anywhere fails. Set ZAYA_GRAD_VERBOSE=1 to print the observed error of every check.
// x and grad are host arrays; for a device backend, loss() uploads x before running the forward.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/rng.h"

namespace zaya::test {

struct FdOptions {
  double rel_step = 3e-3;     // h = rel_step * rms(x) ...
  double abs_step = 0;        // ... unless abs_step > 0
  double tol = 1e-3;          // see the header comment
  int64_t max_elements = 32;  // every element when n <= max_elements, else a random subset of this size
                              // (0: only the `extra` indices, plus the directional check)
  uint64_t seed = 0x5eed;
};

// Observed errors of one check (also returned for callers that want to assert on them directly).
struct FdReport {
  double elem_err = 0;  // max_i |g_i - fd_i| / (|fd_i| + s)
  int64_t worst = -1;
  double worst_analytic = 0, worst_numeric = 0, scale = 0;
  double dir_err = 0;   // directional error, normalised as above
  double dir_analytic = 0, dir_numeric = 0;
  int64_t checked = 0;
};

// Normal(0, scale^2) floats from the deterministic project RNG.
inline std::vector<float> fd_randn(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(rng.normal() * scale);
  return v;
}

// sum_i c[i] * y[i] in double.
inline double fd_dot(const float* c, const float* y, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(c[i]) * double(y[i]);
  return s;
}
inline double fd_dot(const std::vector<float>& c, const std::vector<float>& y) {
  return fd_dot(c.data(), y.data(), std::min(c.size(), y.size()));
}

// after - before, for outputs the op accumulates into (computed in double, rounded once).
inline std::vector<float> fd_accumulated(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> d(after.size());
  for (size_t i = 0; i < after.size(); ++i) d[i] = float(double(after[i]) - double(before[i]));
  return d;
}

// |a - b| / denom; 0/0 counts as agreement, NaN anywhere as infinitely wrong.
inline double relative_error(double a, double b, double denom) {
  if (std::isnan(a) || std::isnan(b) || std::isnan(denom)) return INFINITY;
  const double diff = std::fabs(a - b);
  if (diff == 0) return 0;
  return denom > 0 ? diff / denom : INFINITY;
}

inline FdReport fd_measure(float* x, int64_t n, const float* grad, const std::function<double()>& loss,
                           const FdOptions& opt = {}, const std::vector<int64_t>& extra = {}) {
  FdReport rep;
  if (n <= 0) return rep;
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double h = opt.abs_step > 0 ? opt.abs_step : opt.rel_step * std::max(std::sqrt(ss / double(n)), 1e-20);
  Rng rng(opt.seed);

  // Elements to check individually.
  std::vector<int64_t> idx;
  if (n <= opt.max_elements) {
    for (int64_t i = 0; i < n; ++i) idx.push_back(i);
  } else {
    if (opt.max_elements > 0) idx = {0, n - 1};
    for (int64_t k = 0; k < opt.max_elements; ++k) idx.push_back(int64_t(rng.next_u64() % uint64_t(n)));
    for (int64_t e : extra)
      if (e >= 0 && e < n) idx.push_back(e);
    std::sort(idx.begin(), idx.end());
    idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
  }
  std::vector<double> fd(idx.size());
  double fss = 0;
  for (size_t k = 0; k < idx.size(); ++k) {
    float& xi = x[idx[k]];
    const float x0 = xi, xp = float(double(x0) + h), xm = float(double(x0) - h);
    xi = xp;
    const double lp = loss();
    xi = xm;
    const double lm = loss();
    xi = x0;
    fd[k] = (lp - lm) / (double(xp) - double(xm));
    fss += fd[k] * fd[k];
  }
  rep.checked = int64_t(idx.size());
  rep.scale = idx.empty() ? 0.0 : std::sqrt(fss / double(idx.size()));
  for (size_t k = 0; k < idx.size(); ++k) {
    const double g = grad[idx[k]];
    const double err = relative_error(g, fd[k], std::fabs(fd[k]) + rep.scale);
    if (err > rep.elem_err || rep.worst < 0) {
      rep.elem_err = err;
      rep.worst = idx[k];
      rep.worst_analytic = g;
      rep.worst_numeric = fd[k];
    }
  }

  // Directional derivative over the whole tensor.
  std::vector<float> x0(x, x + n), xp(static_cast<size_t>(n)), xm(static_cast<size_t>(n));
  double an = 0, an_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = 2.0 * rng.uniform() - 1.0;  // uniform: as good as normal here, and cheap on huge tensors
    xp[size_t(i)] = float(double(x0[size_t(i)]) + h * d);
    xm[size_t(i)] = float(double(x0[size_t(i)]) - h * d);
    const double t = double(grad[i]) * (double(xp[size_t(i)]) - double(xm[size_t(i)]));
    an += t;
    an_sq += t * t;
  }
  std::copy(xp.begin(), xp.end(), x);
  const double lp = loss();
  std::copy(xm.begin(), xm.end(), x);
  const double lm = loss();
  std::copy(x0.begin(), x0.end(), x);
  rep.dir_analytic = an;
  rep.dir_numeric = lp - lm;
  rep.dir_err = relative_error(an, lp - lm, std::max(std::fabs(an), std::sqrt(an_sq)));
  return rep;
}

// Checks the analytic gradient `grad` of loss() with respect to x[0..n) (x is perturbed in place
// and restored bit-exactly). Use as EXPECT_TRUE(check_gradient(...)).
inline ::testing::AssertionResult check_gradient(const std::string& what, float* x, int64_t n, const float* grad,
                                                 const std::function<double()>& loss, const FdOptions& opt = {},
                                                 const std::vector<int64_t>& extra = {}) {
  const FdReport r = fd_measure(x, n, grad, loss, opt, extra);
  std::ostringstream msg;
  msg.precision(4);
  msg << what << ": element err " << r.elem_err << " (worst [" << r.worst << "] analytic " << r.worst_analytic
      << " vs numeric " << r.worst_numeric << ", scale " << r.scale << ", " << r.checked << "/" << n
      << " checked), directional err " << r.dir_err << " (analytic " << r.dir_analytic << " vs numeric "
      << r.dir_numeric << "), tol " << opt.tol;
  if (const char* v = std::getenv("ZAYA_GRAD_VERBOSE"); v && *v && *v != '0')
    std::fprintf(stderr, "[grad] %s\n", msg.str().c_str());
  if (r.elem_err <= opt.tol && r.dir_err <= opt.tol) return ::testing::AssertionSuccess() << msg.str();
  return ::testing::AssertionFailure() << msg.str();
}

}  // namespace zaya::test
