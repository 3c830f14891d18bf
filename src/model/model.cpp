// Model construction, initialisation (spec C.5) and decode-state management.
#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/rng.h"

namespace zaya {

DecodeState::DecodeState(const ModelConfig& c, Backend& be, int64_t b, int64_t cap)
    : batch(b), capacity(cap), pos(static_cast<size_t>(b), 0), be_(be) {
  if (b <= 0 || cap <= 0)
    fail("model", "a decode state needs at least one sequence and one position, got " + std::to_string(b) +
                      " x " + std::to_string(cap));
  kv_ = c.kv_dim();
  const int64_t kv = kv_;
  conv_n_ = batch * c.conv_state_rows() * c.conv_channels();
  vdel_n_ = batch * kv / 2;
  // An allocation that fails (a GPU out of memory) frees what came before it: the server
  // allocates states while it runs (kept_states.h) and must not leak when one does not fit.
  try {
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      Layer& L = layers.emplace_back();
      L.k = be.alloc(batch * capacity * kv);
      L.v = be.alloc(batch * capacity * kv);
      L.conv = be.alloc(conv_n_);
      L.vdel = be.alloc(vdel_n_);
    }
    reset();
  } catch (...) {
    release();
    throw;
  }
}

void DecodeState::release() {
  for (Layer& L : layers)
    for (float* p : {L.k, L.v, L.conv, L.vdel})
      if (p) be_.free(p);
  layers.clear();
}

int64_t DecodeState::bytes(const ModelConfig& c, int64_t batch, int64_t capacity) {
  const int64_t per_sequence =
      c.num_hidden_layers *
      (2 * capacity * c.kv_dim() + c.conv_state_rows() * c.conv_channels() + c.kv_dim() / 2);
  return batch * per_sequence * int64_t(sizeof(float));
}

DecodeState::~DecodeState() { release(); }

void DecodeState::reset() {
  std::fill(pos.begin(), pos.end(), 0);
  for (auto& L : layers) {
    be_.fill(L.conv, 0.0f, conv_n_);
    be_.fill(L.vdel, 0.0f, vdel_n_);
  }
}

void DecodeState::reset_sequence(int64_t seq) {
  ZAYA_CHECK(seq >= 0 && seq < batch, "reset_sequence: sequence index out of range");
  const int64_t conv = conv_n_ / batch, vdel = vdel_n_ / batch;
  for (auto& L : layers) {
    be_.fill(L.conv + seq * conv, 0.0f, conv);
    be_.fill(L.vdel + seq * vdel, 0.0f, vdel);
  }
  pos[size_t(seq)] = 0;
}

void DecodeState::copy_sequence(const DecodeState& from, int64_t from_seq, int64_t to_seq) {
  ZAYA_CHECK(from_seq >= 0 && from_seq < from.batch && to_seq >= 0 && to_seq < batch,
             "copy_sequence: sequence index out of range");
  ZAYA_CHECK(from.layers.size() == layers.size() && from.kv_ == kv_ &&
                 from.conv_n_ / from.batch == conv_n_ / batch && from.vdel_n_ / from.batch == vdel_n_ / batch,
             "copy_sequence: the states belong to models of different shapes");
  const int64_t n = from.pos[size_t(from_seq)];
  if (n > capacity)
    fail("model", "a sequence of " + std::to_string(n) + " tokens does not fit a decode state of " +
                      std::to_string(capacity) + " positions");
  if (&from == this && from_seq == to_seq) return;
  const int64_t conv = conv_n_ / batch, vdel = vdel_n_ / batch;
  for (size_t l = 0; l < layers.size(); ++l) {
    const Layer& src = from.layers[l];
    Layer& dst = layers[l];
    be_.copy(dst.k + to_seq * capacity * kv_, src.k + from_seq * from.capacity * kv_, n * kv_);
    be_.copy(dst.v + to_seq * capacity * kv_, src.v + from_seq * from.capacity * kv_, n * kv_);
    be_.copy(dst.conv + to_seq * conv, src.conv + from_seq * conv, conv);
    be_.copy(dst.vdel + to_seq * vdel, src.vdel + from_seq * vdel, vdel);
  }
  pos[size_t(to_seq)] = n;
}

Model::Model(const ModelConfig& c, Backend& be) : cfg_(c), layout_(build_param_layout(c)), be_(be) {
  arena_ = be_.alloc(layout_.total);
  be_.fill(arena_, 0.0f, layout_.total);
  w_ = bind_weights(cfg_, layout_, arena_);
}

Model::~Model() { be_.free(arena_); }

void Model::init_random(uint64_t seed) {
  Rng rng(seed);
  std::vector<float> host;
  for (const ParamSpec& p : layout_.params) {
    host.assign(static_cast<size_t>(p.numel), 0.0f);
    const std::string& n = p.name;
    auto ends_with = [&](const char* s) {
      size_t l = std::strlen(s);
      return n.size() >= l && n.compare(n.size() - l, l, s) == 0;
    };
    if (p.kind == ParamKind::Matrix || p.kind == ParamKind::Embedding || p.kind == ParamKind::Conv) {
      // The stream is counter-based and a normal takes two counters, so element i is drawn at
      // counter c0 + 2i whatever thread draws it: parallel and identical to one thread.
      const uint64_t c0 = rng.counter();
      const int64_t n = p.numel, chunk = int64_t(1) << 16;
#pragma omp parallel for schedule(static) if (n > 4 * chunk)
      for (int64_t s = 0; s < n; s += chunk) {
        Rng local(seed);
        local.set_counter(c0 + 2 * uint64_t(s));
        for (int64_t i = s; i < std::min(n, s + chunk); ++i)
          host[size_t(i)] = float(local.normal() * cfg_.initializer_range);
      }
      rng.set_counter(c0 + 2 * uint64_t(n));
    } else if (ends_with("balancing_biases")) {
      host.back() = -1.0f;  // skip class
    } else if (ends_with("_scale") || ends_with("layernorm.weight") || ends_with("norm.weight") ||
               ends_with("qk_norm.temp") || ends_with("router_states_scale")) {
      std::fill(host.begin(), host.end(), 1.0f);
    }  // biases stay 0
    be_.from_host(arena_ + p.offset, host.data(), p.numel * 4);
  }
}

}  // namespace zaya
