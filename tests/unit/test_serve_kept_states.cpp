// The decode states the inference engine keeps after completions finish
// (src/serve/kept_states.h): a kept entry is a faithful copy of its sequence, sized to its tokens;
// the longest kept prefix of a prompt is found; the same tokens replace their entry; once the
// budget is reached the earlier turns of a kept conversation go first, then the least recently
// used entries; an entry over the whole budget is not kept.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "../common/tiny_serve_model.h"
#include "core/error.h"
#include "serve/kept_states.h"

namespace zaya {
namespace {

using test::tiny_model;

std::vector<int32_t> tokens_from(int32_t first, int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(int32_t(3 + (first + 17 * i) % 400));
  return t;
}

// Two sequences run through the model; sequence s of the batch has consumed runs[s].
struct RunStates {
  std::vector<std::vector<int32_t>> runs;
  std::unique_ptr<DecodeState> state;
  std::vector<float> logits;  // [2, vocab]
};

RunStates run_two(Model& model, const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  RunStates r;
  r.runs = {a, b};
  EXPECT_EQ(a.size(), b.size());
  const int64_t T = int64_t(a.size()), V = model.config().vocab_size;
  r.state = std::make_unique<DecodeState>(model.config(), model.backend(), 2, 64);
  std::vector<int32_t> ids = a;
  ids.insert(ids.end(), b.begin(), b.end());
  r.logits.resize(size_t(2 * V));
  ForwardOutputs out;
  out.logits = r.logits.data();
  out.last_only = true;
  model.forward(ids.data(), 2, T, r.state.get(), out);
  return r;
}

// The tiny model, and two 10-token sequences a and b run through it together, and again their
// first 6 tokens (a6, b6).
struct TwoSequences {
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<Model> model = tiny_model(*be);
  std::vector<int32_t> a, b, a6, b6;
  RunStates r, r6;
  TwoSequences(int32_t first_a, int32_t first_b)
      : a(tokens_from(first_a, 10)),
        b(tokens_from(first_b, 10)),
        a6(a.begin(), a.begin() + 6),
        b6(b.begin(), b.begin() + 6),
        r(run_two(*model, a, b)),
        r6(run_two(*model, a6, b6)) {}
};

TEST(ServeKeptStates, AnEntryIsAFaithfulCopySizedToItsTokens) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  const ModelConfig& c = model->config();
  RunStates r = run_two(*model, tokens_from(1, 12), tokens_from(2, 12));
  KeptStates kept(c, *be, int64_t(1) << 30);
  ASSERT_TRUE(kept.keep(r.runs[1], *r.state, 1, r.logits.data() + c.vocab_size));
  EXPECT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept.bytes(), kept.entry_bytes(12));
  EXPECT_EQ(kept.entry_bytes(12), DecodeState::bytes(c, 1, 12) + c.vocab_size * 4);

  std::vector<int32_t> prompt = r.runs[1];
  prompt.push_back(7);
  const KeptStates::Entry* e = kept.longest_prefix(prompt);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->tokens, r.runs[1]);
  ASSERT_EQ(e->state->capacity, 12);
  EXPECT_EQ(e->state->pos[0], 12);
  const int64_t kv = c.kv_dim(), conv = c.conv_state_rows() * c.conv_channels();
  for (size_t l = 0; l < e->state->layers.size(); ++l) {
    const DecodeState::Layer& got = e->state->layers[l];
    const DecodeState::Layer& want = r.state->layers[l];
    for (int64_t i = 0; i < 12 * kv; ++i) {  // sequence 1 of a 64-position state
      ASSERT_EQ(got.k[i], want.k[64 * kv + i]) << "layer " << l << " key " << i;
      ASSERT_EQ(got.v[i], want.v[64 * kv + i]) << "layer " << l << " value " << i;
    }
    for (int64_t i = 0; i < conv; ++i) ASSERT_EQ(got.conv[i], want.conv[conv + i]) << "layer " << l;
    for (int64_t i = 0; i < kv / 2; ++i) ASSERT_EQ(got.vdel[i], want.vdel[kv / 2 + i]) << "layer " << l;
  }
  for (int64_t i = 0; i < c.vocab_size; ++i)
    ASSERT_EQ(e->logits[size_t(i)], r.logits[size_t(c.vocab_size + i)]);

  // A state that has consumed other than the tokens named is refused.
  EXPECT_THROW(kept.keep(tokens_from(3, 11), *r.state, 0, r.logits.data()), Error);
}

TEST(ServeKeptStates, TheLongestPrefixIsFoundAndUseOrdersEviction) {
  TwoSequences t(1, 2);
  const auto &a = t.a, &b = t.b, &a6 = t.a6, &b6 = t.b6;
  const RunStates &r = t.r, &r6 = t.r6;
  const float* logits = r.logits.data();
  const int64_t entry10 = KeptStates(t.model->config(), *t.be, 0).entry_bytes(10);
  KeptStates kept(t.model->config(), *t.be, 3 * entry10);  // a, b and a 6-token entry, not two of those
  ASSERT_TRUE(kept.keep(a, *r.state, 0, logits));
  ASSERT_TRUE(kept.keep(a6, *r6.state, 0, logits));  // kept after a: a does not begin it
  EXPECT_EQ(kept.size(), 2u);
  std::vector<int32_t> a_more = a;
  a_more.push_back(9);
  ASSERT_NE(kept.longest_prefix(a_more), nullptr);
  EXPECT_EQ(kept.longest_prefix(a_more)->tokens, a);  // not a6
  EXPECT_EQ(kept.longest_prefix(a)->tokens, a);       // the whole prompt
  std::vector<int32_t> a_diverging = a;
  a_diverging[7] += 1;
  ASSERT_NE(kept.longest_prefix(a_diverging), nullptr);
  EXPECT_EQ(kept.longest_prefix(a_diverging)->tokens, a6);
  EXPECT_EQ(kept.longest_prefix(std::vector<int32_t>(a.begin(), a.begin() + 5)),
            nullptr);  // shorter than any
  EXPECT_EQ(kept.longest_prefix(b), nullptr);

  // Use order: only touch() makes an entry the most recently used. a6 was kept last; touching a
  // makes a6 the least recently used. b fits beside both; b6 then evicts a6 and nothing more.
  kept.touch(kept.longest_prefix(a));
  ASSERT_TRUE(kept.keep(b6, *r6.state, 1, logits));
  EXPECT_EQ(kept.size(), 3u);
  kept.longest_prefix(a_diverging);                // found, not touched: a6 stays the least recently used
  ASSERT_TRUE(kept.keep(b, *r.state, 1, logits));  // b6 begins b: the first to go, and it goes
  EXPECT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept.longest_prefix(b6), nullptr) << "b6 (an earlier turn of b) should have gone before a6";
  EXPECT_EQ(kept.bytes(), 2 * entry10 + kept.entry_bytes(6));
  ASSERT_TRUE(kept.keep(b6, *r6.state, 1, logits));  // over the budget by one entry: a6 goes
  EXPECT_EQ(kept.size(), 3u);
  EXPECT_LE(kept.bytes(), kept.budget());
  EXPECT_EQ(kept.longest_prefix(a_diverging), nullptr) << "a6, the least recently used, should have gone";
  EXPECT_EQ(kept.longest_prefix(a_more)->tokens, a);
  EXPECT_EQ(kept.longest_prefix(b)->tokens, b);
  EXPECT_EQ(kept.longest_prefix(b6)->tokens, b6);

  // The same tokens again replace their entry.
  ASSERT_TRUE(kept.keep(a, *r.state, 0, logits));
  EXPECT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept.bytes(), 2 * entry10 + kept.entry_bytes(6));
  EXPECT_THROW(kept.touch(nullptr), Error);
}

// A conversation's earlier turn stays while there is room (a turn sent again continues from it)
// but is the first to go: here it goes rather than an entry used less recently than it.
TEST(ServeKeptStates, AnEarlierTurnOfAConversationIsTheFirstToGo) {
  TwoSequences t(6, 7);
  const auto &a = t.a, &b = t.b, &a6 = t.a6;
  const RunStates &r = t.r, &r6 = t.r6;
  const float* logits = r.logits.data();
  const ModelConfig& c = t.model->config();
  const int64_t e10 = KeptStates(c, *t.be, 0).entry_bytes(10), e6 = KeptStates(c, *t.be, 0).entry_bytes(6);
  KeptStates kept(c, *t.be, 3 * e10 + e6 - 1);  // b, a6 and a fit; one more 10-token entry evicts one
  ASSERT_TRUE(kept.keep(b, *r.state, 1, logits));
  ASSERT_TRUE(kept.keep(a6, *r6.state, 0, logits));
  ASSERT_TRUE(kept.keep(a, *r.state, 0, logits));  // a's next turn: a6 stays, last in line
  EXPECT_EQ(kept.size(), 3u);
  std::vector<int32_t> a6_again = a6;  // a6's turn sent again, with another new message
  a6_again.push_back(5);
  ASSERT_NE(kept.longest_prefix(a6_again), nullptr);
  EXPECT_EQ(kept.longest_prefix(a6_again)->tokens, a6);
  // A fourth entry (the same state under other tokens: only the bookkeeping matters here).
  const std::vector<int32_t> d = tokens_from(8, 10);
  ASSERT_TRUE(kept.keep(d, *r.state, 0, logits));
  EXPECT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept.longest_prefix(a6_again), nullptr) << "a6, the earlier turn, should have gone";
  EXPECT_NE(kept.longest_prefix(b), nullptr) << "b went, though a6 was the earlier turn of a";
  EXPECT_NE(kept.longest_prefix(a), nullptr);
  EXPECT_NE(kept.longest_prefix(d), nullptr);
}

TEST(ServeKeptStates, AnEntryOverTheWholeBudgetIsNotKept) {
  TwoSequences t(4, 5);
  const auto &a = t.a, &b = t.b;
  const RunStates& r = t.r;
  const ModelConfig& c = t.model->config();
  Backend* be = t.be.get();
  KeptStates none(c, *be, 0);
  EXPECT_FALSE(none.keep(a, *r.state, 0, r.logits.data()));
  EXPECT_EQ(none.size(), 0u);
  EXPECT_EQ(none.bytes(), 0);
  KeptStates one(c, *be, none.entry_bytes(10));
  EXPECT_TRUE(one.keep(a, *r.state, 0, r.logits.data()));
  EXPECT_TRUE(one.keep(b, *r.state, 1, r.logits.data()));  // a goes
  EXPECT_EQ(one.size(), 1u);
  EXPECT_EQ(one.longest_prefix(a), nullptr);
  KeptStates too_small(c, *be, none.entry_bytes(10) - 1);
  EXPECT_FALSE(too_small.keep(a, *r.state, 0, r.logits.data()));
  EXPECT_EQ(too_small.size(), 0u);
  EXPECT_THROW(KeptStates(c, *be, -1), Error);
}

}  // namespace
}  // namespace zaya
