// [[data.datasets]] and [[phases]] of a training recipe: parsing with line-numbered errors,
// cross-checks, and TOML output (through toml++'s own formatter).
#include "train/recipe_phases.h"

#include <cctype>
#include <cmath>
#include <set>
#include <sstream>

namespace zaya::recipe_detail {
namespace {

std::string at(const std::string& source, const toml::node& n) {
  const uint32_t line = n.source().begin.line;
  return "in " + source + (line ? " at line " + std::to_string(line) : "");
}

Problem problem(const toml::node& n, const std::string& source, const std::string& what, const std::string& why,
                const std::string& hint = {}) {
  return {n.source().begin.line, n.source().begin.column, "'" + what + "' " + at(source, n) + ": " + why, hint};
}

bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
  return true;
}

const char* kNameRule = "a name of 1-64 characters from A-Z a-z 0-9 _ - .";

// Reads key `key` of table t into out when present with the right type; records a problem otherwise.
template <typename T>
bool read_value(const toml::table& t, const char* key, const std::string& what, T& out, const std::string& source,
                std::vector<Problem>& problems, const char* expected) {
  const toml::node* n = t.get(key);
  if (!n) return false;
  if (auto v = n->value<T>()) {
    out = *v;
    return true;
  }
  problems.push_back(problem(*n, source, what + "." + key, std::string("expected ") + expected));
  return false;
}

void check_keys(const toml::table& t, const std::string& what, const std::set<std::string>& allowed,
                const std::string& source, std::vector<Problem>& problems) {
  for (auto&& [k, n] : t) {
    const std::string key(k.str());
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      problems.push_back(problem(n, source, what + "." + key, "unknown key", "keys here are " + list));
    }
  }
}

}  // namespace

void read_datasets(const toml::node& node, std::vector<RecipeDataset>& out, const std::string& source,
                   std::vector<Problem>& problems) {
  const toml::array* arr = node.as_array();
  if (!arr || !arr->is_array_of_tables()) {
    problems.push_back(problem(node, source, "data.datasets", "expected an array of tables ([[data.datasets]])"));
    return;
  }
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table& t = *arr->get(i)->as_table();
    const std::string what = "data.datasets[" + std::to_string(i) + "]";
    check_keys(t, what, {"name", "dir"}, source, problems);
    RecipeDataset d;
    if (!read_value(t, "name", what, d.name, source, problems, "a string"))
      if (!t.get("name")) problems.push_back(problem(t, source, what + ".name", "missing (every dataset needs a name)"));
    if (!read_value(t, "dir", what, d.dir, source, problems, "a string"))
      if (!t.get("dir")) problems.push_back(problem(t, source, what + ".dir", "missing (the shard directory)"));
    out.push_back(d);
  }
}

void read_phases(const toml::node& node, std::vector<RecipePhase>& out, const std::string& source,
                 std::vector<Problem>& problems) {
  const toml::array* arr = node.as_array();
  if (!arr || !arr->is_array_of_tables()) {
    problems.push_back(problem(node, source, "phases", "expected an array of tables ([[phases]])"));
    return;
  }
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table& t = *arr->get(i)->as_table();
    const std::string what = "phases[" + std::to_string(i) + "]";
    check_keys(t, what, {"name", "tokens", "seq_len", "mixture", "rope_theta", "lr_scale", "context_parallel"}, source,
               problems);
    RecipePhase p;
    p.name = "phase" + std::to_string(i + 1);
    read_value(t, "name", what, p.name, source, problems, "a string");
    read_value(t, "tokens", what, p.tokens, source, problems, "an integer");
    read_value(t, "context_parallel", what, p.context_parallel, source, problems, "an integer");
    if (!read_value(t, "seq_len", what, p.seq_len, source, problems, "an integer") && !t.get("seq_len"))
      problems.push_back(problem(t, source, what + ".seq_len", "missing (tokens per training sequence)"));
    if (const toml::node* rt = t.get("rope_theta")) {
      if (auto v = rt->value<double>()) p.rope_theta = *v;
      else problems.push_back(problem(*rt, source, what + ".rope_theta", "expected a number"));
    }
    if (const toml::node* ls = t.get("lr_scale")) {
      if (auto v = ls->value<double>()) p.lr_scale = *v;
      else problems.push_back(problem(*ls, source, what + ".lr_scale", "expected a number"));
    }
    const toml::node* mix = t.get("mixture");
    if (!mix) {
      problems.push_back(problem(t, source, what + ".mixture", "missing (dataset weights, e.g. { web = 0.8, code = 0.2 })"));
    } else if (const toml::table* mt = mix->as_table()) {
      for (auto&& [k, n] : *mt) {  // toml++ tables iterate in key order
        RecipeMixtureWeight w;
        w.dataset = std::string(k.str());
        if (auto v = n.value<double>()) w.weight = *v;
        else problems.push_back(problem(n, source, what + ".mixture." + w.dataset, "expected a number (a weight > 0)"));
        p.mixture.push_back(w);
      }
    } else {
      problems.push_back(problem(*mix, source, what + ".mixture", "expected a table of dataset weights"));
    }
    out.push_back(p);
  }
}

void check_phases(const Recipe& r, const std::string& source, std::vector<Problem>& problems) {
  auto add = [&](const std::string& what, const std::string& why, const std::string& hint = {}) {
    problems.push_back({0, 0, "'" + what + "' in " + source + ": " + why, hint});
  };
  std::set<std::string> names;
  for (size_t i = 0; i < r.data.datasets.size(); ++i) {
    const RecipeDataset& d = r.data.datasets[i];
    const std::string what = "data.datasets[" + std::to_string(i) + "]";
    if (!valid_name(d.name)) add(what + ".name", std::string("expected ") + kNameRule + ", found \"" + d.name + "\"");
    else if (!names.insert(d.name).second) add(what + ".name", "dataset \"" + d.name + "\" is declared twice");
    if (d.dir.empty()) add(what + ".dir", "expected a shard directory, found \"\"");
  }
  if (r.phases.empty()) return;
  if (r.data.datasets.empty())
    add("phases", "the phases' mixtures need datasets, but no [[data.datasets]] is declared",
        "declare each shard directory once: [[data.datasets]] name = \"web\" dir = \"data/shards/web\"");
  std::set<std::string> phase_names;
  for (size_t i = 0; i < r.phases.size(); ++i) {
    const RecipePhase& p = r.phases[i];
    const std::string what = "phases[" + std::to_string(i) + "]";
    const bool last = i + 1 == r.phases.size();
    if (!valid_name(p.name)) add(what + ".name", std::string("expected ") + kNameRule + ", found \"" + p.name + "\"");
    else if (!phase_names.insert(p.name).second) add(what + ".name", "phase \"" + p.name + "\" is declared twice");
    if (p.seq_len < 2 || p.seq_len > (int64_t(1) << 20))
      add(what + ".seq_len", "expected an integer in [2, 1048576], found " + std::to_string(p.seq_len));
    if (p.tokens < 0 || (p.tokens == 0 && !last))
      add(what + ".tokens",
          "expected a positive token budget" + std::string(last ? " or 0 (until the end)" : "") + ", found " +
              std::to_string(p.tokens),
          "only the last phase may be open-ended");
    else if (p.seq_len >= 2 && p.tokens % p.seq_len != 0)
      add(what + ".tokens", "expected a multiple of seq_len (" + std::to_string(p.seq_len) + "), found " +
                                std::to_string(p.tokens));
    if (!(p.rope_theta == 0 || (std::isfinite(p.rope_theta) && p.rope_theta > 1)))
      add(what + ".rope_theta", "expected 0 (unchanged) or a finite number > 1");
    if (!(std::isfinite(p.lr_scale) && p.lr_scale > 0)) add(what + ".lr_scale", "expected a finite number > 0");
    if (p.context_parallel < 0 || p.context_parallel > 1024)
      add(what + ".context_parallel", "expected 0 (parallel.context_parallel) or an integer in [1, 1024], found " +
                                          std::to_string(p.context_parallel));
    if (p.mixture.empty()) add(what + ".mixture", "expected at least one dataset weight");
    for (const RecipeMixtureWeight& w : p.mixture) {
      if (!names.count(w.dataset)) {
        std::string known;
        for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
        add(what + ".mixture." + w.dataset, "no dataset of that name is declared",
            "declared datasets: " + (known.empty() ? std::string("none") : known));
      }
      if (!(std::isfinite(w.weight) && w.weight > 0))
        add(what + ".mixture." + w.dataset, "expected a weight > 0");
    }
  }
}

std::string phases_to_toml(const Recipe& r) {
  if (r.data.datasets.empty() && r.phases.empty()) return "";
  toml::table root;
  if (!r.data.datasets.empty()) {
    toml::array ds;
    for (const RecipeDataset& d : r.data.datasets) ds.push_back(toml::table{{"name", d.name}, {"dir", d.dir}});
    root.insert("data", toml::table{{"datasets", ds}});
  }
  if (!r.phases.empty()) {
    toml::array ps;
    for (const RecipePhase& p : r.phases) {
      toml::table mix;
      for (const RecipeMixtureWeight& w : p.mixture) mix.insert(w.dataset, w.weight);
      mix.is_inline(true);
      toml::table t{{"name", p.name},         {"tokens", p.tokens},         {"seq_len", p.seq_len},
                    {"mixture", mix},         {"rope_theta", p.rope_theta}, {"lr_scale", p.lr_scale}};
      if (p.context_parallel > 0) t.insert("context_parallel", p.context_parallel);
      ps.push_back(std::move(t));
    }
    root.insert("phases", ps);
  }
  std::ostringstream ss;
  ss << root;
  return "\n" + ss.str() + "\n";
}

}  // namespace zaya::recipe_detail
