// Routed optimizer: routing, state arenas, the routing table and checkpoint state access.
// The per-tensor updates live in muon.cpp and adamw.cpp.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

#include "core/error.h"

namespace zaya {

namespace {

int64_t aligned16(int64_t n) { return (n + 15) / 16 * 16; }

std::string fmt_g(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

void check_range(const char* field, double v, double lo, double hi, bool lo_open, bool hi_open) {
  bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok)
    fail("optimizer", std::string("config field '") + field + "' = " + fmt_g(v) + " is out of range " +
                          (lo_open ? "(" : "[") + fmt_g(lo) + ", " + fmt_g(hi) + (hi_open ? ")" : "]"));
}

}  // namespace

void validate_optimizer_config(const OptimizerConfig& c) {
  check_range("lr", c.lr, 0, 1e3, false, false);
  check_range("weight_decay", c.weight_decay, 0, 1e3, false, false);
  check_range("muon_momentum", c.muon_momentum, 0, 1, false, true);
  if (c.ns_steps < 1 || c.ns_steps > 100)
    fail("optimizer", "config field 'ns_steps' = " + std::to_string(c.ns_steps) + " must be in [1, 100]",
         "Muon without Newton-Schulz would silently become SGD with momentum");
  check_range("muon_scale", c.muon_scale, 0, 1e3, true, false);
  check_range("adam_beta1", c.adam_beta1, 0, 1, false, true);
  check_range("adam_beta2", c.adam_beta2, 0, 1, false, true);
  check_range("adam_eps", c.adam_eps, 0, 1, true, false);
}

const char* optim_kind_name(OptimKind k) {
  switch (k) {
    case OptimKind::Muon: return "muon";
    case OptimKind::AdamW: return "adamw";
    case OptimKind::None: return "none";
  }
  return "?";
}

double newton_schulz_flops(int64_t rows, int64_t cols, int ns_steps) {
  const double m = double(std::min(rows, cols)), n = double(std::max(rows, cols));
  return double(ns_steps) * (4.0 * m * m * n + 2.0 * m * m * m);
}

ParamRoute route_param(const ParamSpec& p) {
  ParamRoute r;
  switch (p.kind) {
    case ParamKind::Matrix:
      r.kind = OptimKind::Muon;
      r.weight_decay = true;
      if (p.shape.size() == 2) {
        r.matrices = 1, r.rows = p.shape[0], r.cols = p.shape[1];
      } else if (p.shape.size() == 3) {
        r.matrices = p.shape[0], r.rows = p.shape[1], r.cols = p.shape[2];
      } else {
        fail("optimizer", "Muon tensor '" + p.name + "' has shape " + shape_str(p.shape) +
                              "; expected a 2-D matrix or stacked experts [E, rows, cols]");
      }
      break;
    case ParamKind::Embedding:
    case ParamKind::Conv:
      r.kind = OptimKind::AdamW;
      r.weight_decay = true;
      break;
    case ParamKind::Vector:
      r.kind = OptimKind::AdamW;
      r.weight_decay = false;
      break;
    case ParamKind::Buffer:
      r.kind = OptimKind::None;
      break;
  }
  return r;
}

std::string route_name(const ParamSpec& p) {
  ParamRoute r = route_param(p);
  if (r.kind == OptimKind::Muon) return p.shape.size() == 3 ? "muon_per_expert" : "muon";
  return optim_kind_name(r.kind);
}

Optimizer::Optimizer(const ParamLayout& layout, const OptimizerConfig& cfg, Backend& be, std::vector<bool> owned)
    : layout_(layout), cfg_(cfg), be_(be), owned_(std::move(owned)) {
  validate_optimizer_config(cfg_);
  const size_t np = layout_.params.size();
  if (owned_.empty()) owned_.assign(np, true);
  if (owned_.size() != np)
    fail("optimizer", "ownership mask has " + std::to_string(owned_.size()) + " entries for a layout of " +
                          std::to_string(np) + " tensors");
  routes_.resize(np);
  steps_.assign(np, 0);
  for (size_t i = 0; i < np; ++i) routes_[i] = route_param(layout_.params[i]);
  int64_t max_matrix = 0;
  for (size_t i = 0; i < np; ++i) {
    if (!owned_[i]) continue;
    const ParamSpec& p = layout_.params[i];
    ParamRoute& r = routes_[i];
    if (r.kind != OptimKind::None) {
      r.moment1_offset = m1_size_;
      m1_size_ += aligned16(p.numel);
    }
    if (r.kind == OptimKind::Muon) {
      r.first_matrix = int64_t(muon_.size());
      for (int64_t e = 0; e < r.matrices; ++e) {
        MuonMatrix m;
        m.param = i;
        m.expert = p.shape.size() == 3 ? e : -1;
        m.offset = p.offset + e * r.rows * r.cols;
        m.rows = r.rows, m.cols = r.cols;
        muon_.push_back(m);
      }
      max_matrix = std::max(max_matrix, r.rows * r.cols * r.matrices);  // a tensor's experts at once
      owned_muon_floats_ += r.rows * r.cols * r.matrices;
    } else if (r.kind == OptimKind::AdamW) {
      r.moment2_offset = m2_size_;
      m2_size_ += aligned16(p.numel);
    }
  }
  ns_calls_.assign(muon_.size(), 0);
  largest_muon_ = max_matrix;
  m1_ = be_.alloc(m1_size_);
  m2_ = be_.alloc(m2_size_);
  be_.fill(m1_, 0.0f, m1_size_);
  be_.fill(m2_, 0.0f, m2_size_);
  set_newton_schulz_across_tensors(be_.newton_schulz_across_tensors());
}

void Optimizer::set_newton_schulz_across_tensors(bool across, int64_t workspace_floats) {
  if (workspace_floats < 0)
    fail("optimizer", "Newton-Schulz workspace of " + std::to_string(workspace_floats) +
                          " floats; expected >= 0 (0: the default)");
  int64_t size = largest_muon_;
  if (across)
    size = std::max(largest_muon_,
                    std::min(owned_muon_floats_, workspace_floats > 0 ? workspace_floats : kNsGroupFloats));
  float* fresh = be_.alloc(size);  // before the old one goes: a failed allocation leaves it in place
  be_.free(work_);
  work_ = fresh;
  work_size_ = size;
  ns_across_ = across;
}

Optimizer::~Optimizer() {
  be_.free(m1_);
  be_.free(m2_);
  be_.free(work_);
}

void Optimizer::step(float* params, const float* grads, float lr) {
  step_range(0, layout_.params.size(), params, grads, lr);
}

void Optimizer::step_range(size_t first, size_t last, float* params, const float* grads, float lr) {
  if (first > last || last > layout_.params.size())
    fail("optimizer", "step_range [" + std::to_string(first) + ", " + std::to_string(last) +
                          ") is outside the layout's " + std::to_string(layout_.params.size()) + " tensors");
  if (!std::isfinite(lr) || lr < 0) fail("optimizer", "learning rate " + fmt_g(lr) + " is not a finite value >= 0");
  // Muon tensors in batches: each alone, or those of one matrix shape together (shapes in the
  // order they first appear, tensors in layout order) as the workspace holds them.
  std::vector<std::vector<size_t>> batches;
  std::vector<int64_t> batch_floats;
  std::vector<std::pair<int64_t, int64_t>> batch_shape;
  for (size_t i = first; i < last; ++i) {
    if (!owned_[i]) continue;
    const ParamRoute& r = routes_[i];
    if (r.kind == OptimKind::AdamW) adamw_step(i, params, grads, lr);
    if (r.kind != OptimKind::Muon) continue;
    const int64_t floats = r.rows * r.cols * r.matrices;
    size_t b = batches.size();
    if (ns_across_)  // the last open batch of this shape, when the tensor fits in it
      for (size_t k = batches.size(); k-- > 0;)
        if (batch_shape[k] == std::make_pair(r.rows, r.cols)) {
          if (batch_floats[k] + floats <= work_size_) b = k;
          break;
        }
    if (b == batches.size()) {
      batches.emplace_back();
      batch_floats.push_back(0);
      batch_shape.emplace_back(r.rows, r.cols);
    }
    batches[b].push_back(i);
    batch_floats[b] += floats;
  }
  for (const std::vector<size_t>& batch : batches) muon_step(batch, params, grads, lr);
}

std::string Optimizer::routing_table() const {
  size_t wname = 4, wshape = 5;
  std::vector<std::string> shapes, opts;
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    const ParamSpec& p = layout_.params[i];
    const ParamRoute& r = routes_[i];
    shapes.push_back(shape_str(p.shape));
    std::string o = optim_kind_name(r.kind);
    if (r.kind == OptimKind::Muon && p.shape.size() == 3)
      o += " x" + std::to_string(r.matrices) + " " + shape_str({r.rows, r.cols});
    if (r.kind == OptimKind::None) o += " (balancer)";
    opts.push_back(o);
    wname = std::max(wname, p.name.size());
    wshape = std::max(wshape, shapes.back().size());
  }
  size_t wopt = 9;
  for (auto& o : opts) wopt = std::max(wopt, o.size());
  auto pad = [](std::string s, size_t w) {
    s.resize(std::max(s.size(), w), ' ');
    return s;
  };
  std::ostringstream os;
  os << "optimizer routing: Muon (momentum " << fmt_g(cfg_.muon_momentum) << (cfg_.nesterov ? " nesterov" : "")
     << ", " << cfg_.ns_steps << " Newton-Schulz steps, scale " << fmt_g(cfg_.muon_scale)
     << "*sqrt(max(rows,cols))), AdamW (betas " << fmt_g(cfg_.adam_beta1) << "/" << fmt_g(cfg_.adam_beta2)
     << ", eps " << fmt_g(cfg_.adam_eps) << "), decoupled weight decay " << fmt_g(cfg_.weight_decay) << "\n";
  os << pad("name", wname) << "  " << pad("shape", wshape) << "  " << pad("optimizer", wopt) << "  wd\n";
  int64_t n_muon_mat = 0, n_muon = 0, n_adam = 0, n_adam_t = 0, n_none = 0, n_none_t = 0;
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    const ParamSpec& p = layout_.params[i];
    const ParamRoute& r = routes_[i];
    std::string wd = r.kind == OptimKind::None ? "-" : r.weight_decay ? fmt_g(cfg_.weight_decay) : "0";
    os << pad(p.name, wname) << "  " << pad(shapes[i], wshape) << "  " << pad(opts[i], wopt) << "  " << wd << "\n";
    if (r.kind == OptimKind::Muon) n_muon_mat += r.matrices, n_muon += p.numel;
    if (r.kind == OptimKind::AdamW) ++n_adam_t, n_adam += p.numel;
    if (r.kind == OptimKind::None) ++n_none_t, n_none += p.numel;
  }
  os << "totals: muon " << n_muon_mat << " matrices (" << n_muon << " params), adamw " << n_adam_t << " tensors ("
     << n_adam << " params), untouched " << n_none_t << " tensors (" << n_none << " values)\n";
  return os.str();
}

float* Optimizer::muon_momentum(const std::string& name) {
  const ParamSpec* p = layout_.find(name);
  if (!p) return nullptr;
  size_t i = layout_.index.at(name);
  if (!owned(i) || routes_[i].kind != OptimKind::Muon) return nullptr;
  return m1_ + routes_[i].moment1_offset;
}

float* Optimizer::adam_m(const std::string& name) {
  const ParamSpec* p = layout_.find(name);
  if (!p) return nullptr;
  size_t i = layout_.index.at(name);
  if (!owned(i) || routes_[i].kind != OptimKind::AdamW) return nullptr;
  return m1_ + routes_[i].moment1_offset;
}

float* Optimizer::adam_v(const std::string& name) {
  const ParamSpec* p = layout_.find(name);
  if (!p) return nullptr;
  size_t i = layout_.index.at(name);
  if (!owned(i) || routes_[i].kind != OptimKind::AdamW) return nullptr;
  return m2_ + routes_[i].moment2_offset;
}

std::vector<StateTensor> Optimizer::save_state() {
  std::vector<StateTensor> out;
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    if (!owned_[i]) continue;
    const ParamSpec& p = layout_.params[i];
    const ParamRoute& r = routes_[i];
    if (r.kind == OptimKind::Muon) {
      out.push_back({"muon_momentum." + p.name, m1_ + r.moment1_offset, p.numel, p.shape});
    } else if (r.kind == OptimKind::AdamW) {
      out.push_back({"adam_m." + p.name, m1_ + r.moment1_offset, p.numel, p.shape});
      out.push_back({"adam_v." + p.name, m2_ + r.moment2_offset, p.numel, p.shape});
    }
  }
  return out;
}

void Optimizer::load_state(const std::vector<StateTensor>& in) {
  std::map<std::string, StateTensor> want;
  for (StateTensor& t : save_state()) want[t.name] = t;
  std::map<std::string, int> seen;
  for (const StateTensor& t : in) {
    auto it = want.find(t.name);
    if (it == want.end())
      fail("optimizer", "checkpoint has optimizer state '" + t.name + "' that this optimizer does not own",
           "the model shape, the optimizer routing or the ZeRO-1 shard differs from the checkpoint's");
    if (t.numel != it->second.numel)
      fail("optimizer", "optimizer state '" + t.name + "' has " + std::to_string(t.numel) + " values, expected " +
                            std::to_string(it->second.numel));
    if (seen[t.name]++) fail("optimizer", "optimizer state '" + t.name + "' is given twice");
    ZAYA_CHECK(t.data != nullptr || t.numel == 0, "load_state: null data");
    be_.from_host(it->second.data, t.data, t.numel * int64_t(sizeof(float)));
  }
  for (const auto& [name, t] : want)
    if (!seen.count(name)) fail("optimizer", "checkpoint lacks optimizer state '" + name + "'");
}

std::vector<StateCounter> Optimizer::save_counters() const {
  std::vector<StateCounter> out;
  for (size_t i = 0; i < layout_.params.size(); ++i)
    if (owned_[i] && routes_[i].kind != OptimKind::None) out.push_back({"step." + layout_.params[i].name, steps_[i]});
  return out;
}

void Optimizer::load_counters(const std::vector<StateCounter>& in) {
  std::map<std::string, int64_t> got;
  for (const StateCounter& c : in) {
    if (c.value < 0) fail("optimizer", "optimizer counter '" + c.name + "' is negative");
    if (!got.emplace(c.name, c.value).second) fail("optimizer", "optimizer counter '" + c.name + "' is given twice");
  }
  std::vector<StateCounter> want = save_counters();
  if (got.size() != want.size()) {
    for (const StateCounter& w : want)
      if (!got.count(w.name)) fail("optimizer", "checkpoint lacks optimizer counter '" + w.name + "'");
    for (const auto& [name, v] : got) {
      bool known = std::any_of(want.begin(), want.end(), [&](const StateCounter& w) { return w.name == name; });
      if (!known) fail("optimizer", "checkpoint has optimizer counter '" + name + "' that this optimizer does not own");
    }
  }
  for (size_t i = 0; i < layout_.params.size(); ++i) {
    if (!owned_[i] || routes_[i].kind == OptimKind::None) continue;
    auto it = got.find("step." + layout_.params[i].name);
    if (it == got.end()) fail("optimizer", "checkpoint lacks optimizer counter 'step." + layout_.params[i].name + "'");
    steps_[i] = it->second;
  }
}

}  // namespace zaya
