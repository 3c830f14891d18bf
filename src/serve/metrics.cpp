// The server's metrics as Prometheus text (see metrics.h).
#include "serve/metrics.h"

#include <cstdio>
#include <cstdlib>

namespace zaya {

namespace {

// The shortest of 15 and 17 significant digits that reads back as the same double.
std::string number(double value) {
  char text[40];
  std::snprintf(text, sizeof text, "%.15g", value);
  if (std::strtod(text, nullptr) != value) std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

class Exposition {
 public:
  void header(const std::string& name, const char* type, const std::string& help) {
    out_ += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  }
  void sample(const std::string& name, const std::string& labels, double value) {
    out_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + number(value) + "\n";
  }
  void counter(const std::string& name, const std::string& help, int64_t value) {
    header(name, "counter", help);
    sample(name, "", double(value));
  }
  void gauge(const std::string& name, const std::string& help, int64_t value) {
    header(name, "gauge", help);
    sample(name, "", double(value));
  }
  void histogram(const std::string& name, const std::string& help, const SecondsHistogram& h) {
    header(name, "histogram", help);
    for (size_t i = 0; i < SecondsHistogram::kBounds.size(); ++i) {
      char bound[32];
      std::snprintf(bound, sizeof bound, "%g", SecondsHistogram::kBounds[i]);
      sample(name + "_bucket", std::string("le=\"") + bound + "\"", double(h.at_most[i]));
    }
    sample(name + "_bucket", "le=\"+Inf\"", double(h.count));
    sample(name + "_sum", "", h.sum);
    sample(name + "_count", "", double(h.count));
  }
  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

// A label value as the format quotes it: backslash, double quote and newline escaped.
std::string label_value(const std::string& v) {
  std::string out;
  for (char ch : v) {
    if (ch == '\\' || ch == '"') out += '\\';
    if (ch == '\n') {
      out += "\\n";
      continue;
    }
    out += ch;
  }
  return out;
}

}  // namespace

std::string prometheus_text(const EngineStats& e, const HttpRequestCounts& http, const ServerShape& shape) {
  Exposition x;
  x.counter("zaya_completions_total", "Completions finished, however they ended.", e.completions);
  x.counter("zaya_decode_steps_total", "Forward passes of the decoding batch.", e.decode_steps);
  x.counter("zaya_decoded_tokens_total", "Tokens fed to the model by decode steps.", e.decoded_tokens);
  x.counter("zaya_prefill_passes_total", "Forward passes over prompts.", e.prefill_chunks);
  x.counter("zaya_prefill_positions_total", "Prompt positions given to the model.", e.prefill_positions);
  x.counter("zaya_prefill_positions_reused_total", "Prompt positions not run because a kept state held them.",
            e.prefill_positions_reused);
  x.counter("zaya_prefills_reused_total",
            "Completions that ran no prompt position (a kept state or another choice held the whole prompt).",
            e.prefills_reused);
  x.counter("zaya_finished_continued_total",
            "Completions that started from a finished completion's kept state (a conversation's next turn).",
            e.finished_continued);
  x.gauge("zaya_running", "Completions decoding or being prefilled.", e.running);
  x.gauge("zaya_waiting", "Completions queued for a place in the batch.", e.waiting);
  x.gauge("zaya_kept_states", "Decode states kept (prompts and finished completions).", e.kept);
  x.gauge("zaya_kept_bytes", "Bytes of the kept decode states.", e.kept_bytes);
  x.gauge("zaya_peak_batch", "The most completions decoded in one step so far.", e.peak_batch);
  x.gauge("zaya_peak_prefill_group", "The most prompts run in one prefill pass so far.",
          e.peak_prefill_group);
  x.gauge("zaya_max_batch", "Completions the server decodes together at most (--batch).", shape.max_batch);
  x.gauge("zaya_context_positions", "Positions one completion may use (prompt and generated tokens).",
          shape.context);
  x.gauge("zaya_decode_state_bytes", "Bytes of the decoding batch's states.", shape.decode_state_bytes);
  x.gauge("zaya_keep_budget_bytes", "Bytes the kept decode states may take (--keep-mib).",
          shape.keep_budget_bytes);
  x.histogram("zaya_time_to_first_token_seconds",
              "From a completion's submission to its first token (queue and prompt).", e.first_token_seconds);
  x.histogram("zaya_time_per_decode_step_seconds",
              "A finished completion's decoding time over the decode steps it took.", e.decode_step_seconds);
  x.header("zaya_http_requests_total", "counter", "HTTP requests answered, by route and status code.");
  for (const auto& [key, n] : http.requests)
    x.sample("zaya_http_requests_total",
             "route=\"" + label_value(key.first) + "\",code=\"" + std::to_string(key.second) + "\"",
             double(n));
  x.counter("zaya_prompt_tokens_total", "Prompt tokens of the completion requests answered.",
            http.prompt_tokens);
  x.counter("zaya_generated_tokens_total", "Tokens generated for the completion requests answered.",
            http.generated_tokens);
  return x.text();
}

}  // namespace zaya
