// LPT greedy assignment of whole tensors to ranks (see ownership.h).
#include "ckpt/ownership.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace zaya {

std::vector<int> assign_whole_tensors(const std::vector<double>& costs, int ranks) {
  if (ranks < 1) fail("checkpoint", "cannot assign tensors to " + std::to_string(ranks) + " ranks", "ranks must be >= 1");
  for (size_t i = 0; i < costs.size(); ++i)
    if (!std::isfinite(costs[i]) || costs[i] < 0)
      fail("checkpoint", "tensor cost " + std::to_string(i) + " is " + std::to_string(costs[i]),
           "costs must be finite and >= 0");
  std::vector<size_t> order(costs.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return costs[a] > costs[b]; });
  std::vector<double> load(size_t(ranks), 0.0);
  std::vector<int> owner(costs.size(), 0);
  for (size_t i : order) {
    int best = 0;
    for (int r = 1; r < ranks; ++r)
      if (load[size_t(r)] < load[size_t(best)]) best = r;
    owner[i] = best;
    load[size_t(best)] += costs[i];
  }
  return owner;
}

double numel_cost(const std::vector<int64_t>& shape) {
  double n = 1;
  for (int64_t d : shape) n *= double(d);
  return n;
}

}  // namespace zaya
