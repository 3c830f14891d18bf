// Training recipes: one TOML file describes one training run (model, data, batch, optimizer,
// schedule, balancer, checkpoints, logging, eval, stability). Every field has a default, so an
// empty file is a valid recipe; recipes/default.toml is the built-in default and is compiled
// into the binary (default_recipe()), so `zaya train` works from any directory.
// Keys and their meaning: docs/recipes.md.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace zaya {

struct RecipeModel {
  std::string preset = "zaya-small";           // built-in preset used when config is ""
  std::string config;                          // HF config.json; "" = use preset
  std::string init_from;                       // HF model dir to start from; "" = random init
  int64_t vocab_size = 0;                      // 0 = from the tokenizer / config
  std::string skip_expert_output = "identity";  // "identity" (p*x) or "zero" (HF)
  bool operator==(const RecipeModel&) const = default;
};

// One shard dataset (`zaya data prepare` output), declared once and named by phase mixtures.
struct RecipeDataset {
  std::string name;
  std::string dir;
  bool operator==(const RecipeDataset&) const = default;
};

struct RecipeMixtureWeight {
  std::string dataset;  // a RecipeDataset name
  double weight = 1.0;  // relative, > 0
  bool operator==(const RecipeMixtureWeight&) const = default;
};

// One training phase ([[phases]]): its token budget, sequence length and mixture, and
// optionally a RoPE theta and a learning-rate scale that apply while it runs.
struct RecipePhase {
  std::string name;
  int64_t tokens = 0;      // multiple of seq_len; 0 only for the last phase (= until the end)
  int64_t seq_len = 0;
  std::vector<RecipeMixtureWeight> mixture;  // sorted by dataset name
  double rope_theta = 0;   // 0 = the model's own
  double lr_scale = 1.0;   // multiplies the LR schedule
  int64_t context_parallel = 0;  // ranks sharing each sequence in this phase; 0 = parallel.context_parallel
  bool operator==(const RecipePhase&) const = default;
};

struct RecipeData {
  std::string train = "data/sotu/train.bin";
  std::string val = "data/sotu/val.bin";       // "" = no held-out loss
  std::string tokenizer = "data/sotu/tokenizer.model";  // "" only with model.init_from
  int64_t seq_len = 256;
  bool reset_at_document_boundary = false;
  std::vector<RecipeDataset> datasets;  // [[data.datasets]]; used by [[phases]]
  bool operator==(const RecipeData&) const = default;
};

struct RecipeBatch {
  int64_t micro_batch = 8;    // sequences per forward/backward
  int64_t global_batch = 16;  // sequences per optimizer step (a multiple of micro_batch)
  int64_t ramp_start = 0;     // global batch at step 0 of a linear ramp; 0 = no ramp
  int64_t ramp_steps = 0;     // steps over which the ramp reaches global_batch
  // Keep each block's inputs only and rerun its forward before its backward (less activation
  // memory for about a third more forward+backward work; the step is otherwise the same).
  bool recompute_activations = false;
  bool operator==(const RecipeBatch&) const = default;
};

struct RecipeOptimizer {
  double lr = 3e-3;
  double weight_decay = 0.1;
  double muon_momentum = 0.95;
  bool nesterov = true;
  int64_t ns_steps = 5;  // Newton-Schulz iterations
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.95;
  double adam_eps = 1e-8;
  double clip_grad_norm = 1.0;  // 0 = no clipping
  bool operator==(const RecipeOptimizer&) const = default;
};

struct RecipeSchedule {
  std::string kind = "wsd";  // "wsd" | "cosine" | "constant"
  int64_t warmup_steps = 30;
  int64_t total_steps = 300;
  double decay_fraction = 0.2;  // wsd: fraction of total_steps spent decaying
  double min_lr_ratio = 0.1;    // final lr = min_lr_ratio * lr (wsd, cosine)
  bool operator==(const RecipeSchedule&) const = default;
};

struct RecipeBalancer {
  double lr = 1e-3;  // 0 = biases frozen
  double beta1 = 0.9;
  double beta2 = 0.999;
  std::string target = "uniform";
  double skip_bias = -1.0;
  bool balance_skip = false;
  bool operator==(const RecipeBalancer&) const = default;
};

struct RecipeCheckpoint {
  int64_t every = 200;  // steps; 0 = no periodic checkpoints
  int64_t keep = 3;     // newest checkpoints kept on disk
  std::string dir;      // "" = run_dir/checkpoints (see checkpoint_dir())
  bool operator==(const RecipeCheckpoint&) const = default;
};

struct RecipeLogging {
  int64_t every = 10;
  bool metrics = true;
  bool plot = true;
  bool operator==(const RecipeLogging&) const = default;
};

struct RecipeEval {
  int64_t every = 100;  // steps; 0 = never
  int64_t batches = 8;
  std::string sample_prompt = "The State of the Union";
  int64_t sample_tokens = 48;  // 0 = no sample
  // Multiple-choice questions (eval/multiple_choice.h, JSONL) scored at every evaluation; "" =
  // none. choices_max: at most this many of them (0 = all).
  std::string choices;
  int64_t choices_max = 0;
  bool operator==(const RecipeEval&) const = default;
};

// Parallel layout beyond plain data parallelism (spec D.2).
struct RecipeParallel {
  // Ranks that share each sequence (context parallelism, CP-CCA): the job's ranks form groups of
  // this many consecutive ranks; each group is one data-parallel rank. 1 = off.
  int64_t context_parallel = 1;
  bool operator==(const RecipeParallel&) const = default;
};

struct Recipe;
// The context-parallel group size of phase p (a phase's own setting, else parallel's); with no
// [[phases]], parallel.context_parallel.
int64_t context_parallel_of(const Recipe& r, size_t phase);

struct RecipeStability {
  std::string policy = "skip";  // "skip" | "rollback"
  double spike_factor = 4.0;    // loss > spike_factor * running median (or NaN/Inf) is bad
  int64_t max_bad_steps = 3;    // consecutive bad steps before a rollback
  bool operator==(const RecipeStability&) const = default;
};

struct Recipe {
  int64_t seed = 1234;
  std::string run_dir = "runs/default";
  RecipeModel model;
  RecipeData data;
  RecipeBatch batch;
  RecipeOptimizer optimizer;
  RecipeSchedule schedule;
  RecipeBalancer balancer;
  RecipeCheckpoint checkpoint;
  RecipeLogging logging;
  RecipeEval eval;
  RecipeStability stability;
  RecipeParallel parallel;
  // [[phases]]: a phased mixture of shard datasets (the data issue's curriculum). Empty = one
  // phase reading data.train at data.seq_len.
  std::vector<RecipePhase> phases;
  bool operator==(const Recipe&) const = default;
};

// Parses and fully validates a recipe. `source` names the text in errors (usually its path).
// Missing keys keep their defaults. Throws zaya::Error (component "recipe") on TOML syntax
// errors (with line and column), unknown sections/keys (with a suggestion), wrong types and
// out-of-range or inconsistent values; every message names the source and the key.
Recipe parse_recipe(const std::string& toml_text, const std::string& source);

// Reads `path` and parses it (errors name the path).
Recipe load_recipe(const std::string& path);

// Applies one `--set section.key=value` (top-level keys without a section: `seed=7`).
// The value is a TOML value (`lr=1e-3`, `nesterov=false`, `kind="cosine"`); a string field also
// takes bare text (`schedule.kind=cosine`, `run_dir=runs/a`). The value is type-checked and
// range-checked on its own; constraints between fields (global_batch a multiple of
// micro_batch, warmup <= total, ...) are checked by validate_recipe, to be called once all
// overrides are applied (resolve_recipe does this).
void apply_override(Recipe& recipe, const std::string& assignment);

// Checks every field and every cross-field constraint; `source` names the recipe in errors.
void validate_recipe(const Recipe& recipe, const std::string& source);

// The usual entry point: `path` ("" = the built-in default), then each override in order, then
// validate_recipe.
Recipe resolve_recipe(const std::string& path, const std::vector<std::string>& overrides);

// The fully resolved recipe as TOML: every section and key, in the documented order;
// parse_recipe(recipe_to_toml(r), ...) == r.
std::string recipe_to_toml(const Recipe& recipe);

// The built-in default, parsed from the embedded copy of recipes/default.toml (== Recipe{}).
Recipe default_recipe();
// The embedded text itself, byte for byte recipes/default.toml.
const std::string& default_recipe_toml();

// checkpoint.dir, or run_dir + "/checkpoints" when it is "".
std::string checkpoint_dir(const Recipe& recipe);

// Every key as "section.key" ("seed", "run_dir" for the top level), in documented order.
std::vector<std::string> recipe_keys();

}  // namespace zaya
