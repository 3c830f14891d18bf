// metrics.jsonl writer and the SVG loss-curve plot.
#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace zaya {

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!f_) fail("train", "cannot write metrics to " + path);
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const nlohmann::json& record) {
  std::string line = record.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size()) fail("train", "short write to " + path_);
  std::fflush(f_);
}

void write_loss_plot(const std::string& path, const LossCurve& c, const std::string& title) {
  const double W = 800, H = 480, left = 70, right = 20, top = 40, bottom = 50;
  double xmax = 1, ymin = INFINITY, ymax = -INFINITY;
  auto extend = [&](const std::vector<double>& xs, const std::vector<double>& ys) {
    for (size_t i = 0; i < xs.size(); ++i) {
      if (!std::isfinite(ys[i])) continue;
      xmax = std::max(xmax, xs[i]);
      ymin = std::min(ymin, ys[i]);
      ymax = std::max(ymax, ys[i]);
    }
  };
  extend(c.steps, c.train_loss);
  extend(c.val_steps, c.val_loss);
  if (c.baseline > 0) {
    ymin = std::min(ymin, c.baseline);
    ymax = std::max(ymax, c.baseline);
  }
  if (!std::isfinite(ymin)) { ymin = 0; ymax = 1; }
  if (ymax - ymin < 1e-6) ymax = ymin + 1;
  ymin = std::floor(ymin * 2) / 2;
  auto X = [&](double x) { return left + (W - left - right) * x / xmax; };
  auto Y = [&](double y) { return top + (H - top - bottom) * (1 - (y - ymin) / (ymax - ymin)); };
  std::ostringstream s;
  s << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif' font-size='12'>\n";
  s << "<rect width='100%' height='100%' fill='white'/>\n";
  s << "<text x='" << W / 2 << "' y='22' text-anchor='middle' font-size='15'>" << title << "</text>\n";
  for (int i = 0; i <= 5; ++i) {  // grid and axis labels
    double y = ymin + (ymax - ymin) * i / 5, x = xmax * i / 5;
    s << "<line x1='" << left << "' x2='" << W - right << "' y1='" << Y(y) << "' y2='" << Y(y) << "' stroke='#ddd'/>\n";
    s << "<text x='" << left - 8 << "' y='" << Y(y) + 4 << "' text-anchor='end'>" << std::round(y * 100) / 100 << "</text>\n";
    s << "<text x='" << X(x) << "' y='" << H - bottom + 18 << "' text-anchor='middle'>" << std::llround(x) << "</text>\n";
  }
  s << "<text x='" << W / 2 << "' y='" << H - 10 << "' text-anchor='middle'>step</text>\n";
  s << "<text transform='translate(18," << H / 2 << ") rotate(-90)' text-anchor='middle'>loss (nats/token)</text>\n";
  auto polyline = [&](const std::vector<double>& xs, const std::vector<double>& ys, const char* color) {
    s << "<polyline fill='none' stroke='" << color << "' stroke-width='1.5' points='";
    for (size_t i = 0; i < xs.size(); ++i)
      if (std::isfinite(ys[i])) s << X(xs[i]) << "," << Y(ys[i]) << " ";
    s << "'/>\n";
  };
  polyline(c.steps, c.train_loss, "#1f77b4");
  if (!c.val_steps.empty()) {
    polyline(c.val_steps, c.val_loss, "#d62728");
    for (size_t i = 0; i < c.val_steps.size(); ++i)
      s << "<circle cx='" << X(c.val_steps[i]) << "' cy='" << Y(c.val_loss[i]) << "' r='3' fill='#d62728'/>\n";
  }
  if (c.baseline > 0)
    s << "<line x1='" << left << "' x2='" << W - right << "' y1='" << Y(c.baseline) << "' y2='" << Y(c.baseline)
      << "' stroke='#555' stroke-dasharray='6,4'/>\n";
  s << "<text x='" << W - right - 230 << "' y='" << top + 16 << "' fill='#1f77b4'>train loss</text>\n";
  s << "<text x='" << W - right - 230 << "' y='" << top + 32 << "' fill='#d62728'>validation loss</text>\n";
  if (c.baseline > 0) s << "<text x='" << W - right - 230 << "' y='" << top + 48 << "' fill='#555'>unigram entropy baseline</text>\n";
  s << "</svg>\n";
  std::ofstream out(path);
  if (!out) fail("train", "cannot write plot " + path);
  out << s.str();
}

}  // namespace zaya
