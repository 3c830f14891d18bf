// Muon step of one routed tensor (spec C.4, decision 5): per matrix (each expert separately)
//   M = mu M + G; U = nesterov ? G + mu M : M; X = NS(U); W -= lr (scale sqrt(max(r, c)) X + wd W).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "train/optimizer.h"

namespace zaya {

void Optimizer::muon_step(size_t i, float* params, const float* grads, float lr) {
  const ParamSpec& p = layout_.params[i];
  const ParamRoute& r = routes_[i];
  ZAYA_CHECK(r.kind == OptimKind::Muon && r.first_matrix >= 0, "muon_step on a tensor Muon does not own");
  const int64_t n = r.rows * r.cols;
  ZAYA_CHECK(n <= work_size_, "Muon workspace too small");
  const float scale = float(cfg_.muon_scale * std::sqrt(double(std::max(r.rows, r.cols))));
  const float wd = r.weight_decay ? float(cfg_.weight_decay) : 0.0f;
  const float mu = float(cfg_.muon_momentum);
  for (int64_t e = 0; e < r.matrices; ++e) {
    const int64_t off = p.offset + e * n;
    be_.muon_momentum(m1_ + r.moment1_offset + e * n, grads + off, work_, n, mu, cfg_.nesterov);
    be_.newton_schulz(work_, r.rows, r.cols, cfg_.ns_steps);
    ++ns_calls_[size_t(r.first_matrix + e)];
    be_.muon_update(params + off, work_, n, lr, scale, wd);
  }
  ++steps_[i];
}

}  // namespace zaya
