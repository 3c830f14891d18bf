// Plain, readable reference implementations of every backend op: straight loops in the
// order the spec writes them, double accumulation, no blocking or threading. They define
// what each op means; the fast CPU kernels (and every other backend) are tested against them.
#pragma once
#include "backend/backend.h"

namespace zaya::reference {

void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t K, int64_t N);
void rmsnorm(const float* x, const float* w, float eps, float* y, int64_t rows, int64_t dim);
void residual_scale(float* r, const float* h, const float* hs, const float* hb, const float* rs, const float* rb,
                    int64_t rows, int64_t dim);
void gelu(float* x, int64_t n);
void softmax(float* x, int64_t rows, int64_t cols);
void route_select(const float* probs, const float* bias, int32_t* expert, float* weight, int64_t N, int64_t classes);
void cca_conv(const CcaConvArgs& a);
void cca_qk(const CcaQkArgs& a);
void cca_values(const CcaValueArgs& a);
void attention(const AttentionArgs& a);
void moe(const MoeArgs& a);

}  // namespace zaya::reference
