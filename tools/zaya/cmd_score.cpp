// `zaya score`: runs the model on a batch of equal-length id sequences and writes
// {"loss": L, "logits": [B][T][V], "experts": [L][B][T]} — a fixed contract other tools use.
// loss is the mean next-token cross-entropy over all B*(T-1) predictions.
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/model_io.h"

namespace zaya::cli {

namespace {

std::vector<std::vector<int32_t>> read_id_batch(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("score", "cannot open " + path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    fail("score", path + ": invalid JSON: " + e.what());
  }
  const char* shape_hint = "expected a JSON array of equal-length arrays of token ids, e.g. [[2,17,5],[2,9,4]]";
  if (!j.is_array() || j.empty()) fail("score", path + ": top level must be a non-empty array", shape_hint);
  std::vector<std::vector<int32_t>> batch;
  for (size_t b = 0; b < j.size(); ++b) {
    if (!j[b].is_array() || j[b].empty()) fail("score", path + ": element [" + std::to_string(b) + "] is not a non-empty array", shape_hint);
    std::vector<int32_t> seq;
    for (size_t t = 0; t < j[b].size(); ++t) {
      const auto& v = j[b][t];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        fail("score", path + ": element [" + std::to_string(b) + "][" + std::to_string(t) + "] = " + v.dump() +
                          " is not a token id", shape_hint);
      seq.push_back(int32_t(v.get<int64_t>()));
    }
    if (!batch.empty() && seq.size() != batch[0].size())
      fail("score", path + ": sequence " + std::to_string(b) + " has " + std::to_string(seq.size()) +
                        " tokens but sequence 0 has " + std::to_string(batch[0].size()), shape_hint);
    batch.push_back(std::move(seq));
  }
  return batch;
}

// d(mean loss)/d(parameter) for every trainable parameter, F32 under HF names.
void write_grads(Model& model, const std::vector<int32_t>& ids, int64_t B, int64_t T, const std::string& path) {
  if (T < 2) fail("score", "--grads needs sequences of at least 2 tokens");
  std::vector<int32_t> targets(ids.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) targets[size_t(b * T + t)] = t + 1 < T ? ids[size_t(b * T + t + 1)] : -1;
  const ParamLayout& layout = model.layout();
  float* grads = model.backend().alloc(layout.total);
  model.backend().fill(grads, 0.0f, layout.total);
  model.forward_backward(ids.data(), targets.data(), B, T, grads, 1.0f / float(B * (T - 1)));
  std::vector<float> host(static_cast<size_t>(layout.total));
  model.backend().to_host(host.data(), grads, layout.total * 4);
  model.backend().free(grads);
  std::vector<TensorToWrite> tensors;
  for (const ParamSpec& p : layout.params)
    if (p.kind != ParamKind::Buffer) tensors.push_back({p.name, DType::F32, p.shape, host.data() + p.offset});
  write_safetensors(path, tensors, {{"format", "pt"}, {"content", "d(mean next-token loss)/d(parameter)"}});
}

void run_score(const std::string& model_dir, const std::string& ids_path, const std::string& out_path,
               const std::string& grads_path, const std::string& backend) {
  auto batch = read_id_batch(ids_path);
  auto be = make_backend(backend);
  auto model = load_model(model_dir, *be);
  be->set_weights_frozen(true);  // inference: a GPU converts each weight to bf16 once
  const ModelConfig& c = model->config();
  const int64_t B = int64_t(batch.size()), T = int64_t(batch[0].size()), V = c.vocab_size, L = c.num_hidden_layers;
  std::vector<int32_t> ids;
  for (const auto& s : batch) ids.insert(ids.end(), s.begin(), s.end());
  std::vector<float> logits(size_t(B * T * V));
  std::vector<int32_t> experts(size_t(L * B * T));
  std::vector<int32_t> targets(ids.size());  // next token; -1 at each sequence's end
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) targets[size_t(b * T + t)] = t + 1 < T ? ids[size_t(b * T + t + 1)] : -1;
  double loss_sum = 0;
  int64_t loss_tokens = 0;
  ForwardOutputs out;
  out.logits = logits.data();
  out.experts = experts.data();
  out.targets = targets.data();
  out.loss_sum = &loss_sum;
  out.loss_tokens = &loss_tokens;
  model->forward(ids.data(), B, T, nullptr, out);
  const double loss = loss_tokens > 0 ? loss_sum / double(loss_tokens) : 0.0;

  FILE* f = std::fopen(out_path.c_str(), "w");
  if (!f) fail("score", "cannot write " + out_path);
  std::fprintf(f, "{\"loss\": %.9g, \"logits\": [", loss);
  for (int64_t b = 0; b < B; ++b) {
    std::fprintf(f, "%s[", b ? "," : "");
    for (int64_t t = 0; t < T; ++t) {
      std::fprintf(f, "%s[", t ? "," : "");
      const float* row = logits.data() + (b * T + t) * V;
      for (int64_t v = 0; v < V; ++v) std::fprintf(f, v ? ",%.9g" : "%.9g", row[v]);
      std::fprintf(f, "]");
    }
    std::fprintf(f, "]");
  }
  std::fprintf(f, "], \"experts\": [");
  for (int64_t l = 0; l < L; ++l) {
    std::fprintf(f, "%s[", l ? "," : "");
    for (int64_t b = 0; b < B; ++b) {
      std::fprintf(f, "%s[", b ? "," : "");
      for (int64_t t = 0; t < T; ++t) std::fprintf(f, t ? ",%d" : "%d", experts[size_t((l * B + b) * T + t)]);
      std::fprintf(f, "]");
    }
    std::fprintf(f, "]");
  }
  std::fprintf(f, "]}\n");
  if (std::fclose(f) != 0) fail("score", "error writing " + out_path);
  std::fprintf(stderr, "[zaya] scored %lld x %lld tokens: loss %.6f\n", (long long)B, (long long)T, loss);
  if (!grads_path.empty()) {
    write_grads(*model, ids, B, T, grads_path);
    std::fprintf(stderr, "[zaya] wrote gradients to %s\n", grads_path.c_str());
  }
}

}  // namespace

void add_score(CLI::App& app) {
  auto* cmd = app.add_subcommand("score", "Loss, logits and expert choices for a batch of id sequences");
  static std::string model_dir, ids_file, out, grads, backend = "cpu";
  cmd->add_option("--model", model_dir, "Model directory")->required();
  cmd->add_option("--ids-file", ids_file, "JSON array of equal-length arrays of token ids")->required();
  cmd->add_option("--out", out, "Output JSON")->required();
  cmd->add_option("--grads", grads, "Also write d(mean loss)/d(parameter) as F32 safetensors (HF names)");
  cmd->add_option("--backend", backend, "cpu, or cuda in a GPU build")->capture_default_str();
  cmd->callback([] { run_score(model_dir, ids_file, out, grads, backend); });
}

}  // namespace zaya::cli
