// Engine vs the PyTorch twin: every golden fixture under tests/fixtures (written by
// tests/reference/make_fixtures.py) must give the same logits (max rel err < 1e-5), the same
// expert assignment in every layer, the same loss, and matching per-block residuals.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "model/model_io.h"
#include "test_helpers.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> fixture_cases() {
  std::vector<std::string> cases;
  for (const auto& e : fs::directory_iterator(test::source_path("tests/fixtures")))
    if (fs::exists(e.path() / "expected.safetensors")) cases.push_back(e.path().filename().string());
  std::sort(cases.begin(), cases.end());
  return cases;
}

std::vector<std::vector<int32_t>> read_ids(const std::string& path) {
  std::ifstream f(path);
  auto j = nlohmann::json::parse(f);
  return j.get<std::vector<std::vector<int32_t>>>();
}

class ReferenceFixture : public ::testing::TestWithParam<std::string> {};

TEST(ReferenceFixtures, AtLeastFourCasesExist) { EXPECT_GE(fixture_cases().size(), 4u); }

TEST_P(ReferenceFixture, LogitsExpertsLossMatchTwin) {
  const std::string dir = test::source_path("tests/fixtures/" + GetParam());
  auto be = make_cpu_backend();
  auto model = load_model(dir, *be);
  const ModelConfig& c = model->config();
  auto batch = read_ids(dir + "/ids.json");
  const int64_t B = int64_t(batch.size()), T = int64_t(batch[0].size()), V = c.vocab_size, L = c.num_hidden_layers,
                D = c.hidden_size;
  std::vector<int32_t> ids;
  for (auto& s : batch) ids.insert(ids.end(), s.begin(), s.end());

  std::vector<float> logits(size_t(B * T * V)), residuals(size_t(L * B * T * D)),
      probs(size_t(L * B * T * (c.num_experts + 1)));
  std::vector<int32_t> experts(size_t(L * B * T));
  ForwardOutputs out;
  out.logits = logits.data();
  out.experts = experts.data();
  out.residuals = residuals.data();
  out.router_probs = probs.data();
  // Loss as evaluation computes it: the LM head fused with the cross-entropy, next token of
  // each position as its target, the last position of each row not counted.
  std::vector<int32_t> targets(size_t(B * T), -1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) targets[size_t(b * T + t)] = ids[size_t(b * T + t + 1)];
  double loss_sum = 0;
  int64_t loss_tokens = 0;
  out.targets = targets.data();
  out.loss_sum = &loss_sum;
  out.loss_tokens = &loss_tokens;
  model->forward(ids.data(), B, T, nullptr, out);

  SafeTensorsSet exp = SafeTensorsSet::open_file(dir + "/expected.safetensors");
  // Layer by layer first, so a failure points at the first block that diverges.
  for (int64_t l = 0; l < L; ++l) {
    std::vector<float> ref(size_t(B * T * D));
    exp.read_f32("residual." + std::to_string(l), ref.data());
    EXPECT_LT(test::max_rel_err(residuals.data() + l * B * T * D, ref.data(), ref.size()), 1e-5)
        << "residual stream diverges after block " << l;
    std::vector<float> pref(size_t(B * T * (c.num_experts + 1)));
    exp.read_f32("router_probs." + std::to_string(l), pref.data());
    EXPECT_LT(test::max_rel_err(probs.data() + l * int64_t(pref.size()), pref.data(), pref.size()), 1e-5)
        << "router probabilities differ in block " << l;
  }
  const auto* ee = exp.find("experts");
  ASSERT_NE(ee, nullptr);
  ASSERT_EQ(ee->info->numel(), experts.size());
  const int32_t* ref_experts = reinterpret_cast<const int32_t*>(ee->file->data(*ee->info));
  size_t agree = 0;
  for (size_t i = 0; i < experts.size(); ++i) agree += experts[i] == ref_experts[i];
  EXPECT_EQ(agree, experts.size()) << "expert assignment agreement " << agree << "/" << experts.size();

  std::vector<float> ref_logits(logits.size());
  exp.read_f32("logits", ref_logits.data());
  EXPECT_LT(test::max_rel_err(logits.data(), ref_logits.data(), logits.size()), 1e-5);

  // Loss: mean next-token cross-entropy over B*(T-1).
  ASSERT_EQ(loss_tokens, B * (T - 1));
  const double loss = loss_sum / double(loss_tokens);
  float ref_loss = 0;
  exp.read_f32("loss", &ref_loss);
  EXPECT_NEAR(loss, ref_loss, 1e-5 * std::fabs(ref_loss));
}

INSTANTIATE_TEST_SUITE_P(Twin, ReferenceFixture, ::testing::ValuesIn(fixture_cases()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace zaya
