// What the completion engine (src/serve/completion_engine.h) reuses instead of running the model
// again: the prefill of a prompt (a request's n or best_of choices, the same prompt again, a
// prompt extending it) and the kept states of finished completions (a conversation's next turn,
// which sends the reply back). Every completion must come out as it does alone, and the
// positions given to the model and those reused are counted exactly.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/tiny_serve_model.h"
#include "serve/api_error.h"
#include "serve/completion_engine.h"
#include "serve/completion_run.h"

namespace zaya {
namespace {

using test::tiny_model;

// n token ids: first + (t * step) mod 500 for t = 0 .. n-1 (inside the tiny model's vocabulary).
std::vector<int32_t> ids_in_steps(int n, int first, int step) {
  std::vector<int32_t> ids;
  for (int t = 0; t < n; ++t) ids.push_back(int32_t(first + (t * step) % 500));
  return ids;
}

// The choices of one prompt (a request's n or best_of) share its prefill: those taken into the
// same group follow the first, and later ones, and the same prompt sent again, start from the
// prompt's kept state; one whose prompt extends it (a conversation's next turn) prefills only
// the rest, after waiting for it when they arrive together. Each comes out as it does alone. A
// completion that reports the prompt's logprobs (echo) runs the whole prompt, alone. A prompt
// whose prefill fails leaves nothing behind that a later prompt extending it could start from.
TEST(ServeEngine, CompletionsOfTheSamePromptShareItsPrefill) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  const std::vector<int32_t> prompt_a = ids_in_steps(20, 4, 13), prompt_b = ids_in_steps(12, 9, 7);
  auto extended = [](std::vector<int32_t> prompt, int extra) {
    for (int t = 0; t < extra; ++t) prompt.push_back(int32_t(30 + 17 * int32_t(prompt.size()) % 400));
    return prompt;
  };
  const std::vector<int32_t> turn2 = extended(prompt_a, 5), turn3 = extended(turn2, 3);
  // A prompt that extends a but fails in its second pass (an id outside the vocabulary, which
  // the HTTP layer refuses before; here it stands for a failed pass), after its first pass has
  // run some of its positions: the prompt after it, extending it, must run from a's state.
  std::vector<int32_t> failing = extended(prompt_a, 10);
  failing.push_back(int32_t(model->config().vocab_size));
  std::vector<int32_t> after_failing = failing;
  after_failing.back() = 7;
  auto job = [](const std::vector<int32_t>& prompt, uint64_t seed) {
    CompletionJob j;
    j.prompt = prompt;
    j.max_tokens = 6;
    j.sampling = {1.2f, 0, 1.0f};
    j.seed = seed;
    return j;
  };
  // The groups, with a batch of 8, as places free up: {0, 1, 2}, {3}, {4, 5, 6}, {7} (the one
  // place left), {8}, {9, 10}, {11}, {12}.
  std::vector<CompletionJob> jobs = {
      job(prompt_a, 1),                          // 0: runs a
      job(prompt_a, 2),                          // 1, 2: follow 0
      job(prompt_a, 3),       job(prompt_a, 4),  // 3: echo: runs a again, alone
      job(prompt_a, 5),                          // 4: a's kept state: runs nothing
      job(prompt_b, 6),                          // 5: runs b
      job(prompt_a, 7),                          // 6: follows 4
      job(failing, 8),         // 7: extends a (waits for 4's group), fails in its second pass
      job(prompt_a, 9),        // 8: a's kept state: runs nothing
      job(after_failing, 10),  // 9: extends 8's a (waits): runs its 11 positions after a
      job(turn2, 11),          // 10: begins 9's prompt: runs its 5 after a, in 9's group
      job(turn3, 12),          // 11: extends 10's (waits): runs turn 3's 3 new positions
      job(turn3, 13),          // 12: echo: runs turn 3 whole, alone
  };
  constexpr size_t kFailing = 7;
  for (size_t e : {size_t(3), size_t(12)}) {
    jobs[e].echo = true;
    jobs[e].logprobs = 2;
  }
  std::vector<CompletionResult> alone;
  auto quiet = [](const CompletionChunk&) { return true; };
  for (size_t i = 0; i < jobs.size(); ++i)
    alone.push_back(i == kFailing ? CompletionResult{} : run_completion(*model, nullptr, jobs[i], quiet));

  EngineOptions eo{16, 0, 8};
  eo.prefill_chunk = 8;
  CompletionEngine engine(*model, nullptr, eo);
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE("completion " + std::to_string(i));
    if (i == kFailing) {
      EXPECT_THROW(engine.wait(tickets[i]), ApiError);
      continue;
    }
    const CompletionResult r = engine.wait(tickets[i]);
    EXPECT_EQ(r.ids, alone[i].ids);
    EXPECT_EQ(r.finish_reason, alone[i].finish_reason);
    ASSERT_EQ(r.logprobs.has_value(), jobs[i].echo);
    if (!r.logprobs) continue;
    ASSERT_EQ(r.logprobs->size(), jobs[i].prompt.size() + r.ids.size());
    for (size_t k = 1; k < r.logprobs->size(); ++k) {  // entry 0, the prompt's first token, has none
      ASSERT_TRUE((*r.logprobs)[k].logprob.has_value()) << "entry " << k;
      EXPECT_NEAR(*(*r.logprobs)[k].logprob, *(*alone[i].logprobs)[k].logprob, 1e-4) << "entry " << k;
    }
  }
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.prefills_reused, 5);                      // jobs 1, 2, 4, 6 and 8
  EXPECT_EQ(st.prefill_positions_reused, 20 + 20 + 25);  // jobs 9, 10 and 11
  // Positions given to the model: a, a (echo), b, the failing prompt's 11 after a, the 11 after
  // a of the prompt after it, 5, 3, and turn 3's 28 (echo). The failing prompt's 20 reused
  // positions do not count: its prefill never finished.
  EXPECT_EQ(st.prefill_positions, 20 + 20 + 12 + 11 + 11 + 5 + 3 + 28);
  // 9 and 10: a turn's last position runs 10's first alone, the next turn 4 positions of each
  // (in the other groups, one prompt runs).
  EXPECT_EQ(st.peak_prefill_group, 2);
  EXPECT_EQ(st.completions, int64_t(jobs.size()));
}

CompletionJob sampled_job(const std::vector<int32_t>& prompt, uint64_t seed) {
  CompletionJob j;
  j.prompt = prompt;
  j.max_tokens = 6;
  j.sampling = {1.2f, 0, 1.0f};
  j.seed = seed;
  return j;
}

// The tokens a finished completion's decode state holds: its prompt and what it generated, less
// the last token when max_tokens ended it (sampled, never fed). EOS is not among the ids.
std::vector<int32_t> fed_tokens(const CompletionJob& job, const CompletionResult& result) {
  std::vector<int32_t> t = job.prompt;
  t.insert(t.end(), result.ids.begin(), result.ids.end());
  if (result.finish_reason == "length") t.pop_back();
  return t;
}

std::vector<int32_t> followed_by(std::vector<int32_t> tokens, int extra, int salt) {
  for (int t = 0; t < extra; ++t) tokens.push_back(int32_t(40 + (salt * 31 + 11 * t) % 450));
  return tokens;
}

// A conversation's next turn sends the whole exchange back: its prompt, the reply and a new
// message. The engine keeps finished completions' states, so the turn runs only what
// its reply's last token (never fed) and the new message add; a prompt of exactly those tokens
// runs nothing. With a batch of one, each job begins only once the one before has finished, so
// what is kept when each begins is known. Each comes out as it does alone.
TEST(ServeEngine, AConversationsNextTurnContinuesTheFinishedCompletion) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  auto quiet = [](const CompletionChunk&) { return true; };
  const std::vector<int32_t> prompt = ids_in_steps(20, 4, 13);

  // The replies, from runs alone, to build the turns that send them back.
  const CompletionJob first = sampled_job(prompt, 1);
  const CompletionResult first_alone = run_completion(*model, nullptr, first, quiet);
  ASSERT_EQ(first_alone.finish_reason, "length");
  std::vector<int32_t> turn2 = prompt;
  turn2.insert(turn2.end(), first_alone.ids.begin(), first_alone.ids.end());
  turn2 = followed_by(turn2, 4, 1);
  const CompletionJob second = sampled_job(turn2, 2);
  const CompletionResult second_alone = run_completion(*model, nullptr, second, quiet);
  const std::vector<int32_t> second_fed = fed_tokens(second, second_alone);

  std::vector<CompletionJob> jobs = {
      first,                                     // 0: runs the prompt (20 positions)
      second,                                    // 1: continues 0: runs its last token and 4 more
      sampled_job(second_fed, 3),                // 2: exactly what 1 holds: runs nothing
      sampled_job(followed_by(turn2, 3, 2), 4),  // 3: echo: runs its whole prompt
  };
  jobs[3].echo = true;
  jobs[3].logprobs = 1;
  std::vector<CompletionResult> alone = {first_alone, second_alone};
  for (size_t i = 2; i < jobs.size(); ++i) alone.push_back(run_completion(*model, nullptr, jobs[i], quiet));

  EngineOptions eo{16, 0, 1};
  eo.prefill_chunk = 8;
  CompletionEngine engine(*model, nullptr, eo);
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE("completion " + std::to_string(i));
    const CompletionResult r = engine.wait(tickets[i]);
    EXPECT_EQ(r.ids, alone[i].ids);
    EXPECT_EQ(r.finish_reason, alone[i].finish_reason);
  }
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.finished_continued, 2);         // jobs 1 and 2
  EXPECT_EQ(st.prefills_reused, 1);            // job 2
  EXPECT_EQ(st.prefill_positions_reused, 25);  // job 1: the prompt and 5 of its 6 reply tokens
  EXPECT_EQ(st.prefill_positions, int64_t(20 + 5 + jobs[3].prompt.size()));
  EXPECT_EQ(st.completions, int64_t(jobs.size()));
}

// When both a kept prompt and a kept finished completion begin a prompt, it continues from
// whichever holds more of it. With a batch of two: 1, which extends 0's prompt and 5 of its
// reply tokens, waits for 0's prefill and starts from its kept prompt, while 0 decodes; 2 waits
// for a place, which 0's finish makes, and then extends 1's prompt (35 positions) rather than
// 0's finished state (25). A cancelled completion is not kept.
TEST(ServeEngine, APromptContinuesWhicheverKeptStateHoldsMoreOfIt) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  auto quiet = [](const CompletionChunk&) { return true; };
  const std::vector<int32_t> prompt = ids_in_steps(20, 9, 7);
  const CompletionJob first = sampled_job(prompt, 5);
  const CompletionResult first_alone = run_completion(*model, nullptr, first, quiet);
  ASSERT_EQ(first_alone.finish_reason, "length");  // the order below assumes every max_tokens is reached
  CompletionJob second = sampled_job(followed_by(fed_tokens(first, first_alone), 10, 3), 6);
  second.max_tokens = 12;  // still decoding when 0 finishes
  const CompletionJob third = sampled_job(followed_by(second.prompt, 3, 4), 7);

  std::vector<CompletionJob> jobs = {first, second, third};
  std::vector<CompletionResult> alone = {first_alone};
  for (size_t i = 1; i < jobs.size(); ++i) {
    alone.push_back(run_completion(*model, nullptr, jobs[i], quiet));
    ASSERT_EQ(alone[i].finish_reason, "length") << "completion " << i;
  }

  EngineOptions eo{16, 0, 2};
  eo.prefill_chunk = 8;
  CompletionEngine engine(*model, nullptr, eo);
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  std::vector<CompletionResult> got;
  for (size_t i = 0; i < jobs.size(); ++i) {
    SCOPED_TRACE("completion " + std::to_string(i));
    got.push_back(engine.wait(tickets[i]));
    EXPECT_EQ(got[i].ids, alone[i].ids);
  }
  EngineStats st = engine.stats();
  EXPECT_EQ(st.finished_continued, 0);
  EXPECT_EQ(st.prefill_positions_reused, 20 + 35);  // job 1 extends 0's prompt, job 2 1's
  EXPECT_EQ(st.prefill_positions, 20 + 15 + 3);

  // A completion cancelled at its second token, so in the batch, is not kept; a turn continuing
  // 1 finds 1's state. The engine sees the cancellation a few tokens later (the caller's thread
  // sets it); without EOS and with max_tokens the whole context, it is still running then.
  CompletionJob cancelled = sampled_job(prompt, 8);
  cancelled.max_tokens = engine.context() - int64_t(prompt.size());
  cancelled.sampling.logit_bias = {{1, -100.0f}};  // no EOS: it runs until cancelled
  int chunks = 0;
  EXPECT_EQ(engine.run(cancelled, [&](const CompletionChunk&) { return ++chunks < 2; }).finish_reason,
            "cancelled");
  // Kept: the prompts of 0, 1 and 2 and the completions; the cancelled completion's prompt,
  // 0's, ran nothing (and so is not kept again), and the completion must not be kept.
  EXPECT_EQ(engine.stats().kept, 6);
  const std::vector<int32_t> kept = fed_tokens(jobs[1], got[1]);
  const CompletionJob next_turn = sampled_job(followed_by(kept, 2, 5), 9);
  EXPECT_EQ(engine.run(next_turn).ids, run_completion(*model, nullptr, next_turn, quiet).ids);
  const EngineStats after = engine.stats();
  EXPECT_EQ(after.finished_continued, 1);
  EXPECT_EQ(after.prefill_positions_reused, st.prefill_positions_reused + int64_t(kept.size()));
  EXPECT_EQ(after.kept, 8);  // the new turn's prompt and completion
}

// Two completions that end in the same decode step: the first's sequence is freed and the
// batch's last moves into it before the second is seen to end, so the second is kept from its
// new place, with the logits of its old one. A prompt of exactly its tokens starts from those
// logits (greedy, with the first token's log-probability compared: another row's logits give
// another token or value).
TEST(ServeEngine, ACompletionEndingAfterAMoveIsKeptWithItsOwnLogits) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  auto quiet = [](const CompletionChunk&) { return true; };
  const std::vector<int32_t> prompt_a = ids_in_steps(7, 5, 29), prompt_b = ids_in_steps(9, 8, 37);
  const std::vector<CompletionJob> jobs = {sampled_job(prompt_a, 11), sampled_job(prompt_b, 12)};
  std::vector<CompletionResult> alone;
  for (const CompletionJob& j : jobs) {
    alone.push_back(run_completion(*model, nullptr, j, quiet));
    ASSERT_EQ(alone.back().finish_reason, "length");  // both end at the same step
  }
  CompletionJob exact = sampled_job(fed_tokens(jobs[1], alone[1]), 13);
  exact.sampling = {0.0f, 0, 1.0f};
  exact.logprobs = 0;
  const CompletionResult exact_alone = run_completion(*model, nullptr, exact, quiet);

  CompletionEngine engine(*model, nullptr, EngineOptions{16, 0, 2});  // both prompts in one turn
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  for (size_t i = 0; i < jobs.size(); ++i) EXPECT_EQ(engine.wait(tickets[i]).ids, alone[i].ids);
  const CompletionResult r = engine.run(exact);
  EXPECT_EQ(engine.stats().finished_continued, 1);
  EXPECT_EQ(r.ids, exact_alone.ids);
  ASSERT_TRUE(r.logprobs && exact_alone.logprobs && !r.logprobs->empty());
  ASSERT_EQ(r.logprobs->size(), exact_alone.logprobs->size());
  EXPECT_NEAR(*r.logprobs->front().logprob, *exact_alone.logprobs->front().logprob, 1e-4);
}

// Conversations interleaved, as several clients' are: each turn 2 comes after the other
// conversation's turn 1 and still continues its own turn 1, which stays kept beside the other.
// With keep_bytes 0 nothing is kept and every turn runs its whole prompt, with the same
// results.
TEST(ServeEngine, InterleavedConversationsEachContinueTheirOwnTurn) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  auto quiet = [](const CompletionChunk&) { return true; };
  std::vector<CompletionJob> first, second;
  for (int c = 0; c < 2; ++c) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 16; ++t) prompt.push_back(int32_t(6 + (t * (11 + 4 * c) + c) % 500));
    first.push_back(sampled_job(prompt, uint64_t(20 + c)));
    const CompletionResult reply = run_completion(*model, nullptr, first.back(), quiet);
    std::vector<int32_t> turn2 = prompt;
    turn2.insert(turn2.end(), reply.ids.begin(), reply.ids.end());
    second.push_back(sampled_job(followed_by(turn2, 3, 7 + c), uint64_t(30 + c)));
  }
  const std::vector<CompletionJob> jobs = {first[0], first[1], second[0], second[1]};
  std::vector<CompletionResult> alone;
  for (const CompletionJob& j : jobs) alone.push_back(run_completion(*model, nullptr, j, quiet));

  for (const int64_t keep_bytes : {int64_t(1) << 30, int64_t(0)}) {
    SCOPED_TRACE("keep_bytes " + std::to_string(keep_bytes));
    EngineOptions eo{16, 0, 1};  // one at a time, in order
    eo.keep_bytes = keep_bytes;
    CompletionEngine engine(*model, nullptr, eo);
    std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
    int64_t turn2_positions = 0, turn2_reused = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      EXPECT_EQ(engine.wait(tickets[i]).ids, alone[i].ids) << "completion " << i;
      if (i < 2) continue;
      const int64_t kept = int64_t(fed_tokens(jobs[i - 2], alone[i - 2]).size());
      turn2_reused += kept;
      turn2_positions += int64_t(jobs[i].prompt.size()) - kept;
    }
    const EngineStats st = engine.stats();
    if (keep_bytes > 0) {
      EXPECT_EQ(st.finished_continued, 2);
      EXPECT_EQ(st.prefill_positions_reused, turn2_reused);
      EXPECT_EQ(st.prefill_positions, 16 + 16 + turn2_positions);
      EXPECT_EQ(st.kept, 8);  // each turn's prompt and completion
      EXPECT_GT(st.kept_bytes, 0);
    } else {
      EXPECT_EQ(st.finished_continued, 0);
      EXPECT_EQ(st.prefill_positions_reused, 0);
      EXPECT_EQ(st.prefill_positions, 16 + 16 + int64_t(jobs[2].prompt.size() + jobs[3].prompt.size()));
      EXPECT_EQ(st.kept, 0);
      EXPECT_EQ(st.kept_bytes, 0);
    }
  }
}

}  // namespace
}  // namespace zaya
