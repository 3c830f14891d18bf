// ZeRO-1 data parallelism: tensor ownership by bin packing, bucketed owner-packed gradient
// reduce-scatters that start during the backward, and the parameter all-gather.
#include "train/data_parallel.h"

#include <algorithm>
#include <cstring>

#include "backend/backend.h"
#include "ckpt/ownership.h"
#include "core/error.h"

namespace zaya {
namespace {

// Block index of a "model.layers.N.*" tensor, -1 for the others (embedding, final norm, head).
int64_t block_of(const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  size_t end = name.find('.', prefix.size());
  return std::stoll(name.substr(prefix.size(), end - prefix.size()));
}

}  // namespace

double optimizer_cost(const ParamSpec& p, int ns_steps) {
  const ParamRoute r = route_param(p);
  if (r.kind == OptimKind::None) return 0;
  if (r.kind == OptimKind::AdamW) return 10.0 * double(p.numel);
  const double per_matrix = newton_schulz_flops(r.rows, r.cols, ns_steps) + 10.0 * double(r.rows * r.cols);
  return double(r.matrices) * per_matrix;
}

std::vector<int> assign_tensor_owners(const ParamLayout& layout, int ns_steps, int ranks) {
  std::vector<double> costs;
  for (const ParamSpec& p : layout.params) costs.push_back(optimizer_cost(p, ns_steps));
  return assign_whole_tensors(costs, ranks);
}

DataParallel::DataParallel(Comm& comm, const ParamLayout& layout, int ns_steps, DataParallelOptions options)
    : comm_(comm),
      data_comm_(options.data_comm),
      be_(options.backend),
      layout_(layout),
      owner_(assign_tensor_owners(layout, ns_steps, comm.size())) {
  if (data_comm_ && !be_) fail("train", "a device communicator needs the backend that owns the buffers");
  if (data_comm_ && (data_comm_->size() != comm_.size() || data_comm_->rank() != comm_.rank()))
    fail("train", "the device communicator's ranks differ from the job's");
  if (options.bucket_bytes < 4)
    fail("train", "data-parallel bucket size " + std::to_string(options.bucket_bytes) + " bytes is too small",
         "use at least a few MiB");
  const int R = comm_.size();
  // Tensors in the order the backward finishes them: blocks from the last down, then the rest.
  int64_t max_block = -1;
  for (const ParamSpec& p : layout_.params) max_block = std::max(max_block, block_of(p.name));
  std::vector<size_t> rest;
  Bucket current;
  int64_t bytes = 0;
  auto close = [&](int64_t last_block) {
    if (current.tensors.empty()) return;
    current.last_block = last_block;
    buckets_.push_back(std::move(current));
    current = Bucket{};
    bytes = 0;
  };
  for (int64_t l = max_block; l >= 0; --l) {
    for (size_t i = 0; i < layout_.params.size(); ++i)
      if (block_of(layout_.params[i].name) == l) {
        current.tensors.push_back(i);
        bytes += layout_.params[i].numel * 4;
      }
    if (bytes >= options.bucket_bytes) close(l);
  }
  for (size_t i = 0; i < layout_.params.size(); ++i)
    if (block_of(layout_.params[i].name) < 0) current.tensors.push_back(i);
  close(-1);
  // Pack every bucket by owner, then layout order.
  for (Bucket& b : buckets_) {
    std::sort(b.tensors.begin(), b.tensors.end(), [&](size_t x, size_t y) {
      return owner_[x] != owner_[y] ? owner_[x] < owner_[y] : x < y;
    });
    b.counts.assign(size_t(R), 0);
    for (size_t i : b.tensors) b.counts[size_t(owner_[i])] += layout_.params[i].numel;
  }
  // Parameter all-gather order: by owner, then layout order.
  for (size_t i = 0; i < layout_.params.size(); ++i) gather_order_.push_back(i);
  std::stable_sort(gather_order_.begin(), gather_order_.end(),
                   [&](size_t x, size_t y) { return owner_[x] < owner_[y]; });
  gather_counts_.assign(size_t(R), 0);
  for (size_t i : gather_order_) gather_counts_[size_t(owner_[i])] += layout_.params[i].numel;
}

DataParallel::~DataParallel() {
  for (Bucket& b : buckets_) b.pending.reset();  // waits
  if (be_) {
    for (Bucket& b : buckets_) {
      if (b.dsend) be_->free(b.dsend);
      if (b.drecv) be_->free(b.drecv);
    }
    if (dgather_send_) be_->free(dgather_send_);
    if (dgather_recv_) be_->free(dgather_recv_);
  }
}

void DataParallel::pack(float* dst, const float* src, int64_t n) {
  if (device_collectives()) be_->copy(dst, src, n);
  else if (be_) be_->to_host(dst, src, n * 4);
  else std::memcpy(dst, src, size_t(n) * 4);
}

void DataParallel::unpack(float* dst, const float* src, int64_t n) {
  if (device_collectives()) be_->copy(dst, src, n);
  else if (be_) be_->from_host(dst, src, n * 4);
  else std::memcpy(dst, src, size_t(n) * 4);
}

float* DataParallel::bucket_alloc(int64_t n) { return be_->alloc(std::max<int64_t>(n, 1)); }

std::vector<bool> DataParallel::owned_mask() const {
  std::vector<bool> out(owner_.size());
  for (size_t i = 0; i < owner_.size(); ++i) out[i] = owner_[i] == comm_.rank();
  return out;
}

void DataParallel::begin_step(float* grads) {
  grads_ = grads;
  for (Bucket& b : buckets_) {
    ZAYA_CHECK(!b.pending, "a gradient bucket of the previous step is still in flight");
    b.started = false;
  }
}

void DataParallel::start(Bucket& b) {
  b.started = true;
  if (comm_.size() == 1 && !device_collectives()) return;  // the gradients are already the sum
  int64_t total = 0;
  for (int64_t c : b.counts) total += c;
  float *send, *recv;
  if (device_collectives()) {
    if (!b.dsend) {
      b.dsend = bucket_alloc(total);
      b.drecv = bucket_alloc(b.counts[size_t(comm_.rank())]);
    }
    send = b.dsend;
    recv = b.drecv;
  } else {
    b.send.resize(size_t(total));
    b.recv.resize(size_t(b.counts[size_t(comm_.rank())]));
    send = b.send.data();
    recv = b.recv.data();
  }
  float* dst = send;
  for (size_t i : b.tensors) {
    const ParamSpec& p = layout_.params[i];
    pack(dst, grads_ + p.offset, p.numel);
    dst += p.numel;
  }
  Comm& c = device_collectives() ? *data_comm_ : comm_;
  b.pending = c.reduce_scatter(send, recv, b.counts, CommType::F32, ReduceOp::Sum);
}

void DataParallel::block_done(int64_t block) {
  ZAYA_CHECK(grads_ != nullptr, "block_done before begin_step");
  for (Bucket& b : buckets_)
    if (!b.started && b.last_block >= 0 && b.last_block >= block) start(b);
}

void DataParallel::finish_gradients() {
  ZAYA_CHECK(grads_ != nullptr, "finish_gradients before begin_step");
  for (Bucket& b : buckets_)
    if (!b.started) start(b);
  for (Bucket& b : buckets_) {
    if (!b.pending) continue;  // one rank: nothing was sent
    b.pending->wait();
    b.pending.reset();
    const float* src = device_collectives() ? b.drecv : b.recv.data();
    for (size_t i : b.tensors) {
      if (!owns(i)) continue;
      const ParamSpec& p = layout_.params[i];
      unpack(grads_ + p.offset, src, p.numel);
      src += p.numel;
    }
  }
  grads_ = nullptr;
}

double DataParallel::grad_sum_squares(Backend& be, const float* grads) {
  double ss = 0;
  for (size_t i = 0; i < layout_.params.size(); ++i)
    if (owns(i)) ss += be.sum_squares(grads + layout_.params[i].offset, layout_.params[i].numel);
  sum(&ss, 1);
  return ss;
}

void DataParallel::gather_parameters(float* params) {
  if (comm_.size() == 1) return;
  int64_t total = 0;
  for (int64_t c : gather_counts_) total += c;
  const int64_t mine = gather_counts_[size_t(comm_.rank())];
  float *send, *recv;
  if (device_collectives()) {
    if (!dgather_send_) {
      dgather_send_ = bucket_alloc(mine);
      dgather_recv_ = bucket_alloc(total);
    }
    send = dgather_send_;
    recv = dgather_recv_;
  } else {
    gather_send_.resize(size_t(mine));
    gather_recv_.resize(size_t(total));
    send = gather_send_.data();
    recv = gather_recv_.data();
  }
  float* dst = send;
  for (size_t i : gather_order_)
    if (owns(i)) {
      const ParamSpec& p = layout_.params[i];
      pack(dst, params + p.offset, p.numel);
      dst += p.numel;
    }
  Comm& c = device_collectives() ? *data_comm_ : comm_;
  c.all_gather(send, recv, gather_counts_, CommType::F32)->wait();
  const float* src = recv;
  for (size_t i : gather_order_) {
    const ParamSpec& p = layout_.params[i];
    unpack(params + p.offset, src, p.numel);
    src += p.numel;
  }
}

void DataParallel::sum(double* values, int64_t n) {
  if (comm_.size() > 1) comm_.all_reduce(values, values, n, CommType::F64, ReduceOp::Sum)->wait();
}

void DataParallel::sum(int64_t* values, int64_t n) {
  if (comm_.size() > 1) comm_.all_reduce(values, values, n, CommType::I64, ReduceOp::Sum)->wait();
}

}  // namespace zaya
