// Muon step of one routed tensor (spec C.4, decision 5): per matrix (each expert separately)
//   M = mu M + G; U = nesterov ? G + mu M : M; X = NS(U); W -= lr (scale sqrt(max(r, c)) X + wd W).
// The element-wise parts run over the whole tensor at once and Newton-Schulz over its experts
// as one batch (Backend::newton_schulz_batched), each expert still orthogonalised on its own.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "train/optimizer.h"

namespace zaya {

void Optimizer::muon_step(size_t i, float* params, const float* grads, float lr) {
  const ParamSpec& p = layout_.params[i];
  const ParamRoute& r = routes_[i];
  ZAYA_CHECK(r.kind == OptimKind::Muon && r.first_matrix >= 0, "muon_step on a tensor Muon does not own");
  const int64_t n = r.rows * r.cols, total = n * r.matrices;
  ZAYA_CHECK(total <= work_size_, "Muon workspace too small");
  const float scale = float(cfg_.muon_scale * std::sqrt(double(std::max(r.rows, r.cols))));
  const float wd = r.weight_decay ? float(cfg_.weight_decay) : 0.0f;
  const float mu = float(cfg_.muon_momentum);
  be_.muon_momentum(m1_ + r.moment1_offset, grads + p.offset, work_, total, mu, cfg_.nesterov);
  be_.newton_schulz_batched(work_, r.matrices, r.rows, r.cols, cfg_.ns_steps);
  for (int64_t e = 0; e < r.matrices; ++e) ++ns_calls_[size_t(r.first_matrix + e)];
  be_.muon_update(params + p.offset, work_, total, lr, scale, wd);
  ++steps_[i];
}

}  // namespace zaya
