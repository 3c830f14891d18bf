// Typed views over one flat parameter arena (see params.h): one struct per block type, so
// the layer code reads `blk.attn.q_proj` rather than looking names up. The same views bind
// to a gradient arena of the same layout.
#pragma once
#include <vector>

#include "model/params.h"

namespace zaya {

struct ResidualScaleWeights {
  float *hidden_scale, *hidden_bias, *residual_scale, *residual_bias;
};

struct CcaWeights {
  float *q_proj, *k_proj, *v_current, *v_delayed;  // [Hq*dh,D] [Hkv*dh,D] [Hkv*dh/2,D] x2
  float *conv_dw_w, *conv_dw_b;                    // [C,1,t0] [C]
  float *conv_grp_w, *conv_grp_b;                  // [C,dh,t1] [C]
  float* temp;                                     // [Hkv]
  float* o_proj;                                   // [D, Hq*dh]
};

struct RouterWeights {
  float *down_w, *down_b;  // [R,D] [R]
  float* eda_scale;        // [R]; nullptr in block 0
  float* norm;             // [R]
  float *fc1_w, *fc1_b, *fc2_w, *fc2_b;  // [R,R] [R]
  float* out_w;            // [E+1, R]
  float* balancing_biases; // [E+1]
};

struct ExpertWeights {
  float* gate_up;  // [E, 2I, D]
  float* down;     // [E, D, I]
};

struct BlockWeights {
  float* input_norm;
  CcaWeights attn;
  ResidualScaleWeights post_attn_scale;
  float* post_attn_norm;
  RouterWeights router;
  ExpertWeights experts;
  ResidualScaleWeights post_mlp_scale;
};

struct ModelWeights {
  float* embed;  // [V, D]
  float *input_scale, *input_bias;
  std::vector<BlockWeights> blocks;
  float* final_norm;
  float* lm_head;       // [V, D]; == embed when tied
  float* lm_head_bias;  // [V] or nullptr
};

ModelWeights bind_weights(const ModelConfig& c, const ParamLayout& layout, float* base);

}  // namespace zaya
