// Adam-style selection-bias controller (spec §B, decision 4).
#include "train/balancer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"

namespace zaya {

namespace {

const char* kSuffix = ".mlp.gate.balancing_biases";

std::string fmt(const char* f, double v) {
  char buf[48];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

void validate_balancer_config(const BalancerConfig& c, int64_t E) {
  auto bad = [](const std::string& field, double v, const std::string& want) {
    fail("balancer", "config field '" + field + "' = " + fmt("%g", v) + " " + want);
  };
  if (!(std::isfinite(c.lr) && c.lr >= 0)) bad("lr", c.lr, "must be finite and >= 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1)) bad("beta1", c.beta1, "must be in [0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) bad("beta2", c.beta2, "must be in [0, 1)");
  if (!(c.eps > 0 && std::isfinite(c.eps))) bad("eps", c.eps, "must be > 0");
  if (!(c.skip_target >= 0 && c.skip_target < 1)) bad("skip_target", c.skip_target, "must be in [0, 1)");
  if (!c.target.empty()) {
    if (int64_t(c.target.size()) != E)
      fail("balancer", "config field 'target' has " + std::to_string(c.target.size()) + " entries, expected one per "
                       "real expert (" + std::to_string(E) + ")");
    double sum = 0;
    for (double t : c.target) {
      if (!(t >= 0 && t <= 1)) bad("target", t, "entries must be in [0, 1]");
      sum += t;
    }
    if (std::fabs(sum - 1.0) > 1e-6) bad("target", sum, "(the sum) must be 1");
  }
}

BalanceLayerMetrics balance_metrics(const int64_t* counts, int64_t E) {
  BalanceLayerMetrics m;
  m.load.assign(static_cast<size_t>(E), 0.0);
  int64_t real = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (counts[e] < 0) fail("balancer", "negative token count " + std::to_string(counts[e]));
    real += counts[e];
    if (counts[e] == 0) ++m.dead_experts;
  }
  if (counts[E] < 0) fail("balancer", "negative skip count " + std::to_string(counts[E]));
  m.tokens = real + counts[E];
  m.skip_rate = m.tokens > 0 ? double(counts[E]) / double(m.tokens) : 0.0;
  if (real > 0) {
    double h = 0, mx = 0;
    for (int64_t e = 0; e < E; ++e) {
      double f = double(counts[e]) / double(real);
      m.load[size_t(e)] = f;
      if (f > 0) h -= f * std::log(f);
      mx = std::max(mx, f);
    }
    m.entropy = E > 1 ? h / std::log(double(E)) : 1.0;
    m.max_load = mx * double(E);
  }
  return m;
}

BiasBalancer::BiasBalancer(const ParamLayout& layout, const BalancerConfig& cfg, Backend& be) : cfg_(cfg), be_(be) {
  std::map<int64_t, const ParamSpec*> by_layer;
  for (const ParamSpec& p : layout.params) {
    if (!p.name.ends_with(kSuffix)) continue;
    const std::string pre = "model.layers.";
    std::string mid = p.name.substr(0, p.name.size() - std::string(kSuffix).size());
    if (mid.compare(0, pre.size(), pre) != 0)
      fail("balancer", "balancing-bias tensor '" + p.name + "' is not under model.layers.K");
    const std::string digits = mid.substr(pre.size());
    if (digits.empty() || digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), ::isdigit))
      fail("balancer", "balancing-bias tensor '" + p.name + "' has no layer number after model.layers.");
    const int64_t k = std::stoll(digits);
    if (p.shape.size() != 1 || p.shape[0] < 2)
      fail("balancer", "balancing-bias tensor '" + p.name + "' has shape " + shape_str(p.shape) + ", expected [E+1]");
    if (p.kind != ParamKind::Buffer)
      fail("balancer", "balancing-bias tensor '" + p.name + "' is not a Buffer", "the optimizer would also train it");
    by_layer[k] = &p;
  }
  if (by_layer.empty()) fail("balancer", "the parameter layout has no '*" + std::string(kSuffix) + "' tensors");
  int64_t expect = 0;
  for (const auto& [k, p] : by_layer) {
    if (k != expect) fail("balancer", "no balancing biases for layer " + std::to_string(expect));
    ++expect;
    if (E_ == 0) E_ = p->shape[0] - 1;
    if (p->shape[0] - 1 != E_)
      fail("balancer", "balancing-bias tensor '" + p->name + "' has " + std::to_string(p->shape[0]) +
                           " classes, layer 0 has " + std::to_string(E_ + 1));
    bias_names_.push_back(p->name);
    bias_offsets_.push_back(p->offset);
  }
  validate_balancer_config(cfg_, E_);
  target_ = cfg_.target.empty() ? std::vector<double>(size_t(E_), 1.0 / double(E_)) : cfg_.target;
  const size_t L = bias_offsets_.size();
  m_.assign(L * size_t(E_ + 1), 0.0f);
  v_.assign(L * size_t(E_ + 1), 0.0f);
  steps_.assign(L, 0);
  skip_steps_.assign(L, 0);
  metrics_.resize(L);
}

const std::vector<BalanceLayerMetrics>& BiasBalancer::step(const std::vector<int64_t>& counts, float* params) {
  if (int64_t(counts.size()) != layers() * (E_ + 1))
    fail("balancer", "got " + std::to_string(counts.size()) + " token counts, expected layers x classes = " +
                         std::to_string(layers()) + " x " + std::to_string(E_ + 1));
  return step(counts.data(), params);
}

const std::vector<BalanceLayerMetrics>& BiasBalancer::step(const int64_t* counts, float* params) {
  const int64_t C = E_ + 1;
  const double b1 = cfg_.beta1, b2 = cfg_.beta2;
  std::vector<float> b(static_cast<size_t>(C));
  for (int64_t l = 0; l < layers(); ++l) {
    const int64_t* cnt = counts + l * C;
    BalanceLayerMetrics met = balance_metrics(cnt, E_);
    float* m = m_.data() + l * C;
    float* v = v_.data() + l * C;
    bool changed = false;
    be_.to_host(b.data(), params + bias_offsets_[size_t(l)], C * int64_t(sizeof(float)));
    auto adam = [&](int64_t e, double g, int64_t t) {
      double mm = b1 * double(m[e]) + (1 - b1) * g;
      double vv = b2 * double(v[e]) + (1 - b2) * g * g;
      m[e] = float(mm);
      v[e] = float(vv);
      double mh = mm / (1 - std::pow(b1, double(t)));
      double vh = vv / (1 - std::pow(b2, double(t)));
      b[size_t(e)] = float(double(b[size_t(e)]) - cfg_.lr * mh / (std::sqrt(vh) + cfg_.eps));
    };
    if (met.tokens - cnt[E_] > 0) {
      const int64_t t = ++steps_[size_t(l)];
      for (int64_t e = 0; e < E_; ++e) adam(e, met.load[size_t(e)] - target_[size_t(e)], t);
      met.updated = changed = true;
    }
    if (cfg_.balance_skip && met.tokens > 0) {
      const int64_t t = ++skip_steps_[size_t(l)];
      adam(E_, met.skip_rate - cfg_.skip_target, t);
      changed = true;
    }
    if (changed) be_.from_host(params + bias_offsets_[size_t(l)], b.data(), C * int64_t(sizeof(float)));
    metrics_[size_t(l)] = std::move(met);
  }
  return metrics_;
}

std::string BiasBalancer::metrics_summary() const {
  std::ostringstream os;
  for (int64_t l = 0; l < layers(); ++l) {
    const BalanceLayerMetrics& m = metrics_[size_t(l)];
    os << "layer " << l << ": entropy " << fmt("%.4f", m.entropy) << " max_load " << fmt("%.3f", m.max_load)
       << " skip " << fmt("%.4f", m.skip_rate) << " dead " << m.dead_experts << "/" << E_ << " tokens " << m.tokens
       << (m.updated ? "" : " (no update)") << "\n";
  }
  return os.str();
}

std::vector<StateTensor> BiasBalancer::save_state() {
  std::vector<StateTensor> out;
  const int64_t C = E_ + 1;
  for (int64_t l = 0; l < layers(); ++l) {
    out.push_back({"balancer_m." + bias_names_[size_t(l)], m_.data() + l * C, C, {C}});
    out.push_back({"balancer_v." + bias_names_[size_t(l)], v_.data() + l * C, C, {C}});
  }
  return out;
}

void BiasBalancer::load_state(const std::vector<StateTensor>& in) {
  std::map<std::string, StateTensor> want;
  for (StateTensor& t : save_state()) want[t.name] = t;
  std::map<std::string, int> seen;
  for (const StateTensor& t : in) {
    auto it = want.find(t.name);
    if (it == want.end()) fail("balancer", "checkpoint has balancer state '" + t.name + "' that this model lacks");
    if (t.numel != it->second.numel)
      fail("balancer", "balancer state '" + t.name + "' has " + std::to_string(t.numel) + " values, expected " +
                           std::to_string(it->second.numel));
    if (seen[t.name]++) fail("balancer", "balancer state '" + t.name + "' is given twice");
    std::copy(t.data, t.data + t.numel, it->second.data);
  }
  for (const auto& [name, t] : want)
    if (!seen.count(name)) fail("balancer", "checkpoint lacks balancer state '" + name + "'");
}

std::vector<StateCounter> BiasBalancer::save_counters() const {
  std::vector<StateCounter> out;
  for (int64_t l = 0; l < layers(); ++l) {
    out.push_back({"balancer_step." + bias_names_[size_t(l)], steps_[size_t(l)]});
    out.push_back({"balancer_skip_step." + bias_names_[size_t(l)], skip_steps_[size_t(l)]});
  }
  return out;
}

void BiasBalancer::load_counters(const std::vector<StateCounter>& in) {
  std::map<std::string, int64_t*> want;
  for (int64_t l = 0; l < layers(); ++l) {
    want["balancer_step." + bias_names_[size_t(l)]] = &steps_[size_t(l)];
    want["balancer_skip_step." + bias_names_[size_t(l)]] = &skip_steps_[size_t(l)];
  }
  std::map<std::string, int64_t> got;
  for (const StateCounter& c : in) {
    if (!want.count(c.name)) fail("balancer", "checkpoint has balancer counter '" + c.name + "' that this model lacks");
    if (c.value < 0) fail("balancer", "balancer counter '" + c.name + "' is negative");
    if (!got.emplace(c.name, c.value).second) fail("balancer", "balancer counter '" + c.name + "' is given twice");
  }
  for (const auto& [name, p] : want) {
    auto it = got.find(name);
    if (it == got.end()) fail("balancer", "checkpoint lacks balancer counter '" + name + "'");
    *p = it->second;
  }
}

}  // namespace zaya
