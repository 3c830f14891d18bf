// cuda_backend_options_for (cuda_factory.h): the GPU backend's options for a backend name, a
// device and the environment's opt-in switches. Plain C++, in every build (make_backend uses it
// for the CUDA and HIP backends, the host emulation's test programs for theirs).
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/attention_key_splits.h"
#include "backend/cuda/cuda_factory.h"
#include "core/error.h"

namespace zaya {

CudaBackendOptions cuda_backend_options_for(const std::string& name, int device, int visible_gpus) {
  auto switched_on = [](const char* var) {  // the environment sets var=1
    const char* v = std::getenv(var);
    return v != nullptr && std::string(v) == "1";
  };
  CudaBackendOptions o;
  o.device = visible_gpus > 0 ? device % visible_gpus : device;
  o.bf16_matmul = name == "cuda";  // cuda-fp32: every GEMM in fp32 (exact comparisons with the CPU)
  o.moe_device_grouped = switched_on("ZAYA_MOE_DEVICE_GROUPED");
  o.moe_few_rows_gemv = !switched_on("ZAYA_MOE_PER_EXPERT");  // decode's MoE as per-expert GEMMs too
  o.linear_few_rows_gemv = !switched_on("ZAYA_LINEAR_GEMM");   // decode's dense linears as GEMMs too
  o.lm_head_tf32x3 = !switched_on("ZAYA_LM_HEAD_EXACT");                 // the LM head in exact fp32 GEMMs
  o.newton_schulz_bf16 = !switched_on("ZAYA_NS_TF32");                   // Newton-Schulz on TF32 operands
  o.newton_schulz_bf16_iterates = switched_on("ZAYA_NS_BF16_ITERATES");  // Newton-Schulz's iterates in bf16
  o.attention_flash_tc = switched_on("ZAYA_ATTN_FLASH");                 // the tensor-core flash attention
  if (switched_on("ZAYA_UPLOAD_PAGEABLE")) o.upload_staging_chunks = 0;  // small uploads not staged in pinned memory
  if (const char* text = std::getenv("ZAYA_ATTN_KEY_SPLITS")) {          // the decode attention's key splits
    int splits = -1;
    const char* end = text + std::strlen(text);
    const auto [stop, err] = std::from_chars(text, end, splits);
    if (err != std::errc() || stop != end || splits < 0 || splits > kAttnMaxSplits)
      fail("cuda", std::string("ZAYA_ATTN_KEY_SPLITS='") + text + "' is not a whole number from 0 to " +
                       std::to_string(kAttnMaxSplits),
           "0 lets the backend choose, 1 never splits the keys, N > 1 splits them over N blocks");
    o.attention_key_splits = splits;
  }
  return o;
}

}  // namespace zaya
