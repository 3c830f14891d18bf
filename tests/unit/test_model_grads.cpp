// Whole-model gradients of the hand-written backward against the PyTorch twin's autograd
// (tests/fixtures/<case>/grads.safetensors): every trainable parameter, max rel err < 1e-4
// (max|a-b| / max|ref| per tensor), on every fixture configuration.
#include <gtest/gtest.h>

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

INSTANTIATE_TEST_SUITE_P(Twin, GradFixture, ::testing::ValuesIn(grad_cases()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace zaya
