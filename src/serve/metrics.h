// The inference server's metrics in the Prometheus text exposition format (version 0.0.4), for
// GET /metrics (docs/serving.md): the completion engine's counters, gauges and latency
// histograms, the HTTP requests answered by route and status, and the server's shape.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "serve/completion_engine.h"

namespace zaya {

// What the HTTP layer counts: the requests answered, by route (the server's own routes, or
// "other") and status code, and the prompt and generated tokens of the completions requests.
struct HttpRequestCounts {
  std::map<std::pair<std::string, int>, int64_t> requests;
  int64_t prompt_tokens = 0, generated_tokens = 0;
};

// What does not change while the server runs.
struct ServerShape {
  int64_t max_batch = 0, context = 0, decode_state_bytes = 0, keep_budget_bytes = 0;
};

std::string prometheus_text(const EngineStats& engine, const HttpRequestCounts& http,
                            const ServerShape& shape);

}  // namespace zaya
