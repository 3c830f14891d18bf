// `zaya eval --model DIR --data PATH...`: held-out loss and perplexity of a model on a shard
// directory's split, a token file or text files (src/eval/). Text inputs also report bits per
// byte, which compares models with different tokenizers. `zaya eval --model DIR --choices
// FILE.jsonl`: multiple-choice accuracy by continuation log-likelihood.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "eval/eval_data.h"
#include "eval/multiple_choice.h"
#include "eval/perplexity.h"
#include "model/model_io.h"
#include "model_source.h"

namespace zaya::cli {

namespace {

struct EvalCliOptions {
  std::string model_dir, tokenizer, backend = "cpu", out, split = "val", text_field = "text";
  std::string prompt_field, completion_field, messages_field, chat_template;
  bool reset_documents = false;
  std::vector<std::string> data;
  int64_t seq_len = 1024, batch = 4, max_tokens = 0;
  std::string choices;  // multiple choice instead of --data
  ChoiceFields fields;
  int64_t max_questions = 0;
};

void write_json(const nlohmann::json& j, const std::string& path) {
  std::ofstream f(path);
  f << j.dump(2) << '\n';
  if (!f) fail("eval", "cannot write " + path);
}

void run_choice_eval(const EvalCliOptions& o, Model& model, const Tokenizer* tok) {
  if (!tok)
    fail("eval",
         "--choices scores text and needs a tokenizer: pass --tokenizer, or keep tokenizer.json or "
         "tokenizer.model in the model directory");
  const std::vector<ChoiceQuestion> questions = load_choice_questions(o.choices, o.fields);
  std::fprintf(stderr, "[zaya] evaluating %s on %s: %zu questions\n", o.model_dir.c_str(), o.choices.c_str(),
               questions.size());
  MultipleChoiceOptions mo;
  mo.max_questions = o.max_questions;
  const bool tty = isatty(2);
  mo.progress = [tty](int64_t done, int64_t total, double accuracy) {
    if (tty)
      std::fprintf(stderr, "\r\033[K%lld/%lld questions | accuracy %.4f", (long long)done, (long long)total,
                   accuracy);
  };
  const MultipleChoiceResult r = evaluate_multiple_choice(model, *tok, questions, mo);
  if (tty) std::fprintf(stderr, "\r\033[K");
  std::printf("questions         %lld (%lld choices)\n", (long long)r.questions, (long long)r.choices);
  std::printf("accuracy          %.4f +- %.4f (the likeliest choice)\n", r.accuracy, r.accuracy_stderr);
  std::printf("accuracy (norm)   %.4f +- %.4f (the likeliest per byte of the choice)\n", r.accuracy_norm,
              r.accuracy_norm_stderr);
  if (r.truncated > 0)
    std::printf("truncated         %lld choices kept only their context's last %lld tokens\n",
                (long long)r.truncated, (long long)model.config().max_position_embeddings);
  std::printf("speed             %.1f choices/s (%.2f s)\n", double(r.choices) / r.seconds, r.seconds);
  if (o.out.empty()) return;
  nlohmann::json predictions = nlohmann::json::array();
  for (size_t i = 0; i < r.per_question.size(); ++i) {
    const QuestionResult& q = r.per_question[i];
    nlohmann::json logprobs = nlohmann::json::array(), tokens = nlohmann::json::array();
    for (const ChoiceScore& c : q.choices) {
      logprobs.push_back(c.logprob);
      tokens.push_back(c.tokens);
    }
    predictions.push_back({{"answer", questions[i].answer},
                           {"predicted", q.predicted},
                           {"predicted_norm", q.predicted_norm},
                           {"logprobs", std::move(logprobs)},
                           {"tokens", std::move(tokens)}});
  }
  write_json({{"model", o.model_dir},
              {"data", o.choices},
              {"questions", r.questions},
              {"choices", r.choices},
              {"accuracy", r.accuracy},
              {"accuracy_stderr", r.accuracy_stderr},
              {"accuracy_norm", r.accuracy_norm},
              {"accuracy_norm_stderr", r.accuracy_norm_stderr},
              {"truncated", r.truncated},
              {"seconds", r.seconds},
              {"predictions", std::move(predictions)}},
             o.out);
}

void run_eval(const EvalCliOptions& o) {
  if (o.data.empty() == o.choices.empty())
    fail("eval",
         "give --data (held-out loss and perplexity) or --choices (multiple-choice accuracy), one of them");
  auto be = make_backend(o.backend);
  auto model = load_model(o.model_dir, *be);
  be->set_weights_frozen(true);
  auto tok = find_tokenizer(o.tokenizer, o.model_dir);
  if (!o.choices.empty()) {
    run_choice_eval(o, *model, tok.get());
    return;
  }
  EvalDataOptions dopt;
  dopt.split = o.split;
  dopt.text_field = o.text_field;
  dopt.prompt_field = o.prompt_field;
  dopt.completion_field = o.completion_field;
  dopt.messages_field = o.messages_field;
  dopt.chat_template = o.chat_template;
  const EvalTokens data = load_eval_tokens(o.data, tok.get(), dopt);
  const int64_t context = model->config().max_position_embeddings;
  if (context > 0 && o.seq_len > context)
    fail("eval", "--seq-len " + std::to_string(o.seq_len) + " exceeds the model's context (" +
                     std::to_string(context) + ")");
  std::fprintf(stderr, "[zaya] evaluating %s on %s: %zu tokens, %llu documents, windows of %lld tokens%s\n",
               o.model_dir.c_str(), data.description.c_str(), data.tokens.size(),
               (unsigned long long)data.documents, (long long)o.seq_len,
               o.reset_documents ? ", each document a fresh sequence" : "");
  PerplexityOptions po;
  po.seq_len = o.seq_len;
  po.batch = o.batch;
  po.max_tokens = o.max_tokens;
  if (!data.target_mask.empty()) po.target_mask = &data.target_mask;
  if (o.reset_documents) {
    if (!data.has_document_boundaries)
      fail("eval",
           "--reset-at-document-boundary needs document boundaries: " + data.description +
               " has none recorded",
           "score a shard directory or text files instead of a flat token file");
    po.document_starts = &data.document_starts;
  }
  const bool tty = isatty(2);
  po.progress = [tty](int64_t scored, int64_t total, double loss) {
    if (tty)
      std::fprintf(stderr, "\r\033[K%lld/%lld tokens | loss %.4f", (long long)scored, (long long)total, loss);
  };
  const PerplexityResult r = evaluate_perplexity(*model, data.tokens, po);
  if (tty) std::fprintf(stderr, "\r\033[K");
  std::printf("tokens scored     %lld (%lld windows of up to %lld)\n", (long long)r.scored_tokens,
              (long long)r.windows, (long long)o.seq_len);
  std::printf("loss              %.4f nats/token\n", r.loss);
  std::printf("perplexity        %.3f\n", r.perplexity);
  // Bits per byte only when every scored token belongs to the text whose bytes were counted.
  const bool whole_text = data.text_bytes > 0 && o.max_tokens == 0;
  const double bpb = whole_text ? r.loss_sum / std::log(2.0) / double(data.text_bytes) : 0;
  if (whole_text)
    std::printf("bits per byte     %.4f (%llu bytes of text)\n", bpb, (unsigned long long)data.text_bytes);
  std::printf("speed             %.0f tokens/s (%.2f s)\n", double(r.scored_tokens) / r.seconds, r.seconds);
  if (!o.out.empty()) {
    nlohmann::json j{
        {"model", o.model_dir},       {"data", data.description},  {"loss", r.loss},
        {"perplexity", r.perplexity}, {"tokens", r.scored_tokens}, {"windows", r.windows},
        {"seq_len", o.seq_len},       {"seconds", r.seconds},      {"documents", data.documents}};
    if (whole_text) j["bits_per_byte"] = bpb;
    if (o.reset_documents) j["reset_at_document_boundary"] = true;
    write_json(j, o.out);
  }
}

}  // namespace

void add_eval(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "eval",
      "Held-out loss and perplexity on shards, a token file or text files; or multiple-choice accuracy");
  static EvalCliOptions o;
  cmd->add_option("--model", o.model_dir, "Model directory")->required();
  auto* data = cmd->add_option(
      "--data", o.data,
      "A shard directory (zaya data prepare), a .bin token file, or .txt/.jsonl files and globs");
  cmd->add_option(
         "--choices", o.choices,
         "Multiple choice instead: a JSONL file of {\"context\", \"choices\": [...], \"answer\": index}")
      ->excludes(data);
  cmd->add_option("--context-field", o.fields.context, "--choices: the context's field")
      ->capture_default_str();
  cmd->add_option("--choices-field", o.fields.choices, "--choices: the choices' field")
      ->capture_default_str();
  cmd->add_option("--answer-field", o.fields.answer, "--choices: the right choice's index field")
      ->capture_default_str();
  cmd->add_option("--max-questions", o.max_questions, "--choices: score at most this many (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--split", o.split, "Shard directories: the split to score")->capture_default_str();
  cmd->add_option("--text-field", o.text_field, "JSONL: the field holding the text")->capture_default_str();
  cmd->add_flag("--reset-at-document-boundary", o.reset_documents,
                "Every document runs as its own fresh sequence inside its window, as training with "
                "data.reset_at_document_boundary = true sees it");
  cmd->add_option("--prompt-field", o.prompt_field,
                  "JSONL prompt/completion records (with --completion-field): the prompt, context only");
  cmd->add_option(
      "--completion-field", o.completion_field,
      "JSONL prompt/completion records (with --prompt-field): the completion, the only tokens scored");
  cmd->add_option("--messages-field", o.messages_field,
                  "JSONL chat records (with --chat-template): the message list; only the assistant's replies "
                  "are scored");
  cmd->add_option("--chat-template", o.chat_template,
                  "With --messages-field: a built-in (chatml, gemma, llama3, plain) or a TOML template file");
  cmd->add_option("--tokenizer", o.tokenizer,
                  "tokenizer.json or .model for text (default: the model directory's)");
  cmd->add_option("--seq-len", o.seq_len, "Tokens of context per window")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", o.batch, "Windows per forward pass")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-tokens", o.max_tokens, "Score at most this many tokens (0 = all)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--backend", o.backend, "cpu, or cuda in a GPU build")->capture_default_str();
  cmd->add_option("--out", o.out, "Also write the results as JSON here");
  cmd->callback([] { run_eval(o); });
}

}  // namespace zaya::cli
