// Recipe parsing, validation, --set overrides and TOML output. One table (fields()) lists every
// key with its type and allowed range; parsing, overrides, validation and recipe_to_toml all
// walk it, so a new key is one line here plus its struct field, default.toml and the docs.
#include "train/recipe.h"

#include "default_recipe.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

#include "core/error.h"
#include "train/recipe_phases.h"

namespace zaya {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

enum class Kind { Int, Float, Bool, String };

struct Field {
  const char* section = "";  // "" = top level
  const char* key = "";
  Kind kind = Kind::Int;
  void* (*get)(Recipe&) = nullptr;
  int64_t imin = 0, imax = kMaxInt;             // Int: [imin, imax]
  double lo = -kInf, hi = kInf;                 // Float: lo..hi, finite always
  bool lo_open = false, hi_open = false;        // Float: exclusive bounds
  std::vector<std::string> choices;             // String: allowed values (empty = any)
  bool nonempty = false;                        // String: "" rejected

  std::string name() const {
    return *section ? std::string(section) + "." + key : std::string(key);
  }
};

Field base_f(const char* s, const char* k, Kind kind, void* (*g)(Recipe&)) {
  Field f;
  f.section = s;
  f.key = k;
  f.kind = kind;
  f.get = g;
  return f;
}

#define ZAYA_GET(expr) [](Recipe& r) -> void* { return &r.expr; }

Field int_f(const char* s, const char* k, void* (*g)(Recipe&), int64_t lo, int64_t hi = kMaxInt) {
  Field f = base_f(s, k, Kind::Int, g);
  f.imin = lo;
  f.imax = hi;
  return f;
}
Field float_f(const char* s, const char* k, void* (*g)(Recipe&), double lo, bool lo_open,
              double hi = kInf, bool hi_open = false) {
  Field f = base_f(s, k, Kind::Float, g);
  f.lo = lo;
  f.lo_open = lo_open;
  f.hi = hi;
  f.hi_open = hi_open;
  return f;
}
Field bool_f(const char* s, const char* k, void* (*g)(Recipe&)) { return base_f(s, k, Kind::Bool, g); }
Field str_f(const char* s, const char* k, void* (*g)(Recipe&), std::vector<std::string> choices = {},
            bool nonempty = false) {
  Field f = base_f(s, k, Kind::String, g);
  f.choices = std::move(choices);
  f.nonempty = nonempty;
  return f;
}

const std::vector<std::string>& sections() {
  static const std::vector<std::string> s = {"model",    "data",    "batch",      "optimizer",
                                             "schedule", "balancer", "checkpoint", "logging",
                                             "eval",     "stability", "parallel"};
  return s;
}

// Every key, in documented order (recipe_to_toml writes them in this order).
const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      int_f("", "seed", ZAYA_GET(seed), 0),
      str_f("", "run_dir", ZAYA_GET(run_dir), {}, true),

      str_f("model", "preset", ZAYA_GET(model.preset)),
      str_f("model", "config", ZAYA_GET(model.config)),
      str_f("model", "init_from", ZAYA_GET(model.init_from)),
      int_f("model", "vocab_size", ZAYA_GET(model.vocab_size), 0, std::numeric_limits<int32_t>::max()),
      str_f("model", "skip_expert_output", ZAYA_GET(model.skip_expert_output), {"identity", "zero"}),

      str_f("data", "train", ZAYA_GET(data.train), {}, true),
      str_f("data", "val", ZAYA_GET(data.val)),
      str_f("data", "tokenizer", ZAYA_GET(data.tokenizer)),
      int_f("data", "seq_len", ZAYA_GET(data.seq_len), 2, int64_t{1} << 24),
      bool_f("data", "reset_at_document_boundary", ZAYA_GET(data.reset_at_document_boundary)),

      int_f("batch", "micro_batch", ZAYA_GET(batch.micro_batch), 1, int64_t{1} << 24),
      int_f("batch", "global_batch", ZAYA_GET(batch.global_batch), 1, int64_t{1} << 30),
      int_f("batch", "ramp_start", ZAYA_GET(batch.ramp_start), 0, int64_t{1} << 30),
      int_f("batch", "ramp_steps", ZAYA_GET(batch.ramp_steps), 0),
      bool_f("batch", "recompute_activations", ZAYA_GET(batch.recompute_activations)),

      float_f("optimizer", "lr", ZAYA_GET(optimizer.lr), 0, true),
      float_f("optimizer", "weight_decay", ZAYA_GET(optimizer.weight_decay), 0, false),
      float_f("optimizer", "muon_momentum", ZAYA_GET(optimizer.muon_momentum), 0, false, 1, true),
      bool_f("optimizer", "nesterov", ZAYA_GET(optimizer.nesterov)),
      int_f("optimizer", "ns_steps", ZAYA_GET(optimizer.ns_steps), 1, 100),
      float_f("optimizer", "adam_beta1", ZAYA_GET(optimizer.adam_beta1), 0, false, 1, true),
      float_f("optimizer", "adam_beta2", ZAYA_GET(optimizer.adam_beta2), 0, false, 1, true),
      float_f("optimizer", "adam_eps", ZAYA_GET(optimizer.adam_eps), 0, true),
      float_f("optimizer", "clip_grad_norm", ZAYA_GET(optimizer.clip_grad_norm), 0, false),

      str_f("schedule", "kind", ZAYA_GET(schedule.kind), {"wsd", "cosine", "constant"}),
      int_f("schedule", "warmup_steps", ZAYA_GET(schedule.warmup_steps), 0),
      int_f("schedule", "total_steps", ZAYA_GET(schedule.total_steps), 1),
      float_f("schedule", "decay_fraction", ZAYA_GET(schedule.decay_fraction), 0, false, 1, false),
      float_f("schedule", "min_lr_ratio", ZAYA_GET(schedule.min_lr_ratio), 0, false, 1, false),

      float_f("balancer", "lr", ZAYA_GET(balancer.lr), 0, false),
      float_f("balancer", "beta1", ZAYA_GET(balancer.beta1), 0, false, 1, true),
      float_f("balancer", "beta2", ZAYA_GET(balancer.beta2), 0, false, 1, true),
      str_f("balancer", "target", ZAYA_GET(balancer.target), {"uniform"}),
      float_f("balancer", "skip_bias", ZAYA_GET(balancer.skip_bias), -kInf, false),
      bool_f("balancer", "balance_skip", ZAYA_GET(balancer.balance_skip)),

      int_f("checkpoint", "every", ZAYA_GET(checkpoint.every), 0),
      int_f("checkpoint", "keep", ZAYA_GET(checkpoint.keep), 1),
      str_f("checkpoint", "dir", ZAYA_GET(checkpoint.dir)),

      int_f("logging", "every", ZAYA_GET(logging.every), 1),
      bool_f("logging", "metrics", ZAYA_GET(logging.metrics)),
      bool_f("logging", "plot", ZAYA_GET(logging.plot)),

      int_f("eval", "every", ZAYA_GET(eval.every), 0),
      int_f("eval", "batches", ZAYA_GET(eval.batches), 1),
      str_f("eval", "sample_prompt", ZAYA_GET(eval.sample_prompt)),
      int_f("eval", "sample_tokens", ZAYA_GET(eval.sample_tokens), 0, int64_t{1} << 20),
      str_f("eval", "choices", ZAYA_GET(eval.choices)),
      int_f("eval", "choices_max", ZAYA_GET(eval.choices_max), 0),

      str_f("stability", "policy", ZAYA_GET(stability.policy), {"skip", "rollback"}),
      float_f("stability", "spike_factor", ZAYA_GET(stability.spike_factor), 1, true),
      int_f("stability", "max_bad_steps", ZAYA_GET(stability.max_bad_steps), 1),

      int_f("parallel", "context_parallel", ZAYA_GET(parallel.context_parallel), 1, 1024),
  };
  return f;
}

#undef ZAYA_GET

const Field* find_field(const std::string& name) {
  for (const Field& f : fields())
    if (f.name() == name) return &f;
  return nullptr;
}

bool is_section(const std::string& s) {
  return std::find(sections().begin(), sections().end(), s) != sections().end();
}

// ---- formatting ----------------------------------------------------------------------------

// Shortest text that reads back as the same double, always a TOML float ("1.0", not "1").
std::string fmt_double(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\b': out += "\\b"; break;
      case '\t': out += "\\t"; break;
      case '\n': out += "\\n"; break;
      case '\f': out += "\\f"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

std::string fmt_bound(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return fmt_double(v);
}

// "an integer >= 1", "a float in [0, 1)", "one of "wsd", "cosine", "constant"", ...
std::string expected(const Field& f) {
  switch (f.kind) {
    case Kind::Int:
      if (f.imax == kMaxInt) return "an integer >= " + std::to_string(f.imin);
      return "an integer in [" + std::to_string(f.imin) + ", " + std::to_string(f.imax) + "]";
    case Kind::Float: {
      bool has_lo = std::isfinite(f.lo), has_hi = std::isfinite(f.hi);
      if (!has_lo && !has_hi) return "a finite float";
      if (!has_hi) return std::string("a float ") + (f.lo_open ? "> " : ">= ") + fmt_bound(f.lo);
      if (!has_lo) return std::string("a float ") + (f.hi_open ? "< " : "<= ") + fmt_bound(f.hi);
      return std::string("a float in ") + (f.lo_open ? "(" : "[") + fmt_bound(f.lo) + ", " +
             fmt_bound(f.hi) + (f.hi_open ? ")" : "]");
    }
    case Kind::Bool:
      return "a boolean (true or false)";
    case Kind::String: {
      if (f.choices.empty()) return f.nonempty ? "a non-empty string" : "a string";
      std::string s = f.choices.size() == 1 ? "the string " : "one of ";
      for (size_t i = 0; i < f.choices.size(); ++i) s += (i ? ", " : "") + quote(f.choices[i]);
      return s;
    }
  }
  return "?";
}

// What a TOML node holds, for "found ..." in errors.
std::string describe_node(const toml::node& n) {
  if (auto v = n.as_integer()) return "integer " + std::to_string(v->get());
  if (auto v = n.as_floating_point()) return "float " + fmt_double(v->get());
  if (auto v = n.as_boolean()) return std::string("boolean ") + (v->get() ? "true" : "false");
  if (auto v = n.as_string()) return "string " + quote(v->get());
  if (n.is_array()) return "an array";
  if (n.is_table()) return "a table";
  return "a date/time";
}

// ---- value checks --------------------------------------------------------------------------

bool int_ok(const Field& f, int64_t v) { return v >= f.imin && v <= f.imax; }
bool float_ok(const Field& f, double v) {
  if (!std::isfinite(v)) return false;
  if (f.lo_open ? !(v > f.lo) : !(v >= f.lo)) return false;
  if (f.hi_open ? !(v < f.hi) : !(v <= f.hi)) return false;
  return true;
}
bool string_ok(const Field& f, const std::string& v) {
  if (f.nonempty && v.empty()) return false;
  return f.choices.empty() || std::find(f.choices.begin(), f.choices.end(), v) != f.choices.end();
}

bool valid_utf8(const std::string& s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > n) return false;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1f) : len == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < len; ++k) {
      unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

// Stores `n` in the field when it has the right type and range; otherwise returns
// "expected ..., found ...".
std::optional<std::string> assign(const Field& f, const toml::node& n, Recipe& r) {
  auto bad = [&] { return "expected " + expected(f) + ", found " + describe_node(n); };
  void* p = f.get(r);
  switch (f.kind) {
    case Kind::Int: {
      auto v = n.as_integer();
      if (!v || !int_ok(f, v->get())) return bad();
      *static_cast<int64_t*>(p) = v->get();
      return std::nullopt;
    }
    case Kind::Float: {
      double d;
      if (auto v = n.as_floating_point()) d = v->get();
      else if (auto i = n.as_integer()) d = static_cast<double>(i->get());
      else return bad();
      if (!float_ok(f, d)) return bad();
      *static_cast<double*>(p) = d;
      return std::nullopt;
    }
    case Kind::Bool: {
      auto v = n.as_boolean();
      if (!v) return bad();
      *static_cast<bool*>(p) = v->get();
      return std::nullopt;
    }
    case Kind::String: {
      auto v = n.as_string();
      if (!v || !string_ok(f, v->get())) return bad();
      *static_cast<std::string*>(p) = v->get();
      return std::nullopt;
    }
  }
  return bad();
}

// The current value of a field, as "found ..." text (for validate_recipe on in-memory recipes).
std::string describe_field(const Field& f, const Recipe& r) {
  void* p = f.get(const_cast<Recipe&>(r));
  switch (f.kind) {
    case Kind::Int: return "integer " + std::to_string(*static_cast<int64_t*>(p));
    case Kind::Float: return "float " + fmt_double(*static_cast<double*>(p));
    case Kind::Bool: return std::string("boolean ") + (*static_cast<bool*>(p) ? "true" : "false");
    case Kind::String: return "string " + quote(*static_cast<std::string*>(p));
  }
  return "?";
}

bool field_ok(const Field& f, const Recipe& r) {
  void* p = f.get(const_cast<Recipe&>(r));
  switch (f.kind) {
    case Kind::Int: return int_ok(f, *static_cast<int64_t*>(p));
    case Kind::Float: return float_ok(f, *static_cast<double*>(p));
    case Kind::Bool: return true;
    case Kind::String: return string_ok(f, *static_cast<std::string*>(p));
  }
  return false;
}

std::string value_text(const Field& f, const Recipe& r) {
  void* p = f.get(const_cast<Recipe&>(r));
  switch (f.kind) {
    case Kind::Int: return std::to_string(*static_cast<int64_t*>(p));
    case Kind::Float: return fmt_double(*static_cast<double*>(p));
    case Kind::Bool: return *static_cast<bool*>(p) ? "true" : "false";
    case Kind::String: return quote(*static_cast<std::string*>(p));
  }
  return "?";
}

// ---- suggestions ---------------------------------------------------------------------------

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

size_t edit_distance(const std::string& a0, const std::string& b0) {
  std::string a = lower(a0), b = lower(b0);
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest candidate to `word`, when close enough to be a plausible typo.
std::optional<std::string> closest(const std::string& word, const std::vector<std::string>& candidates) {
  size_t limit = word.size() <= 3 ? 1 : std::max<size_t>(2, word.size() / 3);
  std::optional<std::string> best;
  size_t best_d = limit + 1;
  for (const std::string& c : candidates) {
    // The distance is at least the difference in length: past the limit, it is not computed
    // (a key of a thousand characters would otherwise cost a million steps per candidate).
    const size_t length_gap = c.size() > word.size() ? c.size() - word.size() : word.size() - c.size();
    size_t d = length_gap > limit ? length_gap : edit_distance(word, c);
    // "warmup" for "warmup_steps", "beta1" for "adam_beta1": a part of at least 4 characters
    // counts as close (but a real typo nearer than `limit` still wins).
    if (word.size() >= 4 && lower(c).find(lower(word)) != std::string::npos) d = std::min(d, limit);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::vector<std::string> keys_in(const std::string& section) {
  std::vector<std::string> out;
  for (const Field& f : fields())
    if (section == f.section) out.emplace_back(f.key);
  return out;
}

std::string join_words(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// Best guess for an unknown key `key` found in `section` ("" = top level), as a full name.
std::optional<std::string> suggest_key(const std::string& section, const std::string& key) {
  if (auto k = closest(key, keys_in(section))) return section.empty() ? *k : section + "." + *k;
  // The key in the wrong section ([optimizer] warmup_steps, or lr at the top level).
  std::vector<std::string> leaves, names;
  for (const Field& f : fields())
    if (section != f.section) leaves.emplace_back(f.key), names.push_back(f.name());
  for (size_t i = 0; i < leaves.size(); ++i)
    if (lower(key) == lower(leaves[i])) return names[i];
  if (auto k = closest(key, leaves))
    for (size_t i = 0; i < leaves.size(); ++i)
      if (leaves[i] == *k) return names[i];
  std::vector<std::string> all;
  for (const Field& f : fields()) all.push_back(f.name());
  return closest(section.empty() ? key : section + "." + key, all);
}

std::string unknown_key_hint(const std::string& section) {
  if (section.empty())
    return "top-level keys are " + join_words(keys_in(""), ", ") +
           "; everything else belongs in a section: " + join_words(sections(), ", ");
  return "keys in [" + section + "]: " + join_words(keys_in(section), ", ");
}

// ---- problems ------------------------------------------------------------------------------

using recipe_detail::Problem;

std::string at(const std::string& source, uint32_t line) {
  return "in " + source + (line ? " at line " + std::to_string(line) : "");
}

[[noreturn]] void fail_with(const std::string& source, std::vector<Problem> problems) {
  std::stable_sort(problems.begin(), problems.end(), [](const Problem& a, const Problem& b) {
    return std::tie(a.line, a.column) < std::tie(b.line, b.column);
  });
  if (problems.size() == 1) fail("recipe", problems[0].message, problems[0].hint);
  std::string msg = std::to_string(problems.size()) + " problems in " + source + ":";
  for (const Problem& p : problems) {
    msg += "\n  " + p.message;
    if (!p.hint.empty()) msg += " (hint: " + p.hint + ")";
  }
  fail("recipe", msg);
}

Problem value_problem(const Field& f, const std::string& source, const toml::node& n, const std::string& why) {
  auto b = n.source().begin;
  return {b.line, b.column, "'" + f.name() + "' " + at(source, b.line) + ": " + why, {}};
}

void read_field(const Field& f, const toml::node& n, Recipe& r, const std::string& source,
                std::vector<Problem>& problems) {
  if (auto why = assign(f, n, r)) problems.push_back(value_problem(f, source, n, *why));
}

void unknown_key(const std::string& section, const std::string& key, const toml::node& n,
                 const std::string& source, std::vector<Problem>& problems) {
  auto b = n.source().begin;
  std::string full = section.empty() ? key : section + "." + key;
  std::string msg = "unknown key '" + full + "' " + at(source, b.line);
  if (auto s = suggest_key(section, key)) msg += " (did you mean '" + *s + "'?)";
  problems.push_back({b.line, b.column, msg, unknown_key_hint(section)});
}

// Constraints between fields (each field is already in range).
void cross_check(const Recipe& r, const std::string& source, std::vector<Problem>& problems,
                 const std::map<std::string, uint32_t>& lines) {
  // The line is that of `key`, or else of the first of `related` that the file sets.
  auto add = [&](const std::string& key, std::initializer_list<const char*> related, const std::string& why,
                 const std::string& hint = {}) {
    uint32_t line = 0;
    if (auto it = lines.find(key); it != lines.end()) line = it->second;
    for (const char* k : related)
      if (auto it = lines.find(k); !line && it != lines.end()) line = it->second;
    problems.push_back({line, 0, "'" + key + "' " + at(source, line) + ": " + why, hint});
  };
  if (r.model.config.empty() && r.model.preset.empty())
    add("model.preset", {"model.config"},
        "expected a preset name when model.config is \"\", found string \"\"");
  const auto& b = r.batch;
  if (b.global_batch % b.micro_batch != 0)
    add("batch.global_batch", {"batch.micro_batch"},
        "expected a positive multiple of batch.micro_batch (" + std::to_string(b.micro_batch) + "), found " +
            std::to_string(b.global_batch),
        "global_batch sequences per optimizer step are accumulated from micro_batch-sized forward passes");
  if (b.ramp_start > 0) {
    if (b.ramp_start % b.micro_batch != 0 || b.ramp_start > b.global_batch)
      add("batch.ramp_start", {"batch.micro_batch", "batch.global_batch"},
          "expected 0 or a positive multiple of batch.micro_batch (" + std::to_string(b.micro_batch) +
              ") no larger than batch.global_batch (" + std::to_string(b.global_batch) + "), found " +
              std::to_string(b.ramp_start));
    if (b.ramp_steps == 0)
      add("batch.ramp_steps", {"batch.ramp_start"},
          "expected an integer >= 1 when batch.ramp_start is set, found integer 0");
  }
  const auto& s = r.schedule;
  if (s.warmup_steps > s.total_steps) {
    add("schedule.warmup_steps", {"schedule.total_steps"},
        "expected at most schedule.total_steps (" + std::to_string(s.total_steps) + "), found " +
            std::to_string(s.warmup_steps));
  } else if (s.kind == "wsd") {
    auto decay = static_cast<int64_t>(std::llround(s.decay_fraction * static_cast<double>(s.total_steps)));
    if (s.warmup_steps + decay > s.total_steps)
      add("schedule.decay_fraction", {"schedule.warmup_steps", "schedule.total_steps", "schedule.kind"},
          "expected warmup_steps + decay_fraction * total_steps <= total_steps, found " +
              std::to_string(s.warmup_steps) + " + " + std::to_string(decay) + " > " + std::to_string(s.total_steps),
          "the decay phase of a wsd schedule must start after warmup ends");
  }
  if (!r.eval.choices.empty() && r.data.tokenizer.empty())
    add("eval.choices", {"data.tokenizer"},
        "expected \"\" when data.tokenizer is \"\" (the questions are text), found \"" + r.eval.choices +
            "\"",
        "set data.tokenizer to the model's tokenizer");
  if (r.stability.policy == "rollback" && r.checkpoint.every == 0)
    add("stability.policy", {"checkpoint.every"},
        "expected \"skip\" when checkpoint.every is 0 (a rollback needs a checkpoint), found \"rollback\"");
  // Context parallelism cuts each sequence into 2 x context_parallel chunks (per phase).
  auto check_cp = [&](int64_t cp, int64_t seq_len, const std::string& seq_key, const std::string& cp_key) {
    if (cp <= 1) return;
    if (seq_len % (2 * cp) != 0)
      add(seq_key, {cp_key.c_str()},
          "expected a multiple of 2 x " + cp_key + " (" + std::to_string(2 * cp) + "), found " + std::to_string(seq_len),
          "context parallelism cuts every sequence into 2 x context_parallel equal chunks");
  };
  if (r.phases.empty()) check_cp(r.parallel.context_parallel, r.data.seq_len, "data.seq_len", "parallel.context_parallel");
  for (size_t i = 0; i < r.phases.size(); ++i) {
    const std::string what = "phases[" + std::to_string(i) + "]";
    check_cp(context_parallel_of(r, i), r.phases[i].seq_len, what + ".seq_len",
             r.phases[i].context_parallel > 0 ? what + ".context_parallel" : "parallel.context_parallel");
  }
  recipe_detail::check_phases(r, source, problems);
}

Recipe parse_impl(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(std::string_view(text), std::string_view(source));
  } catch (const toml::parse_error& e) {
    auto b = e.source().begin;
    fail("recipe",
         "TOML syntax error in " + source + " at line " + std::to_string(b.line) + ", column " +
             std::to_string(b.column) + ": " + std::string(e.description()),
         "see https://toml.io for the syntax; docs/recipes.md for the keys");
  }
  Recipe r;
  std::vector<Problem> problems;
  std::map<std::string, uint32_t> lines;
  for (auto&& [k, node] : root) {
    std::string name(k.str());
    if (is_section(name)) {
      auto* table = node.as_table();
      if (!table) {
        auto b = node.source().begin;
        problems.push_back({b.line,
                            b.column,
                            "'" + name + "' " + at(source, b.line) + ": expected a table [" + name +
                                "], found " + describe_node(node),
                            {}});
        continue;
      }
      for (auto&& [k2, node2] : *table) {
        std::string key(k2.str());
        if (name == "data" && key == "datasets") {
          recipe_detail::read_datasets(node2, r.data.datasets, source, problems);
          continue;
        }
        const Field* f = find_field(name + "." + key);
        if (!f) {
          unknown_key(name, key, node2, source, problems);
          continue;
        }
        lines[f->name()] = node2.source().begin.line;
        read_field(*f, node2, r, source, problems);
      }
    } else if (name == "phases") {
      recipe_detail::read_phases(node, r.phases, source, problems);
    } else if (const Field* f = find_field(name); f && !*f->section) {
      lines[name] = node.source().begin.line;
      read_field(*f, node, r, source, problems);
    } else if (node.is_table()) {
      auto b = node.source().begin;
      std::string msg = "unknown section '[" + name + "]' " + at(source, b.line);
      if (auto s = closest(name, sections())) msg += " (did you mean '[" + *s + "]'?)";
      problems.push_back({b.line, b.column, msg, "sections are " + join_words(sections(), ", ")});
    } else {
      unknown_key("", name, node, source, problems);
    }
  }
  if (problems.empty()) cross_check(r, source, problems, lines);
  if (!problems.empty()) fail_with(source, std::move(problems));
  return r;
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}

// The embedded copy of recipes/default.toml (a unit test checks they are identical).
// The built-in default: recipes/default.toml, embedded at configure time (cmake/default_recipe.h.in).


}  // namespace

int64_t context_parallel_of(const Recipe& r, size_t phase) {
  if (phase < r.phases.size() && r.phases[phase].context_parallel > 0) return r.phases[phase].context_parallel;
  return r.parallel.context_parallel;
}

Recipe parse_recipe(const std::string& toml_text, const std::string& source) {
  return parse_impl(toml_text, source);
}

Recipe load_recipe(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    fail("recipe", "recipe path '" + path + "' is a directory", "pass a .toml file, e.g. recipes/default.toml");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    fail("recipe", "cannot open recipe file '" + path + "'",
         "check the path; `zaya train` without a recipe uses the built-in default (recipes/default.toml)");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("recipe", "cannot read recipe file '" + path + "'");
  return parse_impl(ss.str(), path);
}

void apply_override(Recipe& recipe, const std::string& assignment) {
  const std::string source = "--set " + assignment;
  size_t eq = assignment.find('=');
  if (eq == std::string::npos)
    fail("recipe", "'" + source + "': expected section.key=value", "for example --set optimizer.lr=1e-3");
  std::string name = trim(assignment.substr(0, eq));
  std::string value = trim(assignment.substr(eq + 1));
  const Field* f = find_field(name);
  if (!f && (name.rfind("phases", 0) == 0 || name.rfind("data.datasets", 0) == 0))
    fail("recipe", "'" + source + "': [[phases]] and [[data.datasets]] are set in the recipe file, not with --set",
         "copy the recipe and edit its phases");
  if (!f) {
    if (is_section(name))
      fail("recipe", "'" + source + "': '" + name + "' is a section; expected section.key=value",
           unknown_key_hint(name));
    size_t dot = name.find('.');
    std::string section = dot == std::string::npos ? "" : name.substr(0, dot);
    std::string key = dot == std::string::npos ? name : name.substr(dot + 1);
    std::string msg = "unknown key '" + name + "' in " + source;
    std::optional<std::string> s;
    if (section.empty() || is_section(section)) {
      s = suggest_key(section, key);
    } else {
      std::vector<std::string> all;
      for (const Field& g : fields()) all.push_back(g.name());
      s = closest(name, all);
    }
    if (s) msg += " (did you mean '" + *s + "'?)";
    fail("recipe", msg,
         is_section(section) || section.empty() ? unknown_key_hint(section)
                                                : "sections are " + join_words(sections(), ", "));
  }

  // The value as a TOML value, when it is one (exactly one key, no trailing extras).
  std::optional<toml::table> parsed;
  try {
    const std::string doc = "v = " + value;
    toml::table t = toml::parse(std::string_view(doc), std::string_view("--set"));
    if (t.size() == 1 && t.contains("v")) parsed = std::move(t);
  } catch (const toml::parse_error&) {
  }
  const toml::node* node = parsed ? parsed->get("v") : nullptr;

  if (f->kind == Kind::String && !(node && node->is_string())) {
    // Bare text: --set schedule.kind=cosine, --set run_dir=runs/a.
    if (!valid_utf8(value))
      fail("recipe", "'" + f->name() + "' in " + source + ": expected " + expected(*f) + " (valid UTF-8)");
    if (!string_ok(*f, value))
      fail("recipe", "'" + f->name() + "' in " + source + ": expected " + expected(*f) + ", found string " +
                         quote(value));
    *static_cast<std::string*>(f->get(recipe)) = value;
    return;
  }
  if (!node)
    fail("recipe",
         "'" + f->name() + "' in " + source + ": expected " + expected(*f) + ", found '" + value +
             "' (not a TOML value)",
         "numbers as 3e-4 or 8, booleans as true/false");
  if (auto why = assign(*f, *node, recipe)) fail("recipe", "'" + f->name() + "' in " + source + ": " + *why);
}

void validate_recipe(const Recipe& recipe, const std::string& source) {
  std::vector<Problem> problems;
  for (const Field& f : fields())
    if (!field_ok(f, recipe))
      problems.push_back({0, 0, "'" + f.name() + "' in " + source + ": expected " + expected(f) + ", found " +
                                    describe_field(f, recipe), {}});
  if (problems.empty()) cross_check(recipe, source, problems, {});
  if (!problems.empty()) fail_with(source, std::move(problems));
}

Recipe resolve_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  Recipe r = path.empty() ? default_recipe() : load_recipe(path);
  for (const std::string& o : overrides) apply_override(r, o);
  std::string source = path.empty() ? "the built-in default recipe" : path;
  if (!overrides.empty()) source += " with --set overrides";
  validate_recipe(r, source);
  return r;
}

std::string recipe_to_toml(const Recipe& recipe) {
  std::string out = "# zaya recipe, fully resolved (every key; see docs/recipes.md)\n";
  std::string current;
  for (const Field& f : fields()) {
    if (current != f.section) {
      current = f.section;
      out += "\n[" + current + "]\n";
    }
    out += std::string(f.key) + " = " + value_text(f, recipe) + "\n";
  }
  return out + recipe_detail::phases_to_toml(recipe);
}

const std::string& default_recipe_toml() {
  static const std::string text = kDefaultRecipe;
  return text;
}

Recipe default_recipe() {
  static const Recipe r = parse_impl(default_recipe_toml(), "the built-in default recipe");
  return r;
}

std::string checkpoint_dir(const Recipe& recipe) {
  return recipe.checkpoint.dir.empty() ? recipe.run_dir + "/checkpoints" : recipe.checkpoint.dir;
}

std::vector<std::string> recipe_keys() {
  std::vector<std::string> out;
  for (const Field& f : fields()) out.push_back(f.name());
  return out;
}

}  // namespace zaya
