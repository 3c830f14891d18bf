// Training metrics: one JSON object per step appended to metrics.jsonl (flushed, so a crash
// loses nothing) and a loss-curve plot rendered to SVG.
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace zaya {

class MetricsLog {
 public:
  // append: keep existing lines (a resumed run continues the same file).
  MetricsLog(const std::string& path, bool append);
  ~MetricsLog();
  void write(const nlohmann::json& record);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

struct LossCurve {
  std::vector<double> steps, train_loss;
  std::vector<double> val_steps, val_loss;
  double baseline = 0;  // e.g. the unigram entropy, drawn as a dashed line (0 = none)
};

// Writes an SVG line plot (train loss, validation points, baseline).
void write_loss_plot(const std::string& path, const LossCurve& curve, const std::string& title);

}  // namespace zaya
