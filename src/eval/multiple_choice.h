// Multiple-choice evaluation (`zaya eval --choices FILE.jsonl`): for each question, the model's
// log-likelihood of every choice as a continuation of the context; the question counts as right
// when the answer is the likeliest choice (accuracy) and, separately, when it is the likeliest
// per UTF-8 byte of the choice's text (normalised accuracy, which does not favour short
// choices). The benchmarks of this shape (cloze and multiple-choice sets such as HellaSwag, ARC,
// PIQA) become one JSONL file each, with no Python harness.
//
// Tokenization follows the usual continuation scoring: whitespace that ends the context moves
// to the start of the choice, the context is encoded with the tokenizer's special tokens (BOS),
// and the continuation is what encoding context + choice adds past the context's ids, so that a
// choice is tokenized as it would be in running text.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/model.h"

namespace zaya {

struct ChoiceQuestion {
  std::string context;
  std::vector<std::string> choices;  // at least 2
  int64_t answer = 0;                // index into choices
};

struct ChoiceFields {  // the JSONL field names
  std::string context = "context", choices = "choices", answer = "answer";
};

// One question per non-empty line: {"context": str, "choices": [str, ...], "answer": int}.
// Errors name the file, the line and the field.
std::vector<ChoiceQuestion> load_choice_questions(const std::string& path, const ChoiceFields& fields = {});

// The ids one choice is scored on: context ids, then the continuation's.
struct ChoiceTokens {
  std::vector<int32_t> ids;
  int64_t context_tokens = 0;  // ids[context_tokens ..] is the continuation (non-empty)
  int64_t choice_bytes = 0;    // UTF-8 bytes of the continuation's text (moved whitespace included)
};
// Throws zaya::Error when the choice adds no tokens, or the context gives none to condition on
// (no BOS and an empty context).
ChoiceTokens tokenize_choice(const Tokenizer& tokenizer, const std::string& context,
                             const std::string& choice);

struct ChoiceScore {
  double logprob = 0;  // sum of log p(continuation token | everything before it)
  int64_t tokens = 0;
  int64_t bytes = 0;
};

struct QuestionResult {
  std::vector<ChoiceScore> choices;
  int64_t predicted = 0, predicted_norm = 0;  // likeliest choice, and likeliest per byte (first on ties)
};

struct MultipleChoiceResult {
  int64_t questions = 0, choices = 0, correct = 0, correct_norm = 0;  // this shard's
  double accuracy = 0, accuracy_norm = 0;
  double accuracy_stderr = 0, accuracy_norm_stderr = 0;  // sample standard error of the mean
  int64_t truncated = 0;                                 // choices whose context was cut on the left to fit
  double seconds = 0;
  std::vector<QuestionResult> per_question;  // the questions this shard scored, in order
};

// Standard error of a proportion p measured over n samples: the sample standard deviation over
// sqrt(n) (0 for n < 2).
double proportion_stderr(double p, int64_t n);

struct MultipleChoiceOptions {
  int64_t max_questions = 0;  // 0 = all
  // Data-parallel evaluation: this call scores questions q with q % shards == shard (of the
  // first max_questions); the counts of all shards add up to the whole set's.
  int64_t shard = 0, shards = 1;
  // Called after every question: questions done, questions in all, running accuracy.
  std::function<void(int64_t done, int64_t total, double accuracy)> progress;
};

// Scores every choice with the model (fresh sequences, at most the model's context: a longer one
// keeps its context's last tokens). Throws zaya::Error naming the question for an answer out of
// range, a choice that tokenizes to nothing, or ids outside the model's vocabulary.
MultipleChoiceResult evaluate_multiple_choice(Model& model, const Tokenizer& tokenizer,
                                              const std::vector<ChoiceQuestion>& questions,
                                              const MultipleChoiceOptions& options = {});

}  // namespace zaya
