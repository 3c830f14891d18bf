// Model weights I/O: save/load round trip in HF layout (f32 and bf16), the original
// 80-half-layer names, and one error listing every missing, unexpected and mis-shaped tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/model_io.h"
#include "test_helpers.h"

namespace zaya {
namespace {

std::vector<float> params_of(Model& m) {
  return std::vector<float>(m.params(), m.params() + m.layout().total);
}

TEST(ModelIo, SaveLoadRoundTripF32IsExact) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(42);
  std::string dir = test::fresh_dir("test", "rt32");
  save_model(m, dir);
  auto m2 = load_model(dir, *be);
  EXPECT_EQ(params_of(m), params_of(*m2));
  EXPECT_EQ(config_to_json(m.config()), config_to_json(m2->config()));
}

TEST(ModelIo, SaveLoadRoundTripBf16RoundsOnce) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(43);
  std::string dir = test::fresh_dir("test", "rt16");
  save_model(m, dir, DType::BF16);
  auto m2 = load_model(dir, *be);
  for (const ParamSpec& p : m.layout().params)
    for (int64_t i = 0; i < p.numel; ++i) {
      float expect = p.kind == ParamKind::Buffer ? m.params()[p.offset + i]
                                                 : bf16_to_f32(f32_to_bf16(m.params()[p.offset + i]));
      ASSERT_EQ(m2->params()[p.offset + i], expect) << p.name;
    }
}

TEST(ModelIo, LoadsOriginalHalfLayerNames) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(44);
  std::string dir = test::fresh_dir("test", "orig");
  save_model(m, dir);  // config.json
  // Rewrite the weights under the original 80-half-layer names, experts unstacked.
  std::vector<TensorToWrite> tensors;
  std::vector<std::string> names;
  for (const ParamSpec& p : m.layout().params) {
    auto src = original_layout_names(m.config(), p.name);
    std::vector<int64_t> shape = p.shape;
    if (src.size() > 1) shape.erase(shape.begin());
    int64_t part = p.numel / int64_t(src.size());
    for (size_t i = 0; i < src.size(); ++i)
      tensors.push_back({src[i], DType::F32, shape, m.params() + p.offset + int64_t(i) * part});
  }
  EXPECT_EQ(original_layout_names(m.config(), "model.layers.1.post_mlp_residual_scale.residual_bias")[0],
            "model.res_scale.residual_bias");
  EXPECT_EQ(original_layout_names(m.config(), "model.layers.0.post_mlp_residual_scale.residual_bias")[0],
            "model.layers.2.res_scale.residual_bias");
  write_safetensors(dir + "/model.safetensors", tensors);
  auto m2 = load_model(dir, *be);
  EXPECT_EQ(params_of(m), params_of(*m2));
}

TEST(ModelIo, ReportsAllProblemsInOneError) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(45);
  std::string dir = test::fresh_dir("test", "bad");
  save_model(m, dir);
  std::vector<TensorToWrite> tensors;
  std::vector<float> junk(64 * 64, 0.0f);
  for (const ParamSpec& p : m.layout().params) {
    if (p.name == "model.norm.weight") continue;                   // missing
    if (p.name == "model.layers.1.self_attn.qk_norm.temp") {        // mis-shaped
      tensors.push_back({p.name, DType::F32, {3}, junk.data()});
      continue;
    }
    tensors.push_back({p.name, DType::F32, p.shape, m.params() + p.offset});
  }
  tensors.push_back({"model.layers.9.extra.weight", DType::F32, {4}, junk.data()});  // unexpected
  write_safetensors(dir + "/model.safetensors", tensors);
  try {
    load_model(dir, *be);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("missing (1)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.norm.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mis-shaped (1)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("qk_norm.temp: expected [2], found [3]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected (1)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers.9.extra.weight"), std::string::npos) << msg;
  }
}

TEST(ModelIo, MissingDirectoryAndConfigAreClearErrors) {
  auto be = make_cpu_backend();
  EXPECT_THROW(load_model("/nonexistent/zaya/model", *be), Error);
  std::string dir = test::fresh_dir("test", "noconfig");
  try {
    load_model(dir, *be);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json"), std::string::npos) << e.what();
  }
  std::ofstream(dir + "/config.json") << "{ not json";
  try {
    load_model(dir, *be);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid JSON"), std::string::npos) << e.what();
  }
}

TEST(ModelInit, FollowsSpecC5AndIsDeterministic) {
  auto be = make_cpu_backend();
  Model a(preset_config("zaya-tiny"), *be), b(preset_config("zaya-tiny"), *be);
  a.init_random(7);
  b.init_random(7);
  EXPECT_EQ(params_of(a), params_of(b));
  const ModelWeights& w = a.weights();
  EXPECT_EQ(w.blocks[0].attn.temp[0], 1.0f);                  // temp = 1 from scratch
  EXPECT_EQ(w.blocks[1].router.balancing_biases[4], -1.0f);   // skip bias
  EXPECT_EQ(w.blocks[1].router.balancing_biases[0], 0.0f);
  EXPECT_EQ(w.blocks[1].router.eda_scale[0], 1.0f);
  EXPECT_EQ(w.blocks[0].router.eda_scale, nullptr);           // no EDA in the first MoE layer
  EXPECT_EQ(w.blocks[0].post_attn_scale.residual_scale[3], 1.0f);
  EXPECT_EQ(w.blocks[0].post_attn_scale.residual_bias[3], 0.0f);
  // Matrices ~ N(0, 0.02).
  const ParamSpec& q = a.layout().at("model.layers.0.self_attn.qkv_proj.q_proj.weight");
  double ss = 0;
  for (int64_t i = 0; i < q.numel; ++i) ss += double(a.params()[q.offset + i]) * a.params()[q.offset + i];
  EXPECT_NEAR(std::sqrt(ss / double(q.numel)), 0.02, 0.002);
}

// init_random draws large tensors in parallel; the values must be those of one sequential
// stream over the layout (seed, then two counters per normal), whatever the thread count.
TEST(ModelInit, ParallelDrawsEqualOneSequentialStream) {
  ModelConfig c = preset_config("zaya-small");  // tensors large enough for the parallel path
  auto be = make_cpu_backend();
  Model m(c, *be);
  m.init_random(11);
  Rng rng(11);
  int64_t checked = 0;
  for (const ParamSpec& p : m.layout().params) {
    if (p.kind != ParamKind::Matrix && p.kind != ParamKind::Embedding && p.kind != ParamKind::Conv) continue;
    for (int64_t i = 0; i < p.numel; ++i) {
      const float want = float(rng.normal() * c.initializer_range);
      ASSERT_EQ(m.params()[p.offset + i], want) << p.name << "[" << i << "]";
    }
    checked += p.numel;
  }
  EXPECT_GT(checked, int64_t(4) << 16);
}

}  // namespace
}  // namespace zaya
