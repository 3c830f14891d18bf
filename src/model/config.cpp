// config.json parsing and validation for model_type "zaya" (spec A.1; HF ZayaConfig field names).
#include "model/config.h"

#include <fstream>
#include <set>

#include "core/error.h"

namespace zaya {

using nlohmann::json;

int64_t ModelConfig::rotary_dim(int64_t layer) const {
  return int64_t(double(head_dim) * rope(layer).partial_rotary_factor);
}

namespace {

// Sanity limits (validate_config): sizes up to 2^24, counts (layers, heads, experts, conv taps)
// up to 4096, vocabulary and positions up to 2^31 - 1 (token ids and positions are int32).
constexpr int64_t kMaxDim = int64_t(1) << 24;
constexpr int64_t kMaxCount = 4096;
constexpr int64_t kMaxVocab = (int64_t(1) << 31) - 1;

// Keys of HF's PretrainedConfig and ZayaConfig that carry no meaning for the computation.
const std::set<std::string> kIgnoredKeys = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "use_cache", "output_router_logits", "attention_dropout", "router_aux_loss_coef",
    "return_dict", "output_hidden_states", "output_attentions", "is_encoder_decoder",
    "id2label", "label2id", "chunk_size_feed_forward", "tokenizer_class", "problem_type",
    "auto_map", "bad_words_ids", "begin_suppress_tokens", "decoder_start_token_id",
    "sep_token_id", "task_specific_params", "finetuning_task", "prefix", "pruned_heads",
    "tie_encoder_decoder", "add_cross_attention", "cross_attention_hidden_size",
    "is_decoder", "torchscript", "use_bfloat16", "_attn_implementation_autoset"};

struct Reader {
  const json& j;
  const std::string& source;
  std::set<std::string> used;

  const json* find(const char* key) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return nullptr;
    used.insert(key);
    return &*it;
  }
  [[noreturn]] void type_error(const char* key, const char* expected, const json& v) {
    fail("config", source + ": field '" + key + "' must be " + expected + ", found " + v.dump());
  }
  void get_int(const char* key, int64_t* out) {
    if (const json* v = find(key)) {
      if (!v->is_number_integer()) type_error(key, "an integer", *v);
      *out = v->get<int64_t>();
    }
  }
  void get_double(const char* key, double* out) {
    if (const json* v = find(key)) {
      if (!v->is_number()) type_error(key, "a number", *v);
      *out = v->get<double>();
    }
  }
  void get_bool(const char* key, bool* out) {
    if (const json* v = find(key)) {
      if (!v->is_boolean()) type_error(key, "true or false", *v);
      *out = v->get<bool>();
    }
  }
};

void parse_rope(const json& obj, const std::string& where, const std::string& source, RopeParams* out) {
  if (!obj.is_object()) fail("config", source + ": '" + where + "' must be an object, found " + obj.dump());
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& k = it.key();
    if (k == "rope_theta") {
      if (!it->is_number()) fail("config", source + ": '" + where + ".rope_theta' must be a number");
      out->theta = it->get<double>();
    } else if (k == "partial_rotary_factor") {
      if (!it->is_number()) fail("config", source + ": '" + where + ".partial_rotary_factor' must be a number");
      out->partial_rotary_factor = it->get<double>();
    } else if (k == "rope_type") {
      if (!it->is_string() || it->get<std::string>() != "default")
        fail("config", source + ": '" + where + ".rope_type' must be \"default\", found " + it->dump(),
             "zaya implements plain RoPE; scaled variants (yarn, linear) are not supported");
    } else {
      fail("config", source + ": unknown field '" + where + "." + k + "'",
           "expected rope_theta, partial_rotary_factor or rope_type");
    }
  }
}

}  // namespace

ModelConfig config_from_json(const json& j, const std::string& source) {
  if (!j.is_object()) fail("config", source + ": expected a JSON object at the top level");
  ModelConfig c;
  Reader r{j, source, {}};

  if (const json* mt = r.find("model_type")) {
    if (!mt->is_string() || mt->get<std::string>() != "zaya")
      fail("config", source + ": field 'model_type' must be \"zaya\", found " + mt->dump());
  }
  r.get_int("vocab_size", &c.vocab_size);
  r.get_int("hidden_size", &c.hidden_size);
  r.get_int("num_hidden_layers", &c.num_hidden_layers);
  r.get_int("num_attention_heads", &c.num_attention_heads);
  r.get_int("num_key_value_heads", &c.num_key_value_heads);
  r.get_int("head_dim", &c.head_dim);
  r.get_int("max_position_embeddings", &c.max_position_embeddings);
  r.get_double("rms_norm_eps", &c.rms_norm_eps);
  r.get_bool("tie_word_embeddings", &c.tie_word_embeddings);
  r.get_bool("lm_head_bias", &c.lm_head_bias);
  r.get_int("moe_intermediate_size", &c.moe_intermediate_size);
  r.get_int("num_experts", &c.num_experts);
  r.get_int("num_experts_per_tok", &c.num_experts_per_tok);
  r.get_int("router_hidden_size", &c.router_hidden_size);
  r.get_int("cca_time0", &c.cca_time0);
  r.get_int("cca_time1", &c.cca_time1);
  r.get_int("sliding_window", &c.sliding_window);
  r.get_int("pad_token_id", &c.pad_token_id);
  r.get_int("bos_token_id", &c.bos_token_id);
  r.get_double("initializer_range", &c.initializer_range);

  if (const json* v = r.find("hidden_act")) {
    if (!v->is_string() || v->get<std::string>() != "silu")
      fail("config", source + ": field 'hidden_act' must be \"silu\" (SwiGLU experts), found " + v->dump());
  }
  if (const json* v = r.find("attention_bias")) {
    if (!v->is_boolean() || v->get<bool>())
      fail("config", source + ": field 'attention_bias' must be false (ZAYA projections have no bias)");
  }
  if (const json* v = r.find("eos_token_id")) {
    c.eos_token_ids.clear();
    if (v->is_number_integer()) {
      c.eos_token_ids.push_back(v->get<int64_t>());
    } else if (v->is_array()) {
      for (const auto& e : *v) {
        if (!e.is_number_integer()) r.type_error("eos_token_id", "an integer or a list of integers", *v);
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else {
      r.type_error("eos_token_id", "an integer or a list of integers", *v);
    }
  }
  if (const json* v = r.find("layer_types")) {
    if (!v->is_array()) r.type_error("layer_types", "a list of strings", *v);
    for (const auto& e : *v) {
      if (!e.is_string()) r.type_error("layer_types", "a list of strings", *v);
      c.layer_types.push_back(e.get<std::string>());
    }
  }
  // rope_parameters: either {"hybrid": {...}, "hybrid_sliding": {...}} or one flat {...} for all.
  bool rope_seen = false;
  if (const json* v = r.find("rope_parameters")) {
    rope_seen = true;
    if (!v->is_object()) r.type_error("rope_parameters", "an object", *v);
    bool nested = v->contains("hybrid") || v->contains("hybrid_sliding");
    if (nested) {
      for (auto it = v->begin(); it != v->end(); ++it) {
        if (it.key() == "hybrid") parse_rope(*it, "rope_parameters.hybrid", source, &c.rope_hybrid);
        else if (it.key() == "hybrid_sliding")
          parse_rope(*it, "rope_parameters.hybrid_sliding", source, &c.rope_sliding);
        else if (it.key() == "rope_type") continue;  // stray top-level key seen on the hub
        else fail("config", source + ": unknown field 'rope_parameters." + it.key() + "'",
                  "expected 'hybrid' and 'hybrid_sliding'");
      }
    } else {
      parse_rope(*v, "rope_parameters", source, &c.rope_hybrid);
      c.rope_sliding = c.rope_hybrid;
    }
  }
  if (const json* v = r.find("rope_theta")) {  // legacy flat key
    if (!v->is_number()) r.type_error("rope_theta", "a number", *v);
    if (!rope_seen) c.rope_hybrid.theta = v->get<double>();
  }
  if (const json* v = r.find("partial_rotary_factor")) {
    if (!v->is_number()) r.type_error("partial_rotary_factor", "a number", *v);
    if (!rope_seen) c.rope_hybrid.partial_rotary_factor = c.rope_sliding.partial_rotary_factor = v->get<double>();
  }
  // zaya's own setting; a HF config that does not name it means HF semantics (zero).
  if (const json* v = r.find("skip_expert_output")) {
    std::string s = v->is_string() ? v->get<std::string>() : "";
    if (s == "zero") c.skip_expert_output = SkipMode::Zero;
    else if (s == "identity") c.skip_expert_output = SkipMode::Identity;
    else fail("config", source + ": field 'skip_expert_output' must be \"zero\" or \"identity\", found " + v->dump());
  } else {
    c.skip_expert_output = SkipMode::Zero;
  }

  for (auto it = j.begin(); it != j.end(); ++it) {
    if (r.used.count(it.key()) || kIgnoredKeys.count(it.key()) || it->is_null()) continue;
    fail("config", source + ": unknown field '" + it.key() + "'",
         "this is not a ZAYA config field; check the spelling or remove it");
  }
  // Only a count that validate_config will accept (a hostile config could ask for 10^12 layers).
  if (c.layer_types.empty() && c.num_hidden_layers > 0 && c.num_hidden_layers <= kMaxCount)
    c.layer_types.assign(static_cast<size_t>(c.num_hidden_layers), "hybrid");
  validate_config(c, source);
  return c;
}

void validate_config(const ModelConfig& c, const std::string& source) {
  auto bad = [&](const std::string& field, const std::string& what, const std::string& hint = {}) {
    fail("config", source + ": field '" + field + "' " + what, hint);
  };
  // Upper bounds keep every derived size (q_dim, kv_dim, vocab * hidden, ...) far from int64 overflow.
  auto positive = [&](const char* field, int64_t v, int64_t max) {
    if (v <= 0) bad(field, "must be positive, found " + std::to_string(v));
    if (v > max)
      bad(field, "must be at most " + std::to_string(max) + ", found " + std::to_string(v),
          "this is far larger than any ZAYA model; check the config");
  };
  positive("vocab_size", c.vocab_size, kMaxVocab);
  positive("hidden_size", c.hidden_size, kMaxDim);
  positive("num_hidden_layers", c.num_hidden_layers, kMaxCount);
  positive("num_attention_heads", c.num_attention_heads, kMaxCount);
  positive("num_key_value_heads", c.num_key_value_heads, kMaxCount);
  positive("head_dim", c.head_dim, kMaxDim);
  positive("moe_intermediate_size", c.moe_intermediate_size, kMaxDim);
  positive("num_experts", c.num_experts, kMaxCount);
  positive("router_hidden_size", c.router_hidden_size, kMaxDim);
  positive("cca_time0", c.cca_time0, kMaxCount);
  positive("cca_time1", c.cca_time1, kMaxCount);
  positive("max_position_embeddings", c.max_position_embeddings, kMaxVocab);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    bad("num_attention_heads", "(" + std::to_string(c.num_attention_heads) +
                                   ") must be divisible by num_key_value_heads (" +
                                   std::to_string(c.num_key_value_heads) + ")",
        "grouped-query attention shares each KV head among an equal number of query heads");
  if (c.kv_dim() % 2 != 0)
    bad("num_key_value_heads", "times head_dim must be even (the value path splits it into current and delayed halves)");
  if (c.num_experts_per_tok != 1) bad("num_experts_per_tok", "must be 1 (ZAYA routes top-1)");
  if (c.rms_norm_eps <= 0) bad("rms_norm_eps", "must be positive");
  if (int64_t(c.layer_types.size()) != c.num_hidden_layers)
    bad("layer_types", "has " + std::to_string(c.layer_types.size()) + " entries, expected num_hidden_layers = " +
                           std::to_string(c.num_hidden_layers));
  bool any_sliding = false;
  for (const auto& t : c.layer_types) {
    if (t != "hybrid" && t != "hybrid_sliding")
      bad("layer_types", "contains \"" + t + "\"; expected \"hybrid\" or \"hybrid_sliding\"");
    any_sliding |= t == "hybrid_sliding";
  }
  if (any_sliding && c.sliding_window <= 0)
    bad("sliding_window", "must be set to a positive window when layer_types contains hybrid_sliding");
  for (const RopeParams* rp : {&c.rope_hybrid, &c.rope_sliding}) {
    const char* name = rp == &c.rope_hybrid ? "rope_parameters.hybrid" : "rope_parameters.hybrid_sliding";
    if (rp->theta <= 0) bad(name, "rope_theta must be positive");
    if (rp->partial_rotary_factor <= 0 || rp->partial_rotary_factor > 1)
      bad(name, "partial_rotary_factor must be in (0, 1]");
    int64_t rd = int64_t(double(c.head_dim) * rp->partial_rotary_factor);
    if (rd % 2 != 0 || rd == 0)
      bad(name, "partial_rotary_factor * head_dim = " + std::to_string(rd) + " must be a positive even number");
  }
  for (int64_t e : c.eos_token_ids)
    if (e < 0 || e >= c.vocab_size) bad("eos_token_id", std::to_string(e) + " is outside the vocabulary");
}

ModelConfig load_config_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail("config", "cannot open " + path, "pass a model directory that contains config.json");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::exception& e) {
    fail("config", path + ": invalid JSON: " + e.what());
  }
  return config_from_json(j, path);
}

json config_to_json(const ModelConfig& c) {
  auto rope = [](const RopeParams& r) {
    return json{{"rope_type", "default"}, {"rope_theta", r.theta}, {"partial_rotary_factor", r.partial_rotary_factor}};
  };
  json j = {
      {"architectures", {"ZayaForCausalLM"}},
      {"model_type", "zaya"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"lm_head_bias", c.lm_head_bias},
      {"moe_intermediate_size", c.moe_intermediate_size},
      {"num_experts", c.num_experts},
      {"num_experts_per_tok", c.num_experts_per_tok},
      {"router_hidden_size", c.router_hidden_size},
      {"cca_time0", c.cca_time0},
      {"cca_time1", c.cca_time1},
      {"layer_types", c.layer_types},
      {"rope_parameters", {{"hybrid", rope(c.rope_hybrid)}, {"hybrid_sliding", rope(c.rope_sliding)}}},
      {"pad_token_id", c.pad_token_id},
      {"bos_token_id", c.bos_token_id},
      {"initializer_range", c.initializer_range},
      {"skip_expert_output", c.skip_expert_output == SkipMode::Zero ? "zero" : "identity"},
  };
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  else j["sliding_window"] = nullptr;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else j["eos_token_id"] = c.eos_token_ids;
  return j;
}

}  // namespace zaya
