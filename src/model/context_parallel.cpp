// Context parallelism: the zig-zag chunk layout and the group's exchanges (context_parallel.h).
// Every exchange stages through host vectors: the communicator of a CPU job is host memory.
#include "model/context_parallel.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"

namespace zaya {

namespace {
// Message tags of the four exchanges (each exchange completes before the next starts).
constexpr int kTagForward = 23101;
constexpr int kTagBackward = 23102;
constexpr int kTagGather = 23103;
constexpr int kTagReduce = 23104;
}  // namespace

ContextParallel::ContextParallel(Comm& comm, int group_size, Backend& be) : comm_(comm), be_(be), size_(group_size) {
  if (group_size < 1 || comm.size() % group_size != 0)
    fail("train", "parallel.context_parallel = " + std::to_string(group_size) + " does not divide the " +
                      std::to_string(comm.size()) + " ranks of the job",
         "launch a multiple of parallel.context_parallel ranks (mpirun -np N)");
  index_ = comm.rank() % group_size;
  group_ = comm.rank() / group_size;
  groups_ = comm.size() / group_size;
}

int64_t ContextParallel::chunk_len(int64_t T) const {
  if (T % (2 * size_) != 0)
    fail("train", "sequence length " + std::to_string(T) + " is not a multiple of 2 x parallel.context_parallel (" +
                      std::to_string(2 * size_) + ")",
         "context parallelism cuts every sequence into 2 x context_parallel equal chunks");
  return T / (2 * size_);
}

std::vector<int32_t> ContextParallel::split(const int32_t* full, int64_t B, int64_t T) const {
  const int64_t Tc = chunk_len(T);
  std::vector<int32_t> out(static_cast<size_t>(B * T / size_));
  for (int64_t i = 0; i < 2 * B; ++i)
    std::memcpy(out.data() + i * Tc, full + (i % B) * T + chunk_of_row(i, B) * Tc, size_t(Tc) * 4);
  return out;
}

void ContextParallel::exchange(const std::vector<Msg>& out, const std::vector<Msg>& in, int tag) {
  std::vector<CommHandle> pending;
  for (const Msg& m : in)
    if (m.peer != index_) pending.push_back(comm_.recv(m.buf->data(), int64_t(m.buf->size()), CommType::F32,
                                                       world_rank(m.peer), tag));
  for (const Msg& m : out) {
    if (m.peer == index_) {
      auto self = std::find_if(in.begin(), in.end(), [&](const Msg& r) { return r.peer == index_; });
      ZAYA_CHECK(self != in.end() && self->buf->size() == m.buf->size(), "context parallel: unmatched self message");
      *self->buf = *m.buf;
      continue;
    }
    pending.push_back(comm_.send(m.buf->data(), int64_t(m.buf->size()), CommType::F32, world_rank(m.peer), tag));
    ++messages_;
  }
  for (auto& p : pending) p->wait();
}

std::vector<float> ContextParallel::shift_rows(const std::vector<float>& rows, int64_t B, int64_t W, int delta,
                                               int tag) {
  const int R = size_;
  auto exists = [&](int chunk) { return chunk >= 0 && chunk < 2 * R; };
  // Per peer, the rows of every sequence in order (at most one slot per peer: a rank's two
  // chunks have neighbours with different owners).
  std::vector<std::vector<float>> out_bufs(static_cast<size_t>(R)), in_bufs(static_cast<size_t>(R));
  for (int64_t i = 0; i < 2 * B; ++i) {
    const int j = chunk_of_row(i, B);
    if (exists(j + delta)) {
      auto& o = out_bufs[size_t(owner_of(j + delta))];
      o.insert(o.end(), rows.begin() + i * W, rows.begin() + (i + 1) * W);
    }
    if (exists(j - delta)) {
      auto& in = in_bufs[size_t(owner_of(j - delta))];
      in.resize(in.size() + size_t(W));
    }
  }
  std::vector<Msg> out, in;
  for (int p = 0; p < R; ++p) {
    if (!out_bufs[size_t(p)].empty()) out.push_back({p, &out_bufs[size_t(p)]});
    if (!in_bufs[size_t(p)].empty()) in.push_back({p, &in_bufs[size_t(p)]});
  }
  exchange(out, in, tag);
  std::vector<float> result(rows.size(), 0.0f);
  std::vector<int64_t> taken(static_cast<size_t>(R), 0);
  for (int64_t i = 0; i < 2 * B; ++i) {
    const int j = chunk_of_row(i, B);
    if (!exists(j - delta)) continue;
    const int p = owner_of(j - delta);
    std::memcpy(result.data() + i * W, in_bufs[size_t(p)].data() + taken[size_t(p)] * W, size_t(W) * 4);
    ++taken[size_t(p)];
  }
  return result;
}

void ContextParallel::pass_forward(const float* tails, float* heads, int64_t B, int64_t W) {
  std::vector<float> host(static_cast<size_t>(2 * B * W));
  be_.to_host(host.data(), tails, int64_t(host.size()) * 4);
  const std::vector<float> received = shift_rows(host, B, W, +1, kTagForward);
  be_.from_host(heads, received.data(), int64_t(received.size()) * 4);
}

void ContextParallel::pass_backward(const float* head_grads, float* tail_grads, int64_t B, int64_t W) {
  std::vector<float> host(static_cast<size_t>(2 * B * W)), tails(host.size());
  be_.to_host(host.data(), head_grads, int64_t(host.size()) * 4);
  be_.to_host(tails.data(), tail_grads, int64_t(tails.size()) * 4);
  const std::vector<float> received = shift_rows(host, B, W, -1, kTagBackward);  // zeros for the last chunk
  for (size_t e = 0; e < tails.size(); ++e) tails[e] += received[e];
  be_.from_host(tail_grads, tails.data(), int64_t(tails.size()) * 4);
}

void ContextParallel::gather(const float* local, float* full, int64_t B, int64_t Tc, int64_t W) {
  const int R = size_;
  const int64_t row = Tc * W, T = 2 * R * Tc;
  std::vector<float> mine(static_cast<size_t>(2 * B * row));
  be_.to_host(mine.data(), local, int64_t(mine.size()) * 4);
  std::vector<std::vector<float>> theirs(static_cast<size_t>(R));
  std::vector<Msg> out, in;
  for (int p = 0; p < R; ++p) {
    if (p == index_) continue;
    theirs[size_t(p)].resize(mine.size());
    out.push_back({p, &mine});
    in.push_back({p, &theirs[size_t(p)]});
  }
  exchange(out, in, kTagGather);
  std::vector<float> seqs(static_cast<size_t>(B * T * W));
  for (int64_t b = 0; b < B; ++b)
    for (int j = 0; j < 2 * R; ++j) {
      const int o = owner_of(j);
      const std::vector<float>& src = o == index_ ? mine : theirs[size_t(o)];
      std::memcpy(seqs.data() + (b * T * W + j * row), src.data() + (slot_of(j, R) * B + b) * row, size_t(row) * 4);
    }
  be_.from_host(full, seqs.data(), int64_t(seqs.size()) * 4);
}

void ContextParallel::reduce_scatter(const float* full, float* local, int64_t B, int64_t Tc, int64_t W) {
  const int R = size_;
  const int64_t row = Tc * W, T = 2 * R * Tc;
  std::vector<float> host(static_cast<size_t>(2 * B * T * W));
  be_.to_host(host.data(), full, int64_t(host.size()) * 4);
  // parts[p]: p's two chunks of every sequence (slot-major, as p's rows), this rank's two slots'
  // gradients summed.
  std::vector<std::vector<float>> parts(size_t(R), std::vector<float>(static_cast<size_t>(2 * B * row)));
  for (int p = 0; p < R; ++p)
    for (int s = 0; s < 2; ++s)
      for (int64_t b = 0; b < B; ++b) {
        const int j = chunk_of(p, s, R);
        const float* a = host.data() + b * T * W + j * row;  // slot 0's gradient
        const float* c = a + B * T * W;                         // slot 1's
        float* d = parts[size_t(p)].data() + (s * B + b) * row;
        for (int64_t e = 0; e < row; ++e) d[e] = a[e] + c[e];
      }
  std::vector<std::vector<float>> received(static_cast<size_t>(R));
  std::vector<Msg> out, in;
  for (int p = 0; p < R; ++p) {
    if (p == index_) continue;
    received[size_t(p)].resize(size_t(2 * B * row));
    out.push_back({p, &parts[size_t(p)]});
    in.push_back({p, &received[size_t(p)]});
  }
  exchange(out, in, kTagReduce);
  std::vector<float> sum(static_cast<size_t>(2 * B * row), 0.0f);
  for (int p = 0; p < R; ++p) {  // rank order: every rank sums the same way
    const std::vector<float>& part = p == index_ ? parts[size_t(index_)] : received[size_t(p)];
    for (size_t e = 0; e < sum.size(); ++e) sum[e] += part[e];
  }
  be_.from_host(local, sum.data(), int64_t(sum.size()) * 4);
}

}  // namespace zaya
