// Multiple-choice accuracy by continuation log-likelihood (see multiple_choice.h).
#include "eval/multiple_choice.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace zaya {

using json = nlohmann::json;

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

[[noreturn]] void bad_line(const std::string& where, const std::string& what) {
  fail("eval", where + ": " + what);
}

// `flag` is the CLI option that renames the field.
const json& required_field(const json& line, const std::string& name, const char* flag,
                           const std::string& where) {
  auto it = line.find(name);
  if (it == line.end() || it->is_null())
    bad_line(where,
             "no \"" + name + "\" field (" + flag + " names the field if the file calls it otherwise)");
  return *it;
}

}  // namespace

double proportion_stderr(double p, int64_t n) { return n > 1 ? std::sqrt(p * (1 - p) / double(n - 1)) : 0.0; }

std::vector<ChoiceQuestion> load_choice_questions(const std::string& path, const ChoiceFields& fields) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("eval", "cannot open " + path);
  std::vector<ChoiceQuestion> out;
  std::string text;
  for (int64_t line_no = 1; std::getline(in, text); ++line_no) {
    if (std::all_of(text.begin(), text.end(), is_ascii_space)) continue;
    const std::string where = path + ":" + std::to_string(line_no);
    json line;
    try {
      line = json::parse(text);
    } catch (const json::exception& e) {
      bad_line(where, std::string("not JSON (") + e.what() + ")");
    }
    if (!line.is_object()) bad_line(where, "expected a JSON object, got " + line.dump().substr(0, 60));
    ChoiceQuestion q;
    const json& context = required_field(line, fields.context, "--context-field", where);
    if (!context.is_string()) bad_line(where, "\"" + fields.context + "\": expected a string");
    q.context = context.get<std::string>();
    const json& choices = required_field(line, fields.choices, "--choices-field", where);
    if (!choices.is_array() || choices.size() < 2)
      bad_line(where, "\"" + fields.choices + "\": expected an array of at least 2 strings");
    for (size_t i = 0; i < choices.size(); ++i) {
      if (!choices[i].is_string())
        bad_line(where, "\"" + fields.choices + "\"[" + std::to_string(i) + "]: expected a string, got " +
                            choices[i].dump().substr(0, 60));
      q.choices.push_back(choices[i].get<std::string>());
    }
    const json& answer = required_field(line, fields.answer, "--answer-field", where);
    if (!answer.is_number_integer() || answer.get<int64_t>() < 0 ||
        answer.get<int64_t>() >= int64_t(q.choices.size()))
      bad_line(where, "\"" + fields.answer +
                          "\": expected the index of the right choice, an integer in [0, " +
                          std::to_string(q.choices.size()) + "), got " + answer.dump().substr(0, 60));
    q.answer = answer.get<int64_t>();
    out.push_back(std::move(q));
  }
  if (in.bad()) fail("eval", "cannot read " + path);
  if (out.empty()) fail("eval", path + " holds no questions (expected one JSON object per line)");
  return out;
}

ChoiceTokens tokenize_choice(const Tokenizer& tokenizer, const std::string& context,
                             const std::string& choice) {
  size_t keep = context.size();
  while (keep > 0 && is_ascii_space(context[keep - 1])) --keep;
  const std::string head = context.substr(0, keep);
  const std::string continuation = context.substr(keep) + choice;
  ChoiceTokens t;
  t.ids = tokenizer.encode(head, /*add_special=*/true);
  const size_t head_tokens = t.ids.size();
  if (t.ids.empty()) {
    // Nothing to condition the first choice token on: start from EOS, the document boundary.
    if (tokenizer.eos_id() < 0)
      fail("eval", "the context is empty and the tokenizer has neither BOS nor EOS to start from");
    t.ids.push_back(tokenizer.eos_id());
  }
  t.context_tokens = int64_t(t.ids.size());
  const std::vector<int32_t> whole = tokenizer.encode(head + continuation, /*add_special=*/true);
  if (whole.size() > head_tokens)
    t.ids.insert(t.ids.end(), whole.begin() + std::ptrdiff_t(head_tokens), whole.end());
  if (int64_t(t.ids.size()) == t.context_tokens)
    fail("eval", "the choice " + json(choice).dump().substr(0, 60) + " adds no tokens to its context");
  t.choice_bytes = int64_t(continuation.size());
  return t;
}

MultipleChoiceResult evaluate_multiple_choice(Model& model, const Tokenizer& tokenizer,
                                              const std::vector<ChoiceQuestion>& questions,
                                              const MultipleChoiceOptions& o) {
  const int64_t vocab = model.config().vocab_size, window = model.config().max_position_embeddings;
  const int64_t total = o.max_questions > 0 ? std::min<int64_t>(o.max_questions, int64_t(questions.size()))
                                            : int64_t(questions.size());
  if (total == 0) fail("eval", "no questions to score");
  if (o.shards < 1 || o.shard < 0 || o.shard >= o.shards)
    fail("eval", "shard " + std::to_string(o.shard) + " of " + std::to_string(o.shards) + " does not exist");
  const auto started = std::chrono::steady_clock::now();
  MultipleChoiceResult r;
  std::vector<int32_t> inputs, targets;
  for (int64_t qi = o.shard; qi < total; qi += o.shards) {
    const ChoiceQuestion& q = questions[size_t(qi)];
    const std::string which = "question " + std::to_string(qi + 1);
    if (q.choices.size() < 2 || q.answer < 0 || q.answer >= int64_t(q.choices.size()))
      fail("eval", which + ": needs at least 2 choices and an answer among them");
    // Every choice of the question in one forward pass: row ci holds its inputs, right-padded
    // to the longest row; padding comes after every counted position, so the causal model
    // scores each row as it would alone.
    QuestionResult qr;
    std::vector<std::vector<int32_t>> rows;
    std::vector<std::vector<int32_t>> row_targets;
    for (size_t ci = 0; ci < q.choices.size(); ++ci) {
      ChoiceTokens t;
      try {
        t = tokenize_choice(tokenizer, q.context, q.choices[ci]);
      } catch (const Error& e) {
        fail("eval", which + ", choice " + std::to_string(ci) + ": " + e.what());
      }
      for (int32_t id : t.ids)
        if (id < 0 || id >= vocab)
          fail("eval",
               which + ": the tokenizer gave id " + std::to_string(id) +
                   ", outside the model's vocabulary [0, " + std::to_string(vocab) + ")",
               "is this the model's own tokenizer?");
      const int64_t continuation = int64_t(t.ids.size()) - t.context_tokens;
      // Inputs are every id but the last; keep the last `window` of them (the context's tail).
      int64_t first = 0;
      if (int64_t(t.ids.size()) - 1 > window) {
        if (continuation > window)
          fail("eval", which + ", choice " + std::to_string(ci) + ": its " + std::to_string(continuation) +
                           " tokens do not fit the model's context of " + std::to_string(window));
        first = int64_t(t.ids.size()) - 1 - window;
        ++r.truncated;
      }
      const int64_t T = int64_t(t.ids.size()) - 1 - first;
      rows.emplace_back(t.ids.begin() + first, t.ids.begin() + first + T);
      row_targets.emplace_back(size_t(T), -1);
      for (int64_t p = t.context_tokens - 1; p < int64_t(t.ids.size()) - 1; ++p)
        row_targets.back()[size_t(p - first)] = t.ids[size_t(p + 1)];
      qr.choices.push_back({0.0, continuation, t.choice_bytes});
    }
    const int64_t B = int64_t(rows.size());
    int64_t T = 0;
    for (const auto& row : rows) T = std::max(T, int64_t(row.size()));
    inputs.assign(size_t(B * T), 0);
    targets.assign(size_t(B * T), -1);
    for (int64_t b = 0; b < B; ++b) {
      std::copy(rows[size_t(b)].begin(), rows[size_t(b)].end(), inputs.begin() + b * T);
      std::copy(row_targets[size_t(b)].begin(), row_targets[size_t(b)].end(), targets.begin() + b * T);
    }
    std::vector<double> row_loss(size_t(B), 0.0);
    double loss_sum = 0;
    int64_t counted = 0;
    ForwardOutputs out;
    out.targets = targets.data();
    out.loss_sum = &loss_sum;
    out.loss_tokens = &counted;
    out.row_loss_sums = row_loss.data();
    model.forward(inputs.data(), B, T, nullptr, out);
    for (int64_t b = 0; b < B; ++b) qr.choices[size_t(b)].logprob = -row_loss[size_t(b)];
    for (size_t ci = 1; ci < qr.choices.size(); ++ci) {
      const ChoiceScore &c = qr.choices[ci], &best = qr.choices[size_t(qr.predicted)],
                        &best_norm = qr.choices[size_t(qr.predicted_norm)];
      if (c.logprob > best.logprob) qr.predicted = int64_t(ci);
      if (c.logprob / double(std::max<int64_t>(c.bytes, 1)) >
          best_norm.logprob / double(std::max<int64_t>(best_norm.bytes, 1)))
        qr.predicted_norm = int64_t(ci);
    }
    r.choices += int64_t(q.choices.size());
    r.correct += qr.predicted == q.answer;
    r.correct_norm += qr.predicted_norm == q.answer;
    r.per_question.push_back(std::move(qr));
    ++r.questions;
    if (o.progress) o.progress(r.questions, total, double(r.correct) / double(r.questions));
  }
  if (r.questions > 0) {
    r.accuracy = double(r.correct) / double(r.questions);
    r.accuracy_norm = double(r.correct_norm) / double(r.questions);
  }
  r.accuracy_stderr = proportion_stderr(r.accuracy, r.questions);
  r.accuracy_norm_stderr = proportion_stderr(r.accuracy_norm, r.questions);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return r;
}

}  // namespace zaya
