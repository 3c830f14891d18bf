// The routed optimizer of project decision 5 (spec C.3-C.5): Muon for every 2-D hidden matrix
// (each expert of a stacked [E, r, c] tensor is its own Muon matrix), AdamW for the embedding,
// the untied LM head, the conv weights and every 1-D tensor. Decoupled weight decay on Muon
// matrices, Embedding and Conv tensors, none on Vector (1-D) tensors. Buffer tensors (the
// balancing biases, owned by BiasBalancer) are never touched.
//
// All math runs through Backend ops (newton_schulz, muon_momentum, muon_update, adamw_update),
// so params, grads and state are backend memory laid out by the ParamLayout.
//
// State layout (for ZeRO-1 sharding and checkpoints). A ZeRO-1 rank owns an arbitrary set of
// whole tensors (the owned mask; distributed Muon assigns them by bin packing on Newton-Schulz
// cost) and holds state only for those:
//   moment1: compact fp32 arena over the owned tensors in layout order, each 16-float aligned
//            (route(i).moment1_offset). Holds the Muon momentum of Muon tensors and AdamW's m.
//   moment2: AdamW's v, compact: only owned AdamW tensors, in layout order, each 16-float
//            aligned (route(i).moment2_offset). Muon has no second moment.
//   step counts: per tensor, the number of steps applied (AdamW bias correction uses it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/params.h"

namespace zaya {

struct OptimizerConfig {
  double lr = 4e-4;             // default peak LR; step() takes the scheduled value
  double weight_decay = 0.1;    // decoupled; Muon matrices, Embedding, Conv
  double muon_momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;             // must be >= 1: Muon never degrades to SGD
  double muon_scale = 0.2;      // update = muon_scale * sqrt(max(rows, cols)) * NS(U)
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
};
// Throws zaya::Error naming the field for an out-of-range value.
void validate_optimizer_config(const OptimizerConfig& c);

enum class OptimKind { Muon, AdamW, None };
const char* optim_kind_name(OptimKind k);  // "muon", "adamw", "none"

// How one parameter tensor is optimised.
struct ParamRoute {
  OptimKind kind = OptimKind::None;
  bool weight_decay = false;
  int64_t matrices = 0;         // Muon: number of independent matrices (E for stacked experts, else 1)
  int64_t rows = 0, cols = 0;   // Muon: shape of each matrix
  int64_t first_matrix = -1;    // Muon: index of its first matrix in muon_matrices()
  int64_t moment1_offset = -1;  // owned Muon/AdamW: offset of its momentum / m in the moment1 arena
  int64_t moment2_offset = -1;  // owned AdamW: offset of its v in the moment2 arena
};

// Routing of one tensor by its ParamKind (decision 5). Matrix tensors must be 2-D or 3-D.
ParamRoute route_param(const ParamSpec& p);

// Matmul FLOPs of Newton-Schulz on one rows x cols matrix: per step A = X X^T (2 m^2 n),
// A A (2 m^3) and B X (2 m^2 n), with m = min(rows, cols), n = max(rows, cols).
double newton_schulz_flops(int64_t rows, int64_t cols, int ns_steps);
// Fixture-style name: "muon", "muon_per_expert" (3-D Matrix), "adamw" or "none".
std::string route_name(const ParamSpec& p);

// One Muon matrix: the whole tensor, or one expert slice of a stacked tensor.
struct MuonMatrix {
  size_t param = 0;     // index in ParamLayout::params
  int64_t expert = -1;  // slice index for stacked experts, -1 for a plain 2-D tensor
  int64_t offset = 0;   // in floats, into the parameter arena
  int64_t rows = 0, cols = 0;
};

// A named view of one piece of optimizer state, for checkpoints. Names:
// "muon_momentum.NAME", "adam_m.NAME", "adam_v.NAME" (NAME = canonical tensor name).
struct StateTensor {
  std::string name;
  float* data = nullptr;  // backend memory
  int64_t numel = 0;
  std::vector<int64_t> shape;
};
struct StateCounter {
  std::string name;  // "step.NAME"
  int64_t value = 0;
};

class Optimizer {
 public:
  // Owns state for the tensors with owned[i] true (empty = every tensor); a ZeRO-1 rank passes
  // its shard. Allocates and zeroes the state arenas on `be`, which must outlive the
  // optimizer. The layout is copied.
  Optimizer(const ParamLayout& layout, const OptimizerConfig& cfg, Backend& be, std::vector<bool> owned = {});
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One step on every owned parameter. params/grads: full parameter arenas (layout().total
  // floats, backend memory); only owned tensors' gradients are read. lr: the scheduled LR.
  void step(float* params, const float* grads, float lr);
  // One step on the owned tensors among [first, last) (indices into layout().params). Steps on
  // disjoint ranges compose to exactly one step() when Newton-Schulz runs per tensor (with it
  // across tensors, to within the rounding of how the backend batches); the step counts are per
  // tensor.
  void step_range(size_t first, size_t last, float* params, const float* grads, float lr);

  const ParamLayout& layout() const { return layout_; }
  const OptimizerConfig& config() const { return cfg_; }
  bool owns(size_t i) const { return owned_[i]; }
  const ParamRoute& route(size_t i) const { return routes_[i]; }

  // name, shape, optimizer, weight decay per tensor, plus totals. Printed by the trainer.
  std::string routing_table() const;

  // Muon matrices of the owned range, in layout order, and how many times each has been
  // orthogonalised by Newton-Schulz (exactly once per step that covered it).
  const std::vector<MuonMatrix>& muon_matrices() const { return muon_; }
  const std::vector<int64_t>& ns_calls() const { return ns_calls_; }

  // Newton-Schulz batching. Per tensor (a tensor's experts in one newton_schulz_batched call), or
  // across tensors: the owned Muon matrices of one shape among a step's tensors go together, in
  // layout order, in batches of at most `workspace_floats` elements (0: the larger of the largest
  // tensor and kNsGroupFloats). The default is the backend's preference
  // (Backend::newton_schulz_across_tensors). Reallocates the workspace.
  void set_newton_schulz_across_tensors(bool across, int64_t workspace_floats = 0);
  bool newton_schulz_across_tensors() const { return ns_across_; }
  static constexpr int64_t kNsGroupFloats = int64_t(16) << 20;  // 64 MiB of fp32
  // newton_schulz_batched calls made so far.
  int64_t ns_batches() const { return ns_batches_; }

  // State arenas (backend memory) and per-tensor step counts (0 for tensors not owned).
  float* moment1() { return m1_; }
  int64_t moment1_size() const { return m1_size_; }
  float* moment2() { return m2_; }
  int64_t moment2_size() const { return m2_size_; }
  const std::vector<int64_t>& step_counts() const { return steps_; }

  // State of one tensor by canonical name; nullptr if it has none (wrong kind / not owned).
  float* muon_momentum(const std::string& name);
  float* adam_m(const std::string& name);
  float* adam_v(const std::string& name);

  // Checkpoint helpers. save_state() lists every state tensor of the owned tensors as views into
  // the arenas (backend memory; copy them out with Backend::to_host). load_state() copies each
  // entry (data = HOST memory, via Backend::from_host) into the matching state tensor; every
  // owned state tensor must be present exactly once with the right numel, and no other,
  // otherwise it throws naming the tensor. Counters ("step.NAME" per routed tensor) likewise.
  std::vector<StateTensor> save_state();
  void load_state(const std::vector<StateTensor>& in);
  std::vector<StateCounter> save_counters() const;
  void load_counters(const std::vector<StateCounter>& in);

 private:
  // One Newton-Schulz batch: the Muon tensors `tensors` (owned, one matrix shape, together
  // within the workspace) stepped together. muon.cpp.
  void muon_step(const std::vector<size_t>& tensors, float* params, const float* grads, float lr);
  void adamw_step(size_t i, float* params, const float* grads, float lr);  // adamw.cpp
  bool owned(size_t i) const { return owned_[i]; }

  ParamLayout layout_;
  OptimizerConfig cfg_;
  Backend& be_;
  std::vector<bool> owned_;
  std::vector<ParamRoute> routes_;
  std::vector<MuonMatrix> muon_;
  std::vector<int64_t> ns_calls_;
  std::vector<int64_t> steps_;
  float* m1_ = nullptr;
  float* m2_ = nullptr;
  float* work_ =
      nullptr;  // NS input/output: the largest Muon tensor (all its experts), or a batch across tensors
  int64_t m1_size_ = 0, m2_size_ = 0, work_size_ = 0;
  int64_t largest_muon_ = 0, owned_muon_floats_ = 0;  // of the owned Muon tensors
  bool ns_across_ = false;
  int64_t ns_batches_ = 0;
};

}  // namespace zaya
