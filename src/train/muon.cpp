// Muon step of one routed tensor (spec C.4, decision 5): per matrix (each expert separately)
//   M = mu M + G; U = nesterov ? G + mu M : M; X = NS(U); W -= lr (scale sqrt(max(r, c)) X + wd W).
// The element-wise parts run over each tensor at once and Newton-Schulz over a batch of
// same-shape matrices (Backend::newton_schulz_batched): a tensor's experts, or, across tensors,
// every matrix of one shape the step's batch holds (Optimizer::step_range), each matrix still
// orthogonalised on its own.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "train/optimizer.h"

namespace zaya {

void Optimizer::muon_step(const std::vector<size_t>& tensors, float* params, const float* grads, float lr) {
  ZAYA_CHECK(!tensors.empty(), "muon_step of no tensors");
  const ParamRoute& first = routes_[tensors[0]];
  const int64_t rows = first.rows, cols = first.cols, n = rows * cols;
  const float scale = float(cfg_.muon_scale * std::sqrt(double(std::max(rows, cols))));
  const float mu = float(cfg_.muon_momentum);
  // Momentum of each tensor into its part of the workspace, one Newton-Schulz batch, then each
  // tensor's update from its part.
  int64_t used = 0;
  for (size_t i : tensors) {
    const ParamRoute& r = routes_[i];
    if (!(r.kind == OptimKind::Muon && r.first_matrix >= 0 && r.rows == rows && r.cols == cols))
      fail("optimizer", "Muon step of '" + layout_.params[i].name +
                            "': not a Muon tensor this optimizer owns, or not of its batch's matrix shape " +
                            std::to_string(rows) + "x" + std::to_string(cols));
    const int64_t total = n * r.matrices;
    ZAYA_CHECK(used + total <= work_size_, "Muon workspace too small");
    be_.muon_momentum(m1_ + r.moment1_offset, grads + layout_.params[i].offset, work_ + used, total, mu,
                      cfg_.nesterov);
    used += total;
  }
  be_.newton_schulz_batched(work_, used / n, rows, cols, cfg_.ns_steps);
  ++ns_batches_;
  used = 0;
  for (size_t i : tensors) {
    const ParamRoute& r = routes_[i];
    const int64_t total = n * r.matrices;
    const float wd = r.weight_decay ? float(cfg_.weight_decay) : 0.0f;
    for (int64_t e = 0; e < r.matrices; ++e) ++ns_calls_[size_t(r.first_matrix + e)];
    be_.muon_update(params + layout_.params[i].offset, work_ + used, total, lr, scale, wd);
    used += total;
    ++steps_[i];
  }
}

}  // namespace zaya
