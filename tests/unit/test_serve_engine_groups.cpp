// The completion engine's prefill of several prompts in one forward pass (src/serve/
// completion_engine_prefill.cpp): prompts taken from the queue together run as a group in the
// batch's free sequences, each from its own position, and join the batch as they finish. Every
// completion must come out as it does alone, and the passes and positions are counted exactly.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "../common/tiny_serve_model.h"
#include "serve/api_error.h"
#include "serve/completion_engine.h"
#include "serve/completion_run.h"

namespace zaya {
namespace {

using test::tiny_model;

CompletionJob sampled(std::vector<int32_t> prompt, uint64_t seed) {
  CompletionJob j;
  j.prompt = std::move(prompt);
  j.max_tokens = 5;
  j.sampling = {1.2f, 0, 1.0f};
  j.seed = seed;
  return j;
}

// A prompt of n ids inside the tiny model's vocabulary, different for each salt.
std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> ids;
  for (int t = 0; t < n; ++t) ids.push_back(int32_t(3 + (salt * 101 + t * (7 + 2 * salt)) % 480));
  return ids;
}

std::vector<CompletionResult> run_alone(Model& model, const std::vector<CompletionJob>& jobs) {
  std::vector<CompletionResult> out;
  for (const CompletionJob& j : jobs)
    out.push_back(run_completion(model, nullptr, j, [](const CompletionChunk&) { return true; }));
  return out;
}

// Five prompts of 5, 9, 9, 14 and 30 tokens submitted together run as one group, ordered by
// the positions they have left, and each pass runs as many of the first ones as the budget holds
// for as many positions as the first has left. With 256 positions per turn: pass 1 runs 5
// positions of all five, pass 2 4 of the four left, pass 3 5 of the two left, pass 4 the last 16
// of the longest. With 12 per turn: the passes run 2 x 5, 1 x 2, then 4 x 2 (the most in one
// pass), 1 x 4, 3 x 3, 1 x 3, 2 x 6, 1 x 12 and 1 x 7. With 3 per turn, a prompt with more
// positions left than that runs alone. Each comes out as it does alone.
TEST(ServeEngine, PromptsArrivingTogetherArePrefilledInOnePass) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  std::vector<CompletionJob> jobs;
  const std::vector<int> lengths = {14, 9, 30, 5, 9};  // submitted out of order
  for (size_t i = 0; i < lengths.size(); ++i) jobs.push_back(sampled(prompt_of(lengths[i], int(i)), 40 + i));
  const std::vector<CompletionResult> alone = run_alone(*model, jobs);

  for (const int64_t chunk : {int64_t(256), int64_t(12), int64_t(3)}) {
    SCOPED_TRACE("prefill_chunk " + std::to_string(chunk));
    EngineOptions eo{16, 0, 8};
    eo.prefill_chunk = chunk;
    CompletionEngine engine(*model, nullptr, eo);
    std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
    for (size_t i = 0; i < jobs.size(); ++i) {
      const CompletionResult r = engine.wait(tickets[i]);
      EXPECT_EQ(r.ids, alone[i].ids) << "completion " << i;
      EXPECT_EQ(r.finish_reason, alone[i].finish_reason) << "completion " << i;
    }
    const EngineStats st = engine.stats();
    EXPECT_EQ(st.prefill_positions, 5 + 9 + 9 + 14 + 30);
    if (chunk == 256) {
      EXPECT_EQ(st.peak_prefill_group, 5);
      EXPECT_EQ(st.prefill_chunks, 4);
    } else if (chunk == 12) {
      EXPECT_EQ(st.peak_prefill_group, 4);
      EXPECT_EQ(st.prefill_chunks, 9);
    }
    EXPECT_EQ(st.prefills_reused, 0);
    EXPECT_EQ(st.completions, int64_t(jobs.size()));
  }
}

// One group whose members start from different kept states, so one pass runs sequences at
// different positions: a conversation's next turn (a finished completion and 3 new tokens), a
// prompt extending a kept prompt, a fresh prompt, and a second choice of that fresh prompt,
// which follows it and runs nothing.
TEST(ServeEngine, AGroupRunsPromptsFromDifferentKeptStates) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  const CompletionJob a = sampled(prompt_of(11, 1), 1), b = sampled(prompt_of(7, 2), 2);
  const std::vector<CompletionResult> earlier = run_alone(*model, {a, b});
  ASSERT_EQ(earlier[0].finish_reason, "length");
  std::vector<int32_t> a_fed = a.prompt;  // what a's finished state holds: all but its last token
  a_fed.insert(a_fed.end(), earlier[0].ids.begin(), earlier[0].ids.end() - 1);
  std::vector<int32_t> next_turn = a_fed, b_extended = b.prompt;
  for (int32_t t : {17, 29, 31}) next_turn.push_back(t);
  for (int32_t t : {5, 6, 7, 8, 9}) b_extended.push_back(t);
  const std::vector<CompletionJob> jobs = {sampled(next_turn, 3), sampled(b_extended, 4),
                                           sampled(prompt_of(6, 3), 5), sampled(prompt_of(6, 3), 6)};
  const std::vector<CompletionResult> alone = run_alone(*model, jobs);

  CompletionEngine engine(*model, nullptr, EngineOptions{16, 0, 8});
  EXPECT_EQ(engine.run(a).ids, earlier[0].ids);
  EXPECT_EQ(engine.run(b).ids, earlier[1].ids);
  const EngineStats before = engine.stats();
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_EQ(engine.wait(tickets[i]).ids, alone[i].ids) << "completion " << i;
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.finished_continued - before.finished_continued, 1);
  EXPECT_EQ(st.prefill_positions_reused - before.prefill_positions_reused,
            int64_t(a_fed.size() + b.prompt.size()));
  EXPECT_EQ(st.prefill_positions - before.prefill_positions, 3 + 5 + 6);
  EXPECT_EQ(st.prefills_reused - before.prefills_reused, 1);
  EXPECT_EQ(st.peak_prefill_group, 3);
}

// A pass that fails (an id outside the vocabulary, which the HTTP layer refuses before; here
// it stands for any failure) leaves the sequences it ran in no known state: every completion in
// the group then fails, a follower included, and nothing of it is kept. What had left the group
// before carries on: a completion decoding meanwhile (0) and a member whose prompt finished in
// the pass before (1, which extends 0's prompt and so starts the second group). The group
// {1, 2, 3 (+ 4)} runs 3 positions of each (1 finishes), then 6 of 2 and 3, where 2's bad id is.
TEST(ServeEngine, AFailedPassFailsItsGroupAndNothingElse) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  const std::vector<int32_t> p = prompt_of(5, 6);
  std::vector<int32_t> p_more = p, bad = prompt_of(9, 4);
  for (int32_t t : {11, 12, 13}) p_more.push_back(t);
  bad[6] = int32_t(model->config().vocab_size);
  CompletionJob running = sampled(p, 7);
  running.max_tokens = 12;
  const CompletionJob good = sampled(p_more, 8), mate = sampled(prompt_of(12, 7), 9);
  const std::vector<CompletionResult> alone = run_alone(*model, {running, good, mate});

  CompletionEngine engine(*model, nullptr, EngineOptions{16, 0, 8});
  std::vector<CompletionEngine::Ticket> tickets =
      engine.submit({running, good, sampled(bad, 10), mate, mate});
  EXPECT_EQ(engine.wait(tickets[0]).ids, alone[0].ids);
  EXPECT_EQ(engine.wait(tickets[1]).ids, alone[1].ids);
  for (size_t i = 2; i < tickets.size(); ++i) {
    try {
      engine.wait(tickets[i]);
      ADD_FAILURE() << "completion " << i << " should have failed with its group";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 500) << "completion " << i;
      EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
    }
  }
  const EngineStats before = engine.stats();
  EXPECT_EQ(before.prefill_positions, 5 + 3 * 3 + 2 * 6);
  EXPECT_EQ(before.peak_prefill_group, 3);
  EXPECT_EQ(engine.run(mate).ids, alone[2].ids);  // nothing of its failed prefill was kept
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.prefill_positions - before.prefill_positions, 12);
  EXPECT_EQ(st.prefills_reused, 0);
  EXPECT_EQ(st.completions, 6);
}

// Waits (up to 30 s) until the engine reports `n` completions running or being prefilled.
bool wait_for_running(const CompletionEngine& engine, int64_t n) {
  for (int i = 0; i < 30000 && engine.stats().running != n; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return engine.stats().running == n;
}

// A completion cancelled while its prompt is prefilled leaves the group at the next turn, and
// the others come out as they do alone. With 2 positions per turn, a group of 6-, 40- and
// 600-token prompts runs the first two whole before the third starts, which would then take 300
// turns; it is cancelled as it starts and must stop long before its end.
TEST(ServeEngine, ACancelledMemberLeavesTheGroup) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  const std::vector<CompletionJob> jobs = {sampled(prompt_of(6, 1), 1), sampled(prompt_of(40, 2), 2),
                                           sampled(prompt_of(600, 3), 3)};
  const std::vector<CompletionResult> alone = run_alone(*model, {jobs[0], jobs[1]});
  EngineOptions eo{16, 0, 8};
  eo.prefill_chunk = 2;
  CompletionEngine engine(*model, nullptr, eo);
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  for (int i = 0; i < 30000 && engine.stats().prefill_positions < 6 + 40; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  { CompletionEngine::Ticket dropped = std::move(tickets[2]); }  // cancels it
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(engine.wait(tickets[i]).ids, alone[i].ids) << "completion " << i;
  for (int i = 0; i < 30000 && engine.stats().completions < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.completions, 3);
  EXPECT_GE(st.prefill_positions, 6 + 40);
  EXPECT_LT(st.prefill_positions, 6 + 40 + 600);
}

// Shutting down while a group is prefilled ends every completion exactly once: cancelled (the
// members, the follower, the one held back for the next group) or refused (the queue).
TEST(ServeEngine, ShutdownDuringAGroupEndsEveryCompletion) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  // One position per turn: the first completion cannot finish within 300 turns.
  const CompletionJob first = sampled(prompt_of(300, 1), 1);
  CompletionJob extends = first;
  extends.prompt.push_back(9);
  std::vector<CompletionJob> jobs = {first, sampled(prompt_of(400, 2), 2), first, extends};
  EngineOptions eo{16, 0, 8};
  eo.prefill_chunk = 1;
  CompletionEngine engine(*model, nullptr, eo);
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  ASSERT_TRUE(wait_for_running(engine, 4));  // two members, a follower, one held back
  std::thread stopper([&] { engine.shutdown(); });
  for (size_t i = 0; i < tickets.size(); ++i) {
    try {
      EXPECT_EQ(engine.wait(tickets[i]).finish_reason, "cancelled") << "completion " << i;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status(), 503) << "completion " << i;
    }
  }
  stopper.join();
  EXPECT_EQ(engine.stats().completions, int64_t(jobs.size()));
}

}  // namespace
}  // namespace zaya
