// AdamW step of one routed tensor (spec C.5): bias-corrected with the tensor's own step count,
// decoupled weight decay (Embedding, Conv) or none (1-D Vector tensors).
#include "core/error.h"
#include "train/optimizer.h"

namespace zaya {

void Optimizer::adamw_step(size_t i, float* params, const float* grads, float lr) {
  const ParamSpec& p = layout_.params[i];
  const ParamRoute& r = routes_[i];
  ZAYA_CHECK(r.kind == OptimKind::AdamW && r.moment2_offset >= 0, "adamw_step on a tensor AdamW does not own");
  const float wd = r.weight_decay ? float(cfg_.weight_decay) : 0.0f;
  const int64_t t = ++steps_[i];
  be_.adamw_update(params + p.offset, grads + p.offset, m1_ + r.moment1_offset, m2_ + r.moment2_offset, p.numel,
                   lr, float(cfg_.adam_beta1), float(cfg_.adam_beta2), float(cfg_.adam_eps), wd, t);
}

}  // namespace zaya
