// The inference server's completion engine without HTTP (src/serve/completion_engine.h): its
// queue and shutdown, continuous batching (completions decoded together come out as each does
// alone), chunked prefill between decode steps, and the context it serves. What it reuses of
// earlier prompts and completions: test_serve_engine_reuse.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../common/tiny_serve_model.h"
#include "core/error.h"
#include "serve/api_error.h"
#include "serve/completion_engine.h"
#include "serve/completion_run.h"

namespace zaya {
namespace {

using test::kPrompt;
using test::tiny_model;

// The engine serialises completions: while one runs, max_queue more may wait; the next gets a
// 503 at once. Shutdown cancels the running one and fails the waiting ones with 503.
TEST(ServeEngine, AFullQueueIsA503AndShutdownEndsEverything) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  CompletionEngine engine(*model, nullptr, EngineOptions{1, 0, 1});
  const int64_t long_run = model->config().max_position_embeddings - int64_t(kPrompt.size());
  auto job = [&](int64_t max_tokens) {
    CompletionJob j;
    j.prompt = kPrompt;
    j.max_tokens = max_tokens;
    j.sampling = {1.0f, 0, 1.0f};
    j.seed = 5;
    return j;
  };
  std::thread waiting, stopper;
  std::string waiting_error;
  bool first_chunk = true;
  int full_status = 0;
  CompletionResult running = engine.run(job(long_run), [&](const CompletionChunk&) {
    if (!first_chunk) return true;
    first_chunk = false;
    // The long job is running: queue one behind it, then one too many.
    waiting = std::thread([&] {
      try {
        engine.run(job(4));
      } catch (const ApiError& e) {
        waiting_error = std::to_string(e.status()) + " " + e.what();
      }
    });
    while (engine.accepting()) std::this_thread::yield();
    try {
      engine.run(job(4));
    } catch (const ApiError& e) {
      full_status = e.status();
      EXPECT_NE(std::string(e.what()).find("the server is busy"), std::string::npos) << e.what();
    }
    stopper = std::thread([&] { engine.shutdown(); });
    return true;
  });
  waiting.join();
  stopper.join();
  EXPECT_EQ(full_status, 503);
  EXPECT_EQ(waiting_error, "503 the server is shutting down");
  EXPECT_EQ(running.finish_reason, "cancelled");
  EXPECT_LT(int64_t(running.ids.size()), long_run);
  EXPECT_THROW(engine.run(job(1)), ApiError);
}

// Continuous batching: completions of different prompts, lengths and sampling settings (greedy,
// hot, penalties and bias, echo and logprobs), more of them than the batch holds, prompts
// prefilled in chunks between decode steps, so that some join while others decode and some leave early
// (max_tokens, a cancellation), moving the last sequence of the batch into the freed slot. Each waits on its
// own thread, as HTTP handlers do. Every completion must come out as it does alone (run_completion, a batch
// of one), and the engine must have decoded them together.
TEST(ServeEngine, CompletionsDecodedTogetherMatchEachAlone) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  const int64_t V = model->config().vocab_size;
  constexpr size_t kJobs = 7, kCancelled = 5, kCancelAfter = 3;
  std::vector<CompletionJob> jobs;
  for (size_t i = 0; i < kJobs; ++i) {
    CompletionJob j;
    for (size_t t = 0; t < 3 + 4 * i; ++t) j.prompt.push_back(int32_t(4 + (i * 37 + t * 11) % size_t(V - 4)));
    j.max_tokens = int64_t(5 + 4 * (i % 3));
    j.sampling = i % 2 ? SamplingParams{0.0f, 0, 1.0f} : SamplingParams{1.3f, 0, 1.0f};
    j.seed = 100 + i;
    j.logprobs = i % 3 == 0 ? 2 : -1;
    j.echo = i == 3;
    if (i == 2) {
      j.sampling.frequency_penalty = 0.7f;
      j.sampling.logit_bias = {{7, 2.5f}};
    }
    if (i == kCancelled) {
      j.max_tokens = 40;
      j.sampling.logit_bias = {{1, -100.0f}};  // no EOS: it runs until cancelled
    }
    jobs.push_back(j);
  }
  std::vector<CompletionResult> alone;
  for (const CompletionJob& j : jobs)
    alone.push_back(run_completion(*model, nullptr, j, [](const CompletionChunk&) { return true; }));

  EngineOptions eo{16, 0, 3};
  eo.prefill_chunk = 5;  // prompts of 3 to 27 tokens: most are prefilled over several turns
  CompletionEngine engine(*model, nullptr, eo);
  std::vector<CompletionEngine::Ticket> tickets = engine.submit(jobs);
  std::vector<CompletionResult> together(kJobs);
  std::vector<std::vector<int32_t>> streamed(kJobs);
  std::vector<std::thread> waiters;
  for (size_t i = 0; i < kJobs; ++i)
    waiters.emplace_back([&, i] {
      together[i] = engine.wait(tickets[i], [&, i](const CompletionChunk& c) {
        streamed[i].insert(streamed[i].end(), c.ids.begin(), c.ids.end());
        return i != kCancelled || streamed[i].size() < kCancelAfter;
      });
    });
  for (std::thread& t : waiters) t.join();

  for (size_t i = 0; i < kJobs; ++i) {
    SCOPED_TRACE("completion " + std::to_string(i));
    if (i == kCancelled) {
      // The callback's refusal is seen at the next token; the chunks after it are not delivered.
      EXPECT_EQ(streamed[i].size(), kCancelAfter);
      EXPECT_TRUE(std::equal(streamed[i].begin(), streamed[i].end(), together[i].ids.begin()));
      EXPECT_EQ(together[i].finish_reason, "cancelled");
      ASSERT_GE(together[i].ids.size(), kCancelAfter);
      EXPECT_LT(together[i].ids.size(), alone[i].ids.size());
      EXPECT_TRUE(std::equal(together[i].ids.begin(), together[i].ids.end(), alone[i].ids.begin()));
      continue;
    }
    EXPECT_EQ(together[i].ids, streamed[i]);
    EXPECT_EQ(together[i].ids, alone[i].ids);
    EXPECT_EQ(together[i].finish_reason, alone[i].finish_reason);
    EXPECT_EQ(together[i].prompt_tokens, int64_t(jobs[i].prompt.size()));
    ASSERT_EQ(together[i].logprobs.has_value(), jobs[i].logprobs >= 0);
    if (!together[i].logprobs) continue;
    const std::vector<LogprobEntry>&got = *together[i].logprobs, &want = *alone[i].logprobs;
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(got.size(), (jobs[i].echo ? jobs[i].prompt.size() : 0) + together[i].ids.size());
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_EQ(got[k].token, want[k].token) << "entry " << k;
      ASSERT_EQ(got[k].logprob.has_value(), want[k].logprob.has_value()) << "entry " << k;
      if (got[k].logprob) {
        EXPECT_NEAR(*got[k].logprob, *want[k].logprob, 1e-4) << "entry " << k;
      }
      ASSERT_EQ(got[k].top.has_value(), want[k].top.has_value());
      if (got[k].top) {
        ASSERT_EQ(got[k].top->size(), want[k].top->size());
        for (size_t a = 0; a < got[k].top->size(); ++a) {
          EXPECT_EQ((*got[k].top)[a].first, (*want[k].top)[a].first);
          EXPECT_NEAR((*got[k].top)[a].second, (*want[k].top)[a].second, 1e-4);
        }
      }
    }
  }
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.completions, int64_t(kJobs));
  EXPECT_EQ(st.peak_batch, 3);
  // Prompts of 3 to 27 tokens through turns of 5 positions: the long ones took several chunks.
  int64_t positions = 0;
  for (const CompletionJob& j : jobs) positions += int64_t(j.prompt.size());
  EXPECT_GE(st.prefill_chunks, (positions + 4) / 5);
  // One forward feeds every running completion: far fewer steps than tokens fed. The cancelled
  // completion may go on decoding alone until its waiter's refusal arrives (thread timing: under
  // load, dozens of tokens), one step per token, so its tokens count as steps of their own.
  const double cancelled_tokens = double(together[kCancelled].ids.size());
  EXPECT_LT(double(st.decode_steps), 0.6 * (double(st.decoded_tokens) - cancelled_tokens) + cancelled_tokens);
}

// A long prompt is prefilled in chunks that alternate with the running completions' decode
// steps: a completion already decoding goes on producing tokens while it is prefilled, instead of
// waiting for the whole prompt. Its first token must come after the running completion's tokens
// of the chunks in between (one per chunk), and both must still come out as they do alone.
TEST(ServeEngine, ALongPromptIsPrefilledBetweenDecodeSteps) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  EngineOptions eo{4, 0, 2};
  eo.prefill_chunk = 8;
  CompletionEngine engine(*model, nullptr, eo);
  CompletionJob running_job;
  // A whole chunk, so that its prefill spends its loop's budget: with budget left over, the loop
  // would take the long prompt too when it arrives in time (a race), starting it with a partial
  // chunk (one chunk more in all).
  running_job.prompt = kPrompt;
  running_job.prompt.resize(8, 77);
  running_job.max_tokens = 400;
  running_job.sampling = {0.0f, 0, 1.0f};
  running_job.sampling.logit_bias = {{1, -100.0f}};  // no EOS
  CompletionJob long_job;
  for (int t = 0; t < 240; ++t) long_job.prompt.push_back(int32_t(4 + (t * 29) % 500));
  long_job.max_tokens = 3;
  long_job.sampling = {0.0f, 0, 1.0f};
  const int64_t chunks = (240 + 7) / 8;

  std::vector<CompletionEngine::Ticket> first = engine.submit({running_job});
  // (when the engine produced them, tokens) of the running completion's chunks
  std::vector<std::pair<std::chrono::steady_clock::time_point, int64_t>> running_chunks;
  std::optional<std::chrono::steady_clock::time_point> long_first_token;
  std::thread long_thread;
  CompletionResult long_result;
  const CompletionResult running_result = engine.wait(first[0], [&](const CompletionChunk& c) {
    running_chunks.emplace_back(c.produced_at, int64_t(c.ids.size()));
    if (running_chunks.size() == 1)
      long_thread = std::thread([&] {
        std::vector<CompletionEngine::Ticket> t = engine.submit({long_job});
        long_result = engine.wait(t[0], [&](const CompletionChunk& lc) {
          if (!lc.ids.empty() && !long_first_token) long_first_token = lc.produced_at;
          return true;
        });
      });
    return true;
  });
  long_thread.join();
  ASSERT_TRUE(long_first_token.has_value());
  // The chunks of the long prompt alternate with decode steps of the running completion, so, in
  // the engine's order, it had gained a token per chunk before the long prompt's first token.
  int64_t before_long_first_token = 0;
  for (const auto& [produced_at, tokens] : running_chunks)
    if (produced_at < *long_first_token) before_long_first_token += tokens;
  EXPECT_GE(before_long_first_token, chunks) << chunks << " chunks";
  EXPECT_EQ(engine.stats().prefill_chunks, 1 + chunks);
  auto quiet = [](const CompletionChunk&) { return true; };
  EXPECT_EQ(running_result.ids, run_completion(*model, nullptr, running_job, quiet).ids);
  EXPECT_EQ(long_result.ids, run_completion(*model, nullptr, long_job, quiet).ids);
}

// A job the context cannot hold is refused with a 400 (the request parser checks it first; the
// engine does not rely on that).
TEST(ServeEngine, AJobLongerThanTheContextIsA400) {
  auto be = make_cpu_backend();
  auto model = tiny_model(*be);
  CompletionEngine engine(*model, nullptr, EngineOptions{4, 0, 2});
  CompletionJob j;
  j.prompt = kPrompt;
  j.max_tokens = model->config().max_position_embeddings;
  try {
    engine.run(j);
    FAIL() << "expected a 400";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("must fit the model's context"), std::string::npos) << e.what();
  }
  j.max_tokens = 2;
  EXPECT_EQ(engine.run(j).ids.size(), 2u) << "the engine carries on";

  // A server context shorter than the model's: its decode states are that long, and jobs must
  // fit it; one longer than the model's is refused at start.
  EngineOptions short_context{4, 0, 2};
  short_context.context = 16;
  CompletionEngine small(*model, nullptr, short_context);
  EXPECT_EQ(small.context(), 16);
  EXPECT_LT(small.decode_state_bytes(), engine.decode_state_bytes() / 32);
  j.max_tokens = 16 - int64_t(kPrompt.size());
  EXPECT_EQ(small.run(j).ids.size() + kPrompt.size(), 16u);
  j.max_tokens += 1;
  try {
    small.run(j);
    FAIL() << "expected a 400";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(std::string(e.what()).find("must fit the model's context of 16"), std::string::npos)
        << e.what();
  }
  short_context.context = model->config().max_position_embeddings + 1;
  EXPECT_THROW(CompletionEngine(*model, nullptr, short_context), Error);
}

}  // namespace
}  // namespace zaya
