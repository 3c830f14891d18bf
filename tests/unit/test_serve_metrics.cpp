// The server's Prometheus metrics (src/serve/metrics.h, seconds_histogram.h): the exposition
// text of given stats, line by line, and the format's rules (every sample of a family after its
// HELP and TYPE, names and values as the format allows, cumulative histogram buckets).
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "serve/metrics.h"

namespace zaya {
namespace {

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(SecondsHistogram, CountsEachObservationUnderEveryBoundItDoesNotExceed) {
  SecondsHistogram h;
  h.add(0.005);  // exactly a bound: counted under it
  h.add(0.3);
  h.add(45.0);  // past the last bound: only in the count
  EXPECT_EQ(h.count, 3);
  EXPECT_DOUBLE_EQ(h.sum, 45.305);
  for (size_t i = 0; i < SecondsHistogram::kBounds.size(); ++i) {
    const double b = SecondsHistogram::kBounds[i];
    EXPECT_EQ(h.at_most[i], int64_t(b >= 0.005) + int64_t(b >= 0.3)) << "bound " << b;
  }
}

TEST(ServeMetrics, PrometheusTextHoldsTheStatsInTheFormat) {
  EngineStats e;
  e.completions = 7;
  e.decode_steps = 40;
  e.prefill_positions = 1234;
  e.running = 2;
  e.kept_bytes = 5 << 20;
  e.first_token_seconds.add(0.00390625);  // binary fractions: the sum is exact
  e.first_token_seconds.add(0.25);        // exactly a bound
  e.first_token_seconds.add(100.0);
  HttpRequestCounts http;
  http.requests[{"/v1/completions", 200}] = 3;
  http.requests[{"other", 404}] = 1;
  http.requests[{"odd\"route\\", 500}] = 2;  // escaped as the format requires
  http.prompt_tokens = 12;
  http.generated_tokens = 30;
  const std::string text = prometheus_text(e, http, ServerShape{8, 1024, 4096, int64_t(1) << 20});

  for (const char* line : {
           "# TYPE zaya_completions_total counter",
           "zaya_completions_total 7",
           "zaya_decode_steps_total 40",
           "zaya_prefill_positions_total 1234",
           "# TYPE zaya_running gauge",
           "zaya_running 2",
           "zaya_kept_bytes 5242880",
           "zaya_max_batch 8",
           "zaya_context_positions 1024",
           "zaya_decode_state_bytes 4096",
           "zaya_keep_budget_bytes 1048576",
           "# TYPE zaya_time_to_first_token_seconds histogram",
           "zaya_time_to_first_token_seconds_bucket{le=\"0.0025\"} 0",
           "zaya_time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
           "zaya_time_to_first_token_seconds_bucket{le=\"0.1\"} 1",
           "zaya_time_to_first_token_seconds_bucket{le=\"0.25\"} 2",
           "zaya_time_to_first_token_seconds_bucket{le=\"30\"} 2",
           "zaya_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3",
           "zaya_time_to_first_token_seconds_sum 100.25390625",
           "zaya_time_to_first_token_seconds_count 3",
           "zaya_time_per_decode_step_seconds_count 0",
           "zaya_http_requests_total{route=\"/v1/completions\",code=\"200\"} 3",
           "zaya_http_requests_total{route=\"other\",code=\"404\"} 1",
           "zaya_http_requests_total{route=\"odd\\\"route\\\\\",code=\"500\"} 2",
           "zaya_prompt_tokens_total 12",
           "zaya_generated_tokens_total 30",
       })
    EXPECT_TRUE(has_line(text, line)) << "missing: " << line << "\n" << text;

  // Every sample belongs to a family whose HELP and TYPE came before it, each family once.
  const std::regex sample(R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (-?[0-9][0-9.e+-]*)$)");
  std::set<std::string> typed;
  std::string current;
  std::istringstream lines(text);
  std::string line;
  int samples = 0;
  while (std::getline(lines, line)) {
    if (line.rfind("# HELP ", 0) == 0) continue;
    if (line.rfind("# TYPE ", 0) == 0) {
      current = line.substr(7, line.find(' ', 7) - 7);
      EXPECT_TRUE(typed.insert(current).second) << "family typed twice: " << current;
      continue;
    }
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, sample)) << "not a sample line: " << line;
    const std::string name = m[1];
    EXPECT_EQ(name.rfind(current, 0), 0u) << name << " outside its family " << current;
    ++samples;
  }
  EXPECT_GT(samples, 40);
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace zaya
