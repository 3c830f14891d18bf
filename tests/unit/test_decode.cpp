// Incremental inference: chunked prefill on top of existing state followed by token-by-token
// decode must reproduce one full forward (rel err < 1e-5), for every fixture model, for
// batches of independent sequences, and after a state reset.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model_io.h"
#include "serve/generate.h"
#include "test_helpers.h"

namespace zaya {
namespace {

namespace fs = std::filesystem;

struct ChunkedRun {
  std::vector<float> logits;
  std::vector<int32_t> experts;
};

// Runs the [B,T] batch through `state` in the given chunk lengths (the rest token by token).
ChunkedRun run_chunked(Model& m, const std::vector<int32_t>& ids, int64_t B, int64_t T, const std::vector<int64_t>& chunks) {
  const ModelConfig& c = m.config();
  const int64_t V = c.vocab_size, L = c.num_hidden_layers;
  DecodeState state(c, m.backend(), B, T + 3);
  ChunkedRun r;
  r.logits.assign(static_cast<size_t>(B * T * V), 0.0f);
  r.experts.assign(static_cast<size_t>(L * B * T), -1);
  int64_t t = 0;
  size_t ci = 0;
  while (t < T) {
    int64_t len = ci < chunks.size() ? std::min(chunks[ci++], T - t) : 1;
    std::vector<int32_t> part(static_cast<size_t>(B * len));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < len; ++i) part[size_t(b * len + i)] = ids[size_t(b * T + t + i)];
    std::vector<float> lg(static_cast<size_t>(B * len * V));
    std::vector<int32_t> ex(static_cast<size_t>(L * B * len));
    ForwardOutputs out;
    out.logits = lg.data();
    out.experts = ex.data();
    m.forward(part.data(), B, len, &state, out);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < len; ++i) {
        std::copy_n(lg.begin() + (b * len + i) * V, V, r.logits.begin() + (b * T + t + i) * V);
        for (int64_t l = 0; l < L; ++l)
          r.experts[size_t((l * B + b) * T + t + i)] = ex[size_t((l * B + b) * len + i)];
      }
    t += len;
  }
  EXPECT_EQ(state.pos[0], T);
  return r;
}

class DecodeFixture : public ::testing::TestWithParam<std::string> {};

// A fixture's model, its rows of ids and one full forward of all of them, which the tests of
// sequences decoded at different positions compare against.
class DecodeAgainstFullForward : public DecodeFixture {
 protected:
  void SetUp() override {
    const std::string dir = test::source_path("tests/fixtures/" + GetParam());
    be_ = make_cpu_backend();
    be = be_.get();
    model_ = load_model(dir, *be_);
    model = model_.get();
    std::ifstream f(dir + "/ids.json");
    rows = nlohmann::json::parse(f).get<std::vector<std::vector<int32_t>>>();
    T = int64_t(rows[0].size());
    V = model->config().vocab_size;
    std::vector<int32_t> all;
    for (auto& r : rows) all.insert(all.end(), r.begin(), r.end());
    full_ = run_chunked(*model, all, int64_t(rows.size()), T, {T});
  }
  const float* full_row(size_t row, int64_t p) const {
    return full_.logits.data() + (int64_t(row) * T + p) * V;
  }

  Backend* be = nullptr;
  Model* model = nullptr;
  std::vector<std::vector<int32_t>> rows;
  int64_t T = 0, V = 0;

 private:
  std::unique_ptr<Backend> be_;
  std::unique_ptr<Model> model_;
  ChunkedRun full_;
};

TEST_P(DecodeFixture, ChunkedPrefillThenDecodeEqualsFullForward) {
  const std::string dir = test::source_path("tests/fixtures/" + GetParam());
  auto be = make_cpu_backend();
  auto model = load_model(dir, *be);
  std::ifstream f(dir + "/ids.json");
  auto batch = nlohmann::json::parse(f).get<std::vector<std::vector<int32_t>>>();
  const int64_t B = int64_t(batch.size()), T = int64_t(batch[0].size());
  std::vector<int32_t> ids;
  for (auto& s : batch) ids.insert(ids.end(), s.begin(), s.end());

  ChunkedRun full = run_chunked(*model, ids, B, T, {T});
  for (const auto& chunks : std::vector<std::vector<int64_t>>{{1}, {5, 3}, {2, 7, 1, 4}, {T - 1}}) {
    ChunkedRun part = run_chunked(*model, ids, B, T, chunks);
    EXPECT_LT(test::max_rel_err(part.logits.data(), full.logits.data(), full.logits.size()), 1e-5)
        << "chunks starting with " << chunks[0];
    EXPECT_EQ(part.experts, full.experts);
  }
}

TEST_P(DecodeFixture, BatchedSequencesAreIndependent) {
  const std::string dir = test::source_path("tests/fixtures/" + GetParam());
  auto be = make_cpu_backend();
  auto model = load_model(dir, *be);
  std::ifstream f(dir + "/ids.json");
  auto batch = nlohmann::json::parse(f).get<std::vector<std::vector<int32_t>>>();
  const int64_t B = int64_t(batch.size()), T = int64_t(batch[0].size()), V = model->config().vocab_size;
  std::vector<int32_t> ids;
  for (auto& s : batch) ids.insert(ids.end(), s.begin(), s.end());
  ChunkedRun together = run_chunked(*model, ids, B, T, {4});
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int32_t> one(batch[size_t(b)].begin(), batch[size_t(b)].end());
    ChunkedRun alone = run_chunked(*model, one, 1, T, {4});
    EXPECT_LT(test::max_rel_err(alone.logits.data(), together.logits.data() + b * T * V, size_t(T * V)), 1e-5);
  }
}

// The server's continuous batching: sequences prefilled alone, joined into one batch state at
// different positions (copy_sequence), then decoded together token by token; one sequence
// leaves and another moves into its slot. Every logit row must match a full forward of that
// sequence, and a slot past the decoded batch must be left alone.
TEST_P(DecodeAgainstFullForward, SequencesAtDifferentPositionsDecodeTogether) {
  const ModelConfig& c = model->config();

  struct Seq {
    size_t row;
    int64_t pos;  // tokens consumed
  };
  // Three sequences on rows 0, 1, 0 with prompts of different lengths.
  std::vector<Seq> seqs = {{0, T / 2}, {1 % rows.size(), T / 2 - 3}, {0, T / 2 + 2}};
  DecodeState batch(c, *be, 4, T);
  std::vector<float> lg(size_t(4 * V));
  ForwardOutputs last;
  last.logits = lg.data();
  last.last_only = true;
  for (size_t i = 0; i < seqs.size(); ++i) {
    DecodeState alone(c, *be, 1, seqs[i].pos + 5);  // another capacity than the batch's
    model->forward(rows[seqs[i].row].data(), 1, seqs[i].pos, &alone, last);
    batch.copy_sequence(alone, 0, int64_t(i));
    EXPECT_EQ(batch.pos[i], seqs[i].pos);
  }
  auto decode_step = [&](const char* when) {
    std::vector<int32_t> next;
    for (const Seq& s : seqs) next.push_back(rows[s.row][size_t(s.pos)]);
    model->forward(next.data(), int64_t(seqs.size()), 1, &batch, last);
    for (size_t i = 0; i < seqs.size(); ++i) {
      EXPECT_LT(test::max_rel_err(lg.data() + int64_t(i) * V, full_row(seqs[i].row, seqs[i].pos), size_t(V)),
                1e-5)
          << when << ": sequence in slot " << i << " at position " << seqs[i].pos;
      ++seqs[i].pos;
      EXPECT_EQ(batch.pos[i], seqs[i].pos);
    }
  };
  decode_step("three together");
  decode_step("three together, second step");
  // Sequence 0 finishes; the last one moves into its slot, and the batch shrinks to two.
  batch.copy_sequence(batch, 2, 0);
  seqs[0] = seqs[2];
  seqs.pop_back();
  EXPECT_EQ(batch.pos[0], seqs[0].pos);
  while (seqs[0].pos < T && seqs[1].pos < T) decode_step("two together after a move");
  EXPECT_EQ(batch.pos[3], 0) << "a slot past the decoded batch must not move";
}

// The server's prefill of new prompts in the free sequences of its batch: one forward over
// sequences 2 and 3 of a state of four (first_seq), sequence 2 fresh (after reset_sequence
// cleared what it held) and sequence 3 continuing a prefix run there before, so the two sit at
// different positions. Their last logits must match a full forward, and sequences 0 and 1 must be left
// as they are: 0 decodes on afterwards as if nothing had happened.
TEST_P(DecodeAgainstFullForward, PromptsPrefilledTogetherInLaterSequences) {
  const ModelConfig& c = model->config();
  ASSERT_GE(T, 8);
  const size_t other = 1 % rows.size();

  DecodeState batch(c, *be, 4, T);
  std::vector<float> lg(size_t(4 * V));
  ForwardOutputs last;
  last.logits = lg.data();
  last.last_only = true;
  model->forward(rows[0].data(), 1, T / 2, &batch, last, nullptr, 0);  // sequence 0: decoding
  model->forward(rows[other].data(), 1, 3, &batch, last, nullptr, 2);  // sequence 2: junk to clear
  batch.reset_sequence(2);
  EXPECT_EQ(batch.pos[2], 0);
  model->forward(rows[other].data(), 1, 2, &batch, last, nullptr, 3);  // sequence 3: a prefix of 2
  EXPECT_EQ(batch.pos[1], 0);

  // Sequence 2 runs row 0's first 4 positions; sequence 3 row `other`'s positions 2 to 5.
  std::vector<int32_t> ids(rows[0].begin(), rows[0].begin() + 4);
  ids.insert(ids.end(), rows[other].begin() + 2, rows[other].begin() + 6);
  model->forward(ids.data(), 2, 4, &batch, last, nullptr, 2);
  EXPECT_LT(test::max_rel_err(lg.data(), full_row(0, 3), size_t(V)), 1e-5) << "fresh sequence 2";
  EXPECT_LT(test::max_rel_err(lg.data() + V, full_row(other, 5), size_t(V)), 1e-5) << "continued sequence 3";
  EXPECT_EQ(batch.pos[0], T / 2);
  EXPECT_EQ(batch.pos[1], 0);
  EXPECT_EQ(batch.pos[2], 4);
  EXPECT_EQ(batch.pos[3], 6);

  const int32_t next = rows[0][size_t(T / 2)];
  model->forward(&next, 1, 1, &batch, last, nullptr, 0);
  EXPECT_LT(test::max_rel_err(lg.data(), full_row(0, T / 2), size_t(V)), 1e-5) << "sequence 0 after them";
  EXPECT_THROW(model->forward(ids.data(), 2, 1, &batch, last, nullptr, 3), Error) << "past the last sequence";
}

TEST(DecodeState, CopySequenceChecksShapesAndCapacity) {
  auto be = make_cpu_backend();
  Model tiny(preset_config("zaya-tiny"), *be);
  DecodeState big(tiny.config(), *be, 1, 8), small(tiny.config(), *be, 2, 4);
  big.pos[0] = 6;
  try {
    small.copy_sequence(big, 0, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("6 tokens does not fit a decode state of 4"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(small.copy_sequence(big, 0, 2), Error);
  EXPECT_THROW(DecodeState(tiny.config(), *be, 0, 4), Error);
}

std::vector<std::string> cases() {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(test::source_path("tests/fixtures")))
    if (fs::exists(e.path() / "expected.safetensors")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeFixture, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeAgainstFullForward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param; });

// A prompt's prefill runs into a fresh sequence only: one already holding positions is an
// error naming where it stands, and the sequences next to it are left alone.
TEST(DecodeState, APromptPrefillNeedsAFreshSequence) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(1);
  DecodeState st(m.config(), *be, 2, 8);
  const std::vector<int32_t> prompt = {1, 2, 3};
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  PromptPrefill(m, prompt, st, logits.data(), {}, 1).run(3);
  EXPECT_EQ(st.pos[0], 0);
  EXPECT_EQ(st.pos[1], 3);
  try {
    PromptPrefill again(m, prompt, st, logits.data(), {}, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a sequence at position 3"), std::string::npos) << e.what();
  }
}

TEST(DecodeState, ContextOverflowIsAClearError) {
  auto be = make_cpu_backend();
  Model m(preset_config("zaya-tiny"), *be);
  m.init_random(1);
  DecodeState st(m.config(), *be, 1, 4);
  std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  std::vector<float> logits(static_cast<size_t>(m.config().vocab_size));
  ForwardOutputs out;
  out.logits = logits.data();
  out.last_only = true;
  try {
    m.forward(ids.data(), 1, 5, &st, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context holds 4"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zaya
