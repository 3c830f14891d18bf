// Mixture-weighted totals per phase (see phase_report.h).
#include "data/phase_report.h"

#include <cstdio>
#include <map>

#include "data/shard_reader.h"

namespace zaya {

std::vector<PhaseMixtureRow> phase_mixture(const std::vector<PhaseSpec>& phases, int64_t last_phase_tokens) {
  std::map<std::string, uint64_t> opened;  // dir -> train tokens
  std::vector<std::vector<uint64_t>> tokens(phases.size());
  for (size_t p = 0; p < phases.size(); ++p)
    for (const DatasetSpec& d : phases[p].mixture) {
      auto it = opened.find(d.dir);
      if (it == opened.end()) it = opened.emplace(d.dir, ShardDataset::open(d.dir).tokens()).first;
      tokens[p].push_back(it->second);
    }
  MixtureSampler sampler(PhasePlan(phases), tokens);
  std::vector<PhaseMixtureRow> rows;
  for (size_t p = 0; p < phases.size(); ++p) {
    const int64_t budget = phases[p].tokens > 0 ? phases[p].tokens : (p + 1 == phases.size() ? last_phase_tokens : 0);
    for (size_t d = 0; d < phases[p].mixture.size(); ++d) {
      PhaseMixtureRow r;
      r.phase = phases[p].name;
      r.dataset = phases[p].mixture[d].name;
      r.share = double(sampler.block_slots(p, d)) / double(kMixtureBlock);
      r.tokens = r.share * double(budget);
      r.available = tokens[p][d];
      r.epochs = r.available ? r.tokens / double(r.available) : 0;
      rows.push_back(r);
    }
  }
  return rows;
}

std::string format_phase_mixture(const std::vector<PhaseSpec>& phases, const std::vector<PhaseMixtureRow>& rows,
                                 int64_t last_phase_tokens) {
  std::string out;
  char line[256];
  std::map<std::string, double> per_dataset;
  double total = 0;
  size_t k = 0;
  for (size_t p = 0; p < phases.size(); ++p) {
    const PhaseSpec& ph = phases[p];
    const bool open = ph.tokens == 0;
    std::snprintf(line, sizeof line, "phase %zu '%s': %s tokens%s at seq_len %lld%s%s\n", p + 1, ph.name.c_str(),
                  open ? (last_phase_tokens ? std::to_string(last_phase_tokens).c_str() : "open-ended") :
                         std::to_string(ph.tokens).c_str(),
                  open && last_phase_tokens ? " (to the end of the schedule)" : "", (long long)ph.seq_len,
                  ph.rope_theta > 0 ? (", RoPE theta " + std::to_string(int64_t(ph.rope_theta))).c_str() : "",
                  ph.lr_scale != 1 ? (", LR x" + std::to_string(ph.lr_scale).substr(0, 4)).c_str() : "");
    out += line;
    out += "  dataset            share      tokens drawn   train tokens   epochs\n";
    for (; k < rows.size() && rows[k].phase == ph.name; ++k) {
      const PhaseMixtureRow& r = rows[k];
      std::snprintf(line, sizeof line, "  %-16s %6.2f%%  %15.0f  %13llu  %7.3f\n", r.dataset.c_str(), 100 * r.share,
                    r.tokens, (unsigned long long)r.available, r.epochs);
      out += line;
      per_dataset[r.dataset] += r.tokens;
      total += r.tokens;
    }
  }
  if (total > 0) {
    out += "whole run (mixture-weighted):\n";
    for (const auto& [name, t] : per_dataset) {
      std::snprintf(line, sizeof line, "  %-16s %15.0f tokens  %6.2f%%\n", name.c_str(), t, 100 * t / total);
      out += line;
    }
    std::snprintf(line, sizeof line, "  %-16s %15.0f tokens\n", "total", total);
    out += line;
  }
  return out;
}

}  // namespace zaya
