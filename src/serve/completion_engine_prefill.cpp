// The completion engine's prefill (completion_engine.h): completions taken from the queue form a
// group whose prompts run together in the batch's free sequences, each from the kept state that
// holds most of it, and join the decoding batch as their prompts finish.
#include <algorithm>

#include "core/error.h"
#include "serve/api_error.h"
#include "serve/completion_engine_parts.h"

namespace zaya {

namespace {
CompletionResult cancelled_result(const CompletionJob& in, double queue_seconds) {
  CompletionResult r;
  r.prompt_tokens = int64_t(in.prompt.size());
  r.finish_reason = "cancelled";
  r.queue_seconds = queue_seconds;
  return r;
}
}  // namespace

// Checks the job and sets up its completion; returns it as a group member to be, or null when
// the job ended at once (cancelled, refused, or nothing to run on the model).
std::unique_ptr<CompletionEngine::Member> CompletionEngine::begin(const std::shared_ptr<Job>& job) {
  auto m = std::make_unique<Member>();
  Running& r = m->r;
  r.job = job;
  r.started = EngineClock::now();
  r.queue_seconds = seconds_between(job->queued_at, r.started);
  try {
    const CompletionJob& in = job->in;
    const int64_t need = int64_t(in.prompt.size()) + in.max_tokens;
    if (in.prompt.empty() || need > context_)
      throw ApiError(400, "invalid_request_error",
                     "the prompt's " + std::to_string(in.prompt.size()) + " tokens + max_tokens " +
                         std::to_string(in.max_tokens) + " must fit the model's context of " +
                         std::to_string(context_));
    if (job->cancelled || stopping_) {
      deliver(*job, cancelled_result(in, r.queue_seconds));
      return nullptr;
    }
    r.run = std::make_unique<CompletionRun>(model_.config(), tok_, in, [job, this](CompletionChunk chunk) {
      chunk.produced_at = EngineClock::now();
      {
        std::lock_guard lk(job->m);
        job->chunks.push_back(std::move(chunk));
      }
      job->cv.notify_all();
      return !job->cancelled && !stopping_;
    });
    if (!r.run->needs_model()) {
      CompletionResult result = r.run->finish();
      result.queue_seconds = r.queue_seconds;
      deliver(*job, std::move(result));
      return nullptr;
    }
    m->logits.resize(size_t(model_.config().vocab_size));
    return m;
  } catch (const ApiError& e) {
    deliver_error(*job, e.status(), e.type(), e.what());
  } catch (const std::exception& e) {
    deliver_error(*job, 500, "server_error", std::string("internal error: ") + e.what());
  }
  return nullptr;
}

// Takes completions from the queue (first the one held back) while the batch has room for
// them: a completion of the same prompt as a member follows it; one whose prompt extends a
// member's (a conversation's next turn sent while the turn before decodes) is held back to
// start the next group, from the state this one keeps; and one that reports its prompt's
// logprobs is prefilled alone. Returns whether it took any (the group may still be
// empty: they may all have ended at once).
bool CompletionEngine::form_group() {
  std::vector<Member> members;
  int64_t room = opt_.max_batch - int64_t(running_.size());
  bool took = false;
  while (room > 0) {
    std::unique_ptr<Member> m = std::move(held_);
    if (!m) {
      std::shared_ptr<Job> next;
      {
        std::lock_guard lk(mu_);
        if (stopping_ || queue_.empty()) break;
        next = std::move(queue_.front());
        queue_.pop_front();
      }
      took = true;
      m = begin(next);
      if (!m) continue;
    }
    took = true;
    const bool echo = bool(m->r.run->prompt_logits());
    const std::vector<int32_t>& prompt = m->r.job->in.prompt;
    // A longer prompt that begins with o's, which o's prefill will leave kept.
    auto extends = [&](const Member& o) {
      return !o.r.run->prompt_logits() && o.prompt_size() < int64_t(prompt.size()) &&
             begins_with(prompt, o.r.job->in.prompt) &&
             kept_->entry_bytes(o.prompt_size()) <= kept_->budget();
    };
    if (!members.empty() && (echo || std::any_of(members.begin(), members.end(), extends))) {
      held_ = std::move(m);  // it starts the next group, from the state this one keeps
      break;
    }
    --room;
    if (!echo) {
      auto same = std::find_if(members.begin(), members.end(), [&](const Member& o) {
        return !o.r.run->prompt_logits() && o.r.job->in.prompt == prompt;
      });
      if (same != members.end()) {
        same->followers.push_back(std::move(m->r));
        continue;
      }
    }
    members.push_back(std::move(*m));
    if (echo) break;
  }
  if (!members.empty()) place_group(std::move(members));
  return took;
}

// Gives the members their sequences, the highest free ones, in ascending order of the
// positions each has left to run once it starts from the kept state holding most of its
// prompt (copied in); then the members with nothing left to run join the batch.
void CompletionEngine::place_group(std::vector<Member> members) {
  for (Member& m : members) {
    if (m.echo || m.r.run->prompt_logits()) continue;  // runs its whole prompt, reporting every position
    m.kept = kept_->longest_prefix(m.r.job->in.prompt);
    if (!m.kept) continue;
    m.start = int64_t(m.kept->tokens.size());
    m.continues_finished = m.kept->source == KeptStates::Source::completion;
  }
  auto assign = [&] {
    std::stable_sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
      return a.prompt_size() - a.start < b.prompt_size() - b.start;
    });
    for (size_t i = 0; i < members.size(); ++i) members[i].seq = opt_.max_batch - int64_t(members.size() - i);
  };
  assign();
  try {
    try {
      for (Member& m : members) {
        if (!m.kept) {
          batch_->reset_sequence(m.seq);
          continue;
        }
        batch_->copy_sequence(*m.kept->state, 0, m.seq);
        kept_->touch(m.kept);
        if (m.start == m.prompt_size()) m.logits = m.kept->logits;
      }
    } catch (const std::exception&) {  // a copy failed (a GPU error): every member runs its whole prompt
      for (Member& m : members) {
        m.start = 0;
        m.kept = nullptr;
        m.continues_finished = false;
      }
      assign();
      for (Member& m : members) batch_->reset_sequence(m.seq);
    }
    for (Member& m : members) {
      m.kept = nullptr;  // valid only until the next keep()
      if (PromptLogitsFn report = m.r.run->prompt_logits())
        m.echo = std::make_unique<PromptPrefill>(model_, m.r.job->in.prompt, *batch_, m.logits.data(),
                                                 std::move(report), m.seq);
    }
  } catch (const std::exception& e) {
    group_ = std::move(members);
    fail_group(e.what());
    return;
  }
  group_ = std::move(members);
  finish_prefilled();
}

// Runs the next positions of the group's prompts (at most max_positions in all) in one forward
// pass, or one chunk of a prompt prefilled alone, and returns how many ran; then the members
// whose prompts have all run join the batch.
int64_t CompletionEngine::advance_group(int64_t max_positions) {
  drop_cancelled();
  if (group_.empty()) return 0;
  int64_t ran = 0;
  try {
    if (group_.front().echo) {  // alone in its group
      PromptPrefill& p = *group_.front().echo;
      ran = std::min(max_positions, p.remaining());
      {
        std::lock_guard lk(mu_);
        stats_.prefill_positions += ran;  // given to the model, whether or not the chunk succeeds
        stats_.peak_prefill_group = std::max<int64_t>(stats_.peak_prefill_group, 1);
      }
      p.run(ran);
      group_.front().ran = true;
      std::lock_guard lk(mu_);
      stats_.prefill_chunks += (ran + kPromptLogitsChunk - 1) / kPromptLogitsChunk;  // its passes
    } else {
      // The first member has the fewest positions left, r. A pass runs T = r positions of as
      // many members as the budget holds, so that it finishes the first (and any other with r
      // left) while running as many rows as it can; when r exceeds the budget, the first alone
      // runs the budget. Shortest first brings the first tokens soonest, and a pass over a
      // prefix of the members keeps their order.
      int64_t T = group_.front().left_to_run(*batch_), B = 1;
      if (T >= max_positions)
        T = max_positions;
      else
        B = std::min(int64_t(group_.size()), max_positions / T);
      for (int64_t b = 0; b < B; ++b)
        ZAYA_CHECK(
            group_[size_t(b)].left_to_run(*batch_) >= T && group_[size_t(b)].seq == group_.front().seq + b,
            "the prefill group is out of order");
      std::vector<int32_t> ids(size_t(B * T));
      for (int64_t b = 0; b < B; ++b) {
        const Member& m = group_[size_t(b)];
        const int32_t* from = m.r.job->in.prompt.data() + batch_->pos[size_t(m.seq)];
        std::copy(from, from + T, ids.begin() + b * T);
      }
      ran = B * T;
      {
        std::lock_guard lk(mu_);
        stats_.prefill_positions += ran;
        stats_.peak_prefill_group = std::max(stats_.peak_prefill_group, B);
      }
      ForwardOutputs last;
      last.logits = prefill_logits_.data();
      last.last_only = true;
      model_.forward(ids.data(), B, T, batch_.get(), last, nullptr, group_.front().seq);
      const int64_t V = model_.config().vocab_size;
      for (int64_t b = 0; b < B; ++b) {
        Member& m = group_[size_t(b)];
        m.ran = true;
        if (m.left_to_run(*batch_) == 0) std::copy_n(prefill_logits_.data() + b * V, V, m.logits.data());
      }
      std::lock_guard lk(mu_);
      ++stats_.prefill_chunks;
    }
  } catch (const std::exception& e) {
    fail_group(e.what());
    return ran;
  }
  finish_prefilled();
  return ran;
}

// The members at the front whose prompts have all run leave the group: their followers, then
// they themselves, sample their first tokens and join the batch. The prompt's state is kept.
void CompletionEngine::finish_prefilled() {
  while (!group_.empty() && group_.front().left_to_run(*batch_) == 0) {
    Member m = std::move(group_.front());
    group_.erase(group_.begin());
    const std::vector<int32_t>& prompt = m.r.job->in.prompt;
    if (m.ran) {
      try {
        kept_->keep(prompt, *batch_, m.seq, m.logits.data(), KeptStates::Source::prompt);
      } catch (const std::exception&) {  // not kept: nothing else changes
      }
    }
    {
      std::lock_guard lk(mu_);
      if (m.ran)
        stats_.prefill_positions_reused += m.start;
      else
        ++stats_.prefills_reused;
      stats_.prefills_reused += int64_t(m.followers.size());
      if (m.continues_finished) ++stats_.finished_continued;
      stats_.kept = int64_t(kept_->size());
      stats_.kept_bytes = kept_->bytes();
    }
    // The followers' sequences lie below the member's: placing a group leaves a free sequence
    // below it for every follower, and the batch only shrinks meanwhile.
    for (Running& f : m.followers) join_batch(std::move(f), m.logits.data(), m.seq);
    join_batch(std::move(m.r), m.logits.data(), m.seq);
  }
}

// A completion whose prompt's state is in sequence from_seq (at or above the running ones)
// samples its first token from the logits after the prompt and, unless that ends it, becomes
// the batch's next running completion with a copy of that state (none when it is there already).
void CompletionEngine::join_batch(Running r, const float* logits, int64_t from_seq) {
  try {
    if (r.job->cancelled || stopping_) {
      deliver(*r.job, cancelled_result(r.job->in, r.queue_seconds));
      return;
    }
    r.decode_start = EngineClock::now();
    r.prefill_seconds = seconds_between(r.started, r.decode_start);
    r.next = r.run->step(logits);
    {
      std::lock_guard lk(mu_);
      stats_.first_token_seconds.add(seconds_between(r.job->queued_at, r.decode_start));
    }
    if (r.next < 0) {
      CompletionResult result = r.run->finish();
      result.queue_seconds = r.queue_seconds;
      result.prefill_seconds = r.prefill_seconds;
      deliver(*r.job, std::move(result));
      return;
    }
    const int64_t to = int64_t(running_.size());
    ZAYA_CHECK(to <= from_seq, "a prefilled prompt's sequence lies among the running ones");
    batch_->copy_sequence(*batch_, from_seq, to);
    running_.push_back(std::move(r));
  } catch (const ApiError& e) {
    deliver_error(*r.job, e.status(), e.type(), e.what());
  } catch (const std::exception& e) {
    deliver_error(*r.job, 500, "server_error", std::string("internal error: ") + e.what());
  }
}

// Cancelled followers end; a cancelled member at either end of the group, with no follower
// left, ends too (one in between is prefilled with the others and ends when it would join), and
// so does a cancelled completion held back for the next group.
void CompletionEngine::drop_cancelled() {
  auto gone = [&](const Running& r) { return r.job->cancelled || stopping_; };
  if (held_ && gone(held_->r)) {
    deliver(*held_->r.job, cancelled_result(held_->r.job->in, held_->r.queue_seconds));
    held_.reset();
  }
  for (Member& m : group_) {
    auto keep_end = std::stable_partition(m.followers.begin(), m.followers.end(),
                                          [&](const Running& f) { return !gone(f); });
    for (auto it = keep_end; it != m.followers.end(); ++it)
      deliver(*it->job, cancelled_result(it->job->in, it->queue_seconds));
    m.followers.erase(keep_end, m.followers.end());
  }
  auto droppable = [&](const Member& m) { return gone(m.r) && m.followers.empty(); };
  while (!group_.empty() && droppable(group_.back())) {
    deliver(*group_.back().r.job, cancelled_result(group_.back().r.job->in, group_.back().r.queue_seconds));
    group_.pop_back();
  }
  while (!group_.empty() && droppable(group_.front())) {
    deliver(*group_.front().r.job,
            cancelled_result(group_.front().r.job->in, group_.front().r.queue_seconds));
    group_.erase(group_.begin());
  }
}

// A pass over the group failed: its sequences are in no known state, so every completion in it
// fails (the others carry on).
void CompletionEngine::fail_group(const std::string& message) {
  for (Member& m : group_) {
    for (Running& f : m.followers) deliver_error(*f.job, 500, "server_error", "internal error: " + message);
    deliver_error(*m.r.job, 500, "server_error", "internal error: " + message);
  }
  group_.clear();
}

// Completions being prefilled or waiting to start the next group.
int64_t CompletionEngine::in_prefill() const {
  int64_t n = held_ ? 1 : 0;
  for (const Member& m : group_) n += 1 + int64_t(m.followers.size());
  return n;
}

}  // namespace zaya
