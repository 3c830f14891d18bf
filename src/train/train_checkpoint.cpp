// Trainer state <-> sharded checkpoints.
#include "train/train_checkpoint.h"

#include <cstring>
#include <utility>

#include "core/error.h"

namespace zaya {

std::vector<DistPiece> owned_pieces(TrainState& s) {
  std::vector<DistPiece> out;
  const ParamLayout& L = s.model.layout();
  for (size_t i = 0; i < L.params.size(); ++i)
    if (s.dp.owns(i)) {
      const ParamSpec& p = L.params[i];
      out.push_back({p.name, p.shape, 0, uint64_t(p.numel), s.model.params() + p.offset, "params"});
    }
  for (const StateTensor& t : s.optim.save_state())
    out.push_back({t.name, t.shape.empty() ? std::vector<int64_t>{t.numel} : t.shape, 0, uint64_t(t.numel), t.data,
                   "optimizer"});
  if (s.dp.rank() == 0)
    for (const StateTensor& t : s.balancer.save_state())
      out.push_back({t.name, t.shape.empty() ? std::vector<int64_t>{t.numel} : t.shape, 0, uint64_t(t.numel), t.data,
                     "balancer"});
  return out;
}

nlohmann::json all_counters(TrainState& s) {
  const ParamLayout& L = s.model.layout();
  std::vector<int64_t> steps(L.params.size(), 0);
  for (size_t i = 0; i < L.params.size(); ++i)
    if (s.dp.owns(i)) steps[i] = s.optim.step_counts()[i];
  s.dp.sum(steps.data(), int64_t(steps.size()));
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i < L.params.size(); ++i)
    if (route_param(L.params[i]).kind != OptimKind::None) out["optimizer.step." + L.params[i].name] = steps[i];
  for (const StateCounter& c : s.balancer.save_counters()) out["balancer." + c.name] = c.value;
  return out;
}

DistCopyFn state_copy_fn(TrainState& s, Backend& be) {
  // The balancer's state is host memory; parameters and optimizer state are the backend's.
  std::vector<std::pair<const char*, const char*>> host_ranges;
  for (const StateTensor& t : s.balancer.save_state()) {
    const char* p = reinterpret_cast<const char*>(t.data);
    host_ranges.push_back({p, p + t.numel * int64_t(sizeof(float))});
  }
  return [&be, host_ranges](void* dst, const void* src, size_t bytes) {
    const char* p = static_cast<const char*>(src);
    for (const auto& [lo, hi] : host_ranges)
      if (p >= lo && p < hi) {
        std::memcpy(dst, src, bytes);
        return;
      }
    be.to_host(dst, src, int64_t(bytes));
  };
}

void restore_state(TrainState& s, const DistCheckpoint& ck, Comm& comm) {
  const ParamLayout& L = s.model.layout();
  Backend& be = s.model.backend();
  // Parameters (the same on every rank) in batches of at most kStageBytes of host memory (a
  // larger tensor is a batch of its own): each batch is read collectively, then copied to the
  // backend on this thread (a GPU backend's device belongs to it).
  constexpr int64_t kStageBytes = int64_t(256) << 20;
  size_t next = 0;
  while (next < L.params.size()) {
    size_t end = next;
    int64_t bytes = 0;
    while (end < L.params.size() && (end == next || bytes + L.params[end].numel * 4 <= kStageBytes))
      bytes += L.params[end++].numel * 4;
    std::vector<std::vector<float>> host(end - next);
    std::vector<DistRead> reads;
    for (size_t i = next; i < end; ++i) {
      const ParamSpec& p = L.params[i];
      host[i - next].resize(size_t(p.numel));
      reads.push_back({p.name, p.shape, 0, 0, host[i - next].data()});
    }
    read_dist_tensors(ck, comm, reads);
    for (size_t i = next; i < end; ++i) {
      const ParamSpec& p = L.params[i];
      be.from_host(s.model.params() + p.offset, host[i - next].data(), p.numel * 4);
    }
    next = end;
  }
  // This rank's optimizer state (ZeRO-1: its own tensors) and the balancer's host state: one
  // more collective read on every rank.
  std::vector<StateTensor> os = s.optim.save_state();
  std::vector<std::vector<float>> host(os.size());
  std::vector<DistRead> reads;
  for (size_t k = 0; k < os.size(); ++k) {
    host[k].resize(size_t(os[k].numel));
    reads.push_back({os[k].name, {}, 0, uint64_t(os[k].numel), host[k].data()});
    os[k].data = host[k].data();
  }
  for (const StateTensor& t : s.balancer.save_state())
    reads.push_back({t.name, {}, 0, uint64_t(t.numel), t.data});
  read_dist_tensors(ck, comm, reads);
  s.optim.load_state(os);
  const nlohmann::json& counters = ck.meta().at("counters");
  auto counter = [&](const std::string& key) {
    if (!counters.contains(key)) fail("checkpoint", ck.dir() + ": the run's counters lack '" + key + "'");
    return counters.at(key).get<int64_t>();
  };
  std::vector<StateCounter> oc = s.optim.save_counters(), bc = s.balancer.save_counters();
  for (StateCounter& c : oc) c.value = counter("optimizer." + c.name);
  for (StateCounter& c : bc) c.value = counter("balancer." + c.name);
  s.optim.load_counters(oc);
  s.balancer.load_counters(bc);
}

}  // namespace zaya
