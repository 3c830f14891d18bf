// The CCA convolution over packed documents (reset_at_document_boundary): each row of u is
// re-laid with P = (t0-1)+(t1-1) zero rows before every document start after the first, so
// the ordinary causal convolution sees exactly the zero padding a fresh sequence sees. The
// outputs at the real rows are the segment-reset convolution; the backward runs the ordinary
// backward over the same expanded rows (zero output gradient on the inserted ones), which is
// the exact gradient of that function.
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace zaya {

namespace {

// Expanded row index of every token of one row; returns the expanded length.
int64_t expanded_rows(const int32_t* seg_start, int64_t T, int64_t P, std::vector<int64_t>& row_of) {
  row_of.resize(static_cast<size_t>(T));
  int64_t inserted = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (t > 0 && seg_start[t] == t) inserted += P;
    row_of[size_t(t)] = t + inserted;
  }
  return T + inserted;
}

}  // namespace

void CpuBackend::cca_conv_segmented(const CcaConvArgs& a) {
  const int64_t C = a.C, T = a.T, P = (a.t0 - 1) + (a.t1 - 1);
  std::vector<int64_t> row_of;
  std::vector<float> state(static_cast<size_t>(P * C), 0.0f), ue, ze;
  for (int64_t b = 0; b < a.B; ++b) {
    const int64_t Te = expanded_rows(a.seg_start + b * T, T, P, row_of);
    ue.assign(static_cast<size_t>(Te * C), 0.0f);
    ze.resize(static_cast<size_t>(Te * C));
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(ue.data() + row_of[size_t(t)] * C, a.u + (b * T + t) * C, size_t(C) * 4);
    std::fill(state.begin(), state.end(), 0.0f);
    CcaConvArgs row = a;
    row.seg_start = nullptr;
    row.B = 1; row.T = Te; row.u = ue.data(); row.z = ze.data(); row.state = state.data();
    cca_conv(row);
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(a.z + (b * T + t) * C, ze.data() + row_of[size_t(t)] * C, size_t(C) * 4);
    if (a.state) std::memcpy(a.state + b * P * C, state.data(), size_t(P * C) * 4);
  }
}

void CpuBackend::cca_conv_backward_segmented(const CcaConvArgs& a, const float* dz, float* du, float* dw_dw,
                                             float* db_dw, float* dw_grp, float* db_grp) {
  const int64_t C = a.C, T = a.T, P = (a.t0 - 1) + (a.t1 - 1);
  std::vector<int64_t> row_of;
  std::vector<float> ue, dze, due;
  for (int64_t b = 0; b < a.B; ++b) {
    const int64_t Te = expanded_rows(a.seg_start + b * T, T, P, row_of);
    ue.assign(static_cast<size_t>(Te * C), 0.0f);
    dze.assign(static_cast<size_t>(Te * C), 0.0f);
    due.assign(static_cast<size_t>(Te * C), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(ue.data() + row_of[size_t(t)] * C, a.u + (b * T + t) * C, size_t(C) * 4);
      std::memcpy(dze.data() + row_of[size_t(t)] * C, dz + (b * T + t) * C, size_t(C) * 4);
    }
    CcaConvArgs row = a;
    row.seg_start = nullptr;
    row.B = 1; row.T = Te; row.u = ue.data(); row.z = nullptr; row.state = nullptr;
    cca_conv_backward(row, dze.data(), due.data(), dw_dw, db_dw, dw_grp, db_grp);
    for (int64_t t = 0; t < T; ++t) {
      float* d = du + (b * T + t) * C;
      const float* s = due.data() + row_of[size_t(t)] * C;
      for (int64_t c = 0; c < C; ++c) d[c] += s[c];
    }
  }
}

}  // namespace zaya
