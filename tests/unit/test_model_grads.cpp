// Whole-model gradients of the hand-written backward against the PyTorch twin's autograd
// (tests/fixtures/<case>/grads.safetensors): every trainable parameter, max rel err < 1e-4
// (max|a-b| / max|ref| per tensor), on every fixture configuration; the block_done callback's
// promise that a block's gradients are final when it comes; and activation recomputation
// leaving the step bitwise unchanged.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "grad_fixtures.h"
#include "io/safetensors.h"
#include "model/model_io.h"
#include "test_helpers.h"

namespace zaya {
namespace {

using test::grad_cases;

class GradFixture : public ::testing::TestWithParam<std::string> {};

TEST(GradFixtures, EveryForwardFixtureHasGradients) { EXPECT_GE(grad_cases().size(), 4u); }

TEST_P(GradFixture, EveryParameterGradientMatchesTwin) {
  const std::string dir = test::source_path("tests/fixtures/" + GetParam());
  auto be = make_cpu_backend();
  auto model = load_model(dir, *be);
  const ModelConfig& c = model->config();
  const test::FixtureBatch batch = test::load_fixture_batch(dir);
  const int64_t B = batch.B, T = batch.T;
  std::vector<float> grads(static_cast<size_t>(model->layout().total), 0.0f);
  StepStats st = model->forward_backward(batch.ids.data(), batch.targets.data(), B, T, grads.data(),
                                         1.0f / float(B * (T - 1)));
  EXPECT_EQ(st.tokens, B * (T - 1));

  SafeTensorsSet ref = SafeTensorsSet::open_file(dir + "/grads.safetensors");
  float ref_loss;
  SafeTensorsSet::open_file(dir + "/expected.safetensors").read_f32("loss", &ref_loss);
  EXPECT_NEAR(st.loss_sum / double(st.tokens), ref_loss, 1e-5 * std::fabs(ref_loss));
  int checked = 0;
  for (const ParamSpec& p : model->layout().params) {
    if (p.kind == ParamKind::Buffer) continue;
    const auto* e = ref.find(p.name);
    ASSERT_NE(e, nullptr) << "twin has no gradient for " << p.name;
    std::vector<float> g(static_cast<size_t>(p.numel));
    ref.read_f32(p.name, g.data());
    EXPECT_LT(test::max_rel_err(grads.data() + p.offset, g.data(), g.size()), 1e-4) << p.name;
    ++checked;
  }
  EXPECT_EQ(size_t(checked), ref.names().size());
  (void)c;
}

// The block index of a "model.layers.N.*" tensor, -1 for the others.
int64_t block_index(const std::string& name) {
  const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size()));
}

// block_done(l) promises that block l's parameter gradients are final (data parallelism starts
// reducing them then): it comes once per block, from the last down to the first, and each
// "model.layers.l." gradient at that moment is bitwise its value when the step returns. (A
// block's input-norm gradient is finished by the previous block's fused merge, after the
// block's own backward.)
TEST_P(GradFixture, BlockDoneComesOnceTheBlocksGradientsAreFinal) {
  const std::string dir = test::source_path("tests/fixtures/" + GetParam());
  auto be = make_cpu_backend();
  auto model = load_model(dir, *be);
  const int64_t L = model->config().num_hidden_layers;
  const test::FixtureBatch batch = test::load_fixture_batch(dir);
  std::vector<float> grads(static_cast<size_t>(model->layout().total), 0.0f);
  std::vector<int64_t> order;
  std::vector<std::vector<float>> at_done(static_cast<size_t>(L));  // block l's gradients, in layout order
  auto block_gradients = [&](int64_t l) {
    std::vector<float> out;
    for (const ParamSpec& p : model->layout().params)
      if (p.kind != ParamKind::Buffer && block_index(p.name) == l)
        out.insert(out.end(), grads.begin() + p.offset, grads.begin() + p.offset + p.numel);
    return out;
  };
  model->forward_backward(batch.ids.data(), batch.targets.data(), batch.B, batch.T, grads.data(),
                          1.0f / float(batch.B * (batch.T - 1)), nullptr, [&](int64_t l) {
                            order.push_back(l);
                            ASSERT_TRUE(l >= 0 && l < L) << "block " << l;
                            at_done[size_t(l)] = block_gradients(l);
                          });
  std::vector<int64_t> expected;
  for (int64_t l = L - 1; l >= 0; --l) expected.push_back(l);
  EXPECT_EQ(order, expected);
  for (int64_t l = 0; l < L; ++l) {
    const std::vector<float> final_grads = block_gradients(l);
    ASSERT_EQ(at_done[size_t(l)].size(), final_grads.size()) << "block " << l;
    EXPECT_EQ(std::memcmp(at_done[size_t(l)].data(), final_grads.data(), final_grads.size() * sizeof(float)), 0)
        << "block " << l << "'s gradients changed after block_done(" << l << ")";
  }
}

// Activation recomputation (Model::set_activation_recompute) reruns each block's forward before
// its backward from the block's kept inputs: the step must not change by a bit (loss, routing,
// every gradient, block_done's order), on whole sequences and with document resets.
TEST_P(GradFixture, ActivationRecomputeGivesTheSameStepBitwise) {
  const std::string dir = test::source_path("tests/fixtures/" + GetParam());
  auto be = make_cpu_backend();
  auto model = load_model(dir, *be);
  const test::FixtureBatch batch = test::load_fixture_batch(dir);
  const int64_t B = batch.B, T = batch.T;
  // Documents restarting a third of the way into every row.
  std::vector<int32_t> starts(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) starts[size_t(b * T + t)] = t < T / 3 ? 0 : int32_t(T / 3);
  for (const bool resets : {false, true}) {
    SCOPED_TRACE(resets ? "document resets" : "whole sequences");
    struct Run {
      StepStats stats;
      std::vector<float> grads;
      std::vector<int64_t> done;
    };
    const auto run = [&](bool recompute) {
      model->set_activation_recompute(recompute);
      Run out;
      out.grads.assign(static_cast<size_t>(model->layout().total), 0.0f);
      out.stats = model->forward_backward(batch.ids.data(), batch.targets.data(), B, T, out.grads.data(),
                                          1.0f / float(B * (T - 1)), resets ? starts.data() : nullptr,
                                          [&](int64_t l) { out.done.push_back(l); });
      return out;
    };
    const Run kept = run(false), recomputed = run(true);
    EXPECT_EQ(kept.stats.loss_sum, recomputed.stats.loss_sum);
    EXPECT_EQ(kept.stats.tokens, recomputed.stats.tokens);
    EXPECT_EQ(kept.stats.expert_counts, recomputed.stats.expert_counts);
    EXPECT_EQ(kept.done, recomputed.done);
    for (const ParamSpec& p : model->layout().params)
      EXPECT_EQ(std::memcmp(kept.grads.data() + p.offset, recomputed.grads.data() + p.offset,
                            size_t(p.numel) * sizeof(float)),
                0)
          << p.name << " differs with activation recomputation";
  }
}

INSTANTIATE_TEST_SUITE_P(Twin, GradFixture, ::testing::ValuesIn(grad_cases()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace zaya
