// Training recipes: defaults, the embedded default vs recipes/default.toml, the full round trip
// through recipe_to_toml, --set overrides of every type, and every error class naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "test_helpers.h"
#include "train/recipe.h"

namespace zaya {
namespace {

const std::string kDefaultPath = std::string(ZAYA_SOURCE_DIR) + "/recipes/default.toml";

// The message of the zaya::Error that `f` throws ("" if none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.component(), "recipe");
    return e.what();
  }
  return "";
}

std::string parse_error(const std::string& text) {
  return error_of([&] { parse_recipe(text, "recipe.toml"); });
}

std::string set_error(const std::string& assignment) {
  Recipe r;
  return error_of([&] { apply_override(r, assignment); });
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

// ---- defaults ------------------------------------------------------------------------------

TEST(Recipe, Defaults) {
  Recipe r;
  EXPECT_EQ(r.seed, 1234);
  EXPECT_EQ(r.run_dir, "runs/default");
  EXPECT_EQ(r.model.preset, "zaya-small");
  EXPECT_EQ(r.model.config, "");
  EXPECT_EQ(r.model.init_from, "");
  EXPECT_EQ(r.model.vocab_size, 0);
  EXPECT_EQ(r.model.skip_expert_output, "identity");
  EXPECT_EQ(r.data.train, "data/sotu/train.bin");
  EXPECT_EQ(r.data.val, "data/sotu/val.bin");
  EXPECT_EQ(r.data.tokenizer, "data/sotu/tokenizer.model");
  EXPECT_EQ(r.data.seq_len, 256);
  EXPECT_FALSE(r.data.reset_at_document_boundary);
  EXPECT_EQ(r.batch.micro_batch, 8);
  EXPECT_EQ(r.batch.global_batch, 16);
  EXPECT_EQ(r.batch.ramp_start, 0);
  EXPECT_EQ(r.batch.ramp_steps, 0);
  EXPECT_FALSE(r.batch.recompute_activations);
  EXPECT_EQ(r.optimizer.lr, 3e-3);
  EXPECT_EQ(r.optimizer.weight_decay, 0.1);
  EXPECT_EQ(r.optimizer.muon_momentum, 0.95);
  EXPECT_TRUE(r.optimizer.nesterov);
  EXPECT_EQ(r.optimizer.ns_steps, 5);
  EXPECT_EQ(r.optimizer.adam_beta1, 0.9);
  EXPECT_EQ(r.optimizer.adam_beta2, 0.95);
  EXPECT_EQ(r.optimizer.adam_eps, 1e-8);
  EXPECT_EQ(r.optimizer.clip_grad_norm, 1.0);
  EXPECT_EQ(r.schedule.kind, "wsd");
  EXPECT_EQ(r.schedule.warmup_steps, 30);
  EXPECT_EQ(r.schedule.total_steps, 300);
  EXPECT_EQ(r.schedule.decay_fraction, 0.2);
  EXPECT_EQ(r.schedule.min_lr_ratio, 0.1);
  EXPECT_EQ(r.balancer.lr, 1e-3);
  EXPECT_EQ(r.balancer.beta1, 0.9);
  EXPECT_EQ(r.balancer.beta2, 0.999);
  EXPECT_EQ(r.balancer.target, "uniform");
  EXPECT_EQ(r.balancer.skip_bias, -1.0);
  EXPECT_FALSE(r.balancer.balance_skip);
  EXPECT_EQ(r.checkpoint.every, 200);
  EXPECT_EQ(r.checkpoint.keep, 3);
  EXPECT_EQ(r.checkpoint.dir, "");
  EXPECT_EQ(checkpoint_dir(r), "runs/default/checkpoints");
  EXPECT_EQ(r.logging.every, 10);
  EXPECT_TRUE(r.logging.metrics);
  EXPECT_TRUE(r.logging.plot);
  EXPECT_EQ(r.eval.every, 100);
  EXPECT_EQ(r.eval.batches, 8);
  EXPECT_EQ(r.eval.sample_prompt, "The State of the Union");
  EXPECT_EQ(r.eval.sample_tokens, 48);
  EXPECT_EQ(r.stability.policy, "skip");
  EXPECT_EQ(r.stability.spike_factor, 4.0);
  EXPECT_EQ(r.stability.max_bad_steps, 3);
  EXPECT_NO_THROW(validate_recipe(r, "defaults"));
}

TEST(Recipe, EmptyFileIsTheDefault) {
  EXPECT_EQ(parse_recipe("", "empty.toml"), Recipe{});
  EXPECT_EQ(parse_recipe("# only a comment\n", "c.toml"), Recipe{});
  Recipe r = parse_recipe("[optimizer]\nlr = 1e-4\n", "partial.toml");
  Recipe want;
  want.optimizer.lr = 1e-4;
  EXPECT_EQ(r, want);
}

TEST(Recipe, FileAndEmbeddedDefaultAgree) {
  std::string file = test::read_file(kDefaultPath);
  ASSERT_FALSE(file.empty()) << kDefaultPath;
  EXPECT_EQ(file, default_recipe_toml()) << "recipes/default.toml and the copy embedded in "
                                            "src/train/recipe.cpp differ; keep them identical";
  EXPECT_EQ(load_recipe(kDefaultPath), default_recipe());
  EXPECT_EQ(default_recipe(), Recipe{}) << "default.toml and the struct defaults in recipe.h differ";
  // The file sets every key explicitly.
  for (const std::string& key : recipe_keys()) {
    std::string leaf = key.substr(key.find('.') + 1);
    EXPECT_HAS(file, "\n" + leaf + " = ");
  }
}

TEST(Recipe, DocsDescribeEveryKey) {
  std::string doc = test::read_file(std::string(ZAYA_SOURCE_DIR) + "/docs/recipes.md");
  ASSERT_FALSE(doc.empty());
  for (const std::string& key : recipe_keys()) {
    size_t dot = key.find('.');
    if (dot != std::string::npos) {
      EXPECT_HAS(doc, "### `[" + key.substr(0, dot) + "]`");
    }
    EXPECT_HAS(doc, "| `" + key.substr(dot + 1) + "` |");
  }
}

TEST(Recipe, ResolveWithoutPathUsesTheBuiltInDefault) {
  EXPECT_EQ(resolve_recipe("", {}), Recipe{});
  Recipe r = resolve_recipe(kDefaultPath, {"batch.micro_batch=32", "batch.global_batch=64"});
  EXPECT_EQ(r.batch.micro_batch, 32);  // the intermediate state (global 16, micro 32) is not checked
  EXPECT_EQ(r.batch.global_batch, 64);
  std::string e = error_of([] { resolve_recipe("", {"batch.micro_batch=32"}); });
  EXPECT_HAS(e, "'batch.global_batch'");
  EXPECT_HAS(e, "multiple of batch.micro_batch (32)");
}

// ---- round trip ----------------------------------------------------------------------------

Recipe unusual_recipe() {
  Recipe r;
  r.seed = 9007199254740993;  // not representable as a double
  r.run_dir = "runs/ünïcödé \"quoted\" back\\slash\ttab\nnewline\x01";
  r.model.preset = "";
  r.model.config = "/models/zaya/config.json";
  r.model.init_from = "/models/zaya";
  r.model.vocab_size = 262272;
  r.model.skip_expert_output = "zero";
  r.data.train = "a.bin";
  r.data.val = "";
  r.data.tokenizer = "";
  r.data.seq_len = 4096;
  r.data.reset_at_document_boundary = true;
  r.batch = {4, 12, 4, 100};
  r.optimizer.lr = 0.1 + 0.2;  // 0.30000000000000004
  r.optimizer.weight_decay = 0;
  r.optimizer.muon_momentum = 0.999999999999;
  r.optimizer.nesterov = false;
  r.optimizer.ns_steps = 7;
  r.optimizer.adam_beta1 = 0;
  r.optimizer.adam_beta2 = 1 - 1e-16;
  r.optimizer.adam_eps = 5e-324;  // smallest subnormal
  r.optimizer.clip_grad_norm = 1e300;
  r.schedule = {"cosine", 600, 600, 1.0, 0.0};
  r.balancer = {0, 0.5, 0.25, "uniform", -0.0, true};
  r.checkpoint = {0, 1, "/ckpt"};
  r.logging = {1, false, false};
  r.eval = {0, 1, "", 0, "", 7};
  r.stability = {"skip", 1.0000001, 100};
  return r;
}

TEST(Recipe, RoundTripsThroughToml) {
  for (const Recipe& r : {Recipe{}, unusual_recipe()}) {
    ASSERT_NO_THROW(validate_recipe(r, "r"));
    std::string text = recipe_to_toml(r);
    Recipe back = parse_recipe(text, "resolved.toml");
    EXPECT_EQ(back, r) << text;
    EXPECT_EQ(recipe_to_toml(back), text);
    EXPECT_TRUE(std::signbit(back.balancer.skip_bias) == std::signbit(r.balancer.skip_bias));
  }
}

TEST(Recipe, ResolvedTomlHasEveryKey) {
  std::string text = recipe_to_toml(Recipe{});
  for (const char* s : {"[model]", "[data]", "[batch]", "[optimizer]", "[schedule]", "[balancer]",
                        "[checkpoint]", "[logging]", "[eval]", "[stability]", "[parallel]"})
    EXPECT_HAS(text, std::string("\n") + s + "\n");
  EXPECT_EQ(recipe_keys().size(), 53u);
  for (const std::string& key : recipe_keys()) EXPECT_HAS(text, "\n" + key.substr(key.find('.') + 1) + " = ");
  EXPECT_HAS(text, "\nlr = 0.003\n");
  EXPECT_HAS(text, "\nclip_grad_norm = 1.0\n");  // floats stay floats
  EXPECT_HAS(text, "\nseed = 1234\n");
  EXPECT_HAS(text, "\nkind = \"wsd\"\n");
  EXPECT_HAS(text, "\nnesterov = true\n");
}

// ---- overrides -----------------------------------------------------------------------------

TEST(Recipe, OverridesOfEveryType) {
  Recipe r;
  apply_override(r, "optimizer.lr=1e-4");
  EXPECT_EQ(r.optimizer.lr, 1e-4);
  apply_override(r, "optimizer.weight_decay=0");  // an integer for a float field
  EXPECT_EQ(r.optimizer.weight_decay, 0.0);
  apply_override(r, "batch.global_batch=64");
  EXPECT_EQ(r.batch.global_batch, 64);
  apply_override(r, "seed=7");  // top level
  EXPECT_EQ(r.seed, 7);
  apply_override(r, "optimizer.nesterov=false");
  EXPECT_FALSE(r.optimizer.nesterov);
  apply_override(r, "schedule.kind=cosine");  // bare string
  EXPECT_EQ(r.schedule.kind, "cosine");
  apply_override(r, "schedule.kind=\"constant\"");  // TOML string
  EXPECT_EQ(r.schedule.kind, "constant");
  apply_override(r, " run_dir = runs/exp 1 ");  // bare, trimmed, inner space kept
  EXPECT_EQ(r.run_dir, "runs/exp 1");
  apply_override(r, "eval.sample_prompt='Four score = seven'");  // literal string; '=' in value
  EXPECT_EQ(r.eval.sample_prompt, "Four score = seven");
  apply_override(r, "eval.sample_prompt=\"tab\\there\"");
  EXPECT_EQ(r.eval.sample_prompt, "tab\there");
  apply_override(r, "model.config=");  // empty bare string
  EXPECT_EQ(r.model.config, "");
  apply_override(r, "model.init_from=123");  // a string field keeps non-string text verbatim
  EXPECT_EQ(r.model.init_from, "123");
  apply_override(r, "data.reset_at_document_boundary=true");
  EXPECT_TRUE(r.data.reset_at_document_boundary);
  apply_override(r, "stability.spike_factor=2.5");
  EXPECT_EQ(r.stability.spike_factor, 2.5);
  apply_override(r, "data.seq_len=1_024");  // TOML integer syntax
  EXPECT_EQ(r.data.seq_len, 1024);
  EXPECT_NO_THROW(validate_recipe(r, "overridden"));
  // The resolved recipe carries the overrides through a round trip.
  EXPECT_EQ(parse_recipe(recipe_to_toml(r), "x"), r);
}

TEST(Recipe, OverrideErrors) {
  std::string e = set_error("optimizer.lrr=1");
  EXPECT_HAS(e, "unknown key 'optimizer.lrr'");
  EXPECT_HAS(e, "--set optimizer.lrr=1");
  EXPECT_HAS(e, "did you mean 'optimizer.lr'?");

  e = set_error("warmup_steps=5");
  EXPECT_HAS(e, "did you mean 'schedule.warmup_steps'?");

  e = set_error("optimzer.lr=1");
  EXPECT_HAS(e, "unknown key 'optimzer.lr'");
  EXPECT_HAS(e, "did you mean 'optimizer.lr'?");

  e = set_error("optimizer.lr");
  EXPECT_HAS(e, "expected section.key=value");

  e = set_error("optimizer=1");
  EXPECT_HAS(e, "'optimizer' is a section");

  e = set_error("optimizer.lr=fast");
  EXPECT_HAS(e, "'optimizer.lr'");
  EXPECT_HAS(e, "expected a float > 0");
  EXPECT_HAS(e, "'fast' (not a TOML value)");

  e = set_error("optimizer.lr=-1");
  EXPECT_HAS(e, "expected a float > 0, found integer -1");

  e = set_error("optimizer.lr=nan");
  EXPECT_HAS(e, "found float nan");

  e = set_error("batch.micro_batch=2.5");
  EXPECT_HAS(e, "'batch.micro_batch'");
  EXPECT_HAS(e, "expected an integer in [1, ");
  EXPECT_HAS(e, "found float 2.5");

  e = set_error("optimizer.nesterov=yes");
  EXPECT_HAS(e, "expected a boolean (true or false)");

  e = set_error("optimizer.nesterov=1");
  EXPECT_HAS(e, "found integer 1");

  e = set_error("schedule.kind=linear");
  EXPECT_HAS(e, "'schedule.kind'");
  EXPECT_HAS(e, "one of \"wsd\", \"cosine\", \"constant\", found string \"linear\"");

  e = set_error("optimizer.lr=1\nseed=3");  // one value only
  EXPECT_HAS(e, "not a TOML value");

  e = set_error("run_dir=");
  EXPECT_HAS(e, "'run_dir'");
  EXPECT_HAS(e, "a non-empty string");

  e = set_error("run_dir=\xff\xfe");
  EXPECT_HAS(e, "UTF-8");

  // A failed override leaves the recipe unchanged.
  Recipe r;
  EXPECT_THROW(apply_override(r, "optimizer.adam_beta2=1.0"), Error);
  EXPECT_EQ(r, Recipe{});
}

// ---- errors --------------------------------------------------------------------------------

TEST(Recipe, UnknownKeysAndSections) {
  std::string e = parse_error("[optimizer]\nlrr = 1e-3\n");
  EXPECT_HAS(e, "unknown key 'optimizer.lrr' in recipe.toml at line 2 (did you mean 'optimizer.lr'?)");
  EXPECT_HAS(e, "keys in [optimizer]: lr, weight_decay");

  e = parse_error("[optimizer]\nwarmup = 10\n");
  EXPECT_HAS(e, "did you mean 'schedule.warmup_steps'?");

  e = parse_error("[optimizer]\ncompletely_different = 10\n");
  EXPECT_HAS(e, "unknown key 'optimizer.completely_different'");
  EXPECT_EQ(e.find("did you mean"), std::string::npos) << e;

  e = parse_error("lr = 0.1\n");
  EXPECT_HAS(e, "unknown key 'lr' in recipe.toml at line 1 (did you mean 'optimizer.lr'?)");

  e = parse_error("sed = 1\n");
  EXPECT_HAS(e, "did you mean 'seed'?");

  e = parse_error("seed = 1\n\n[optim]\nlr = 1\n");
  EXPECT_HAS(e, "unknown section '[optim]' in recipe.toml at line 3");
  EXPECT_HAS(e, "did you mean '[optimizer]'?");

  e = parse_error("[model.extra]\nx = 1\n");
  EXPECT_HAS(e, "unknown key 'model.extra'");

  e = parse_error("optimizer.lr = 1e-3\noptimizer.lrx = 2\n");  // dotted keys work like sections
  EXPECT_HAS(e, "unknown key 'optimizer.lrx'");
  EXPECT_EQ(parse_recipe("optimizer.lr = 1e-3\n", "d.toml").optimizer.lr, 1e-3);
}

TEST(Recipe, WrongTypes) {
  std::string e = parse_error("[optimizer]\nlr = \"fast\"\n");
  EXPECT_HAS(e, "'optimizer.lr' in recipe.toml at line 2: expected a float > 0, found string \"fast\"");

  e = parse_error("seed = 1.5\n");
  EXPECT_HAS(e, "'seed' in recipe.toml at line 1: expected an integer >= 0, found float 1.5");

  e = parse_error("[logging]\nplot = \"yes\"\n");
  EXPECT_HAS(e, "'logging.plot'");
  EXPECT_HAS(e, "expected a boolean (true or false), found string \"yes\"");

  e = parse_error("[data]\ntrain = 3\n");
  EXPECT_HAS(e, "'data.train'");
  EXPECT_HAS(e, "expected a non-empty string, found integer 3");

  e = parse_error("[eval]\nsample_prompt = [1, 2]\n");
  EXPECT_HAS(e, "'eval.sample_prompt'");
  EXPECT_HAS(e, "found an array");

  e = parse_error("optimizer = 3\n");
  EXPECT_HAS(e, "'optimizer' in recipe.toml at line 1: expected a table [optimizer], found integer 3");

  e = parse_error("[[optimizer]]\nlr = 1\n");
  EXPECT_HAS(e, "expected a table [optimizer], found an array");

  e = parse_error("run_dir = 1979-05-27\n");
  EXPECT_HAS(e, "found a date/time");

  e = parse_error("[optimizer.lr]\nx = 1\n");
  EXPECT_HAS(e, "'optimizer.lr'");
  EXPECT_HAS(e, "found a table");
}

TEST(Recipe, OutOfRangeValues) {
  struct Case {
    const char* text;
    const char* key;
    const char* expect;
  };
  const Case cases[] = {
      {"[optimizer]\nlr = 0.0\n", "'optimizer.lr'", "expected a float > 0, found float 0.0"},
      {"[optimizer]\nlr = inf\n", "'optimizer.lr'", "found float inf"},
      {"[optimizer]\nadam_beta1 = 1.0\n", "'optimizer.adam_beta1'", "expected a float in [0, 1), found float 1.0"},
      {"[optimizer]\nadam_beta2 = -0.1\n", "'optimizer.adam_beta2'", "in [0, 1)"},
      {"[optimizer]\nmuon_momentum = 1\n", "'optimizer.muon_momentum'", "in [0, 1)"},
      {"[optimizer]\nadam_eps = 0\n", "'optimizer.adam_eps'", "a float > 0"},
      {"[optimizer]\nweight_decay = -1\n", "'optimizer.weight_decay'", "a float >= 0"},
      {"[optimizer]\nclip_grad_norm = -1\n", "'optimizer.clip_grad_norm'", "a float >= 0"},
      {"[optimizer]\nns_steps = 0\n", "'optimizer.ns_steps'", "an integer in [1, 100], found integer 0"},
      {"[balancer]\nbeta1 = 1.5\n", "'balancer.beta1'", "in [0, 1)"},
      {"[balancer]\nbeta2 = 1.0\n", "'balancer.beta2'", "in [0, 1)"},
      {"[balancer]\nlr = -1e-3\n", "'balancer.lr'", "a float >= 0"},
      {"[balancer]\ntarget = \"zipf\"\n", "'balancer.target'", "the string \"uniform\""},
      {"[balancer]\nskip_bias = nan\n", "'balancer.skip_bias'", "a finite float"},
      {"[data]\nseq_len = 1\n", "'data.seq_len'", "an integer in [2, "},
      {"[batch]\nmicro_batch = 0\n", "'batch.micro_batch'", "an integer in [1, "},
      {"[batch]\nglobal_batch = -16\n", "'batch.global_batch'", "found integer -16"},
      {"[schedule]\nkind = \"linear\"\n", "'schedule.kind'", "one of \"wsd\", \"cosine\", \"constant\""},
      {"[schedule]\ntotal_steps = 0\n", "'schedule.total_steps'", "an integer >= 1"},
      {"[schedule]\ndecay_fraction = 1.5\n", "'schedule.decay_fraction'", "a float in [0, 1]"},
      {"[schedule]\nmin_lr_ratio = -0.1\n", "'schedule.min_lr_ratio'", "a float in [0, 1]"},
      {"[stability]\npolicy = \"ignore\"\n", "'stability.policy'", "one of \"skip\", \"rollback\""},
      {"[stability]\nspike_factor = 1.0\n", "'stability.spike_factor'", "a float > 1"},
      {"[stability]\nmax_bad_steps = 0\n", "'stability.max_bad_steps'", "an integer >= 1"},
      {"[model]\nskip_expert_output = \"one\"\n", "'model.skip_expert_output'", "one of \"identity\", \"zero\""},
      {"[model]\nvocab_size = -1\n", "'model.vocab_size'", "an integer in [0, "},
      {"[checkpoint]\nkeep = 0\n", "'checkpoint.keep'", "an integer >= 1"},
      {"[logging]\nevery = 0\n", "'logging.every'", "an integer >= 1"},
      {"[eval]\nbatches = 0\n", "'eval.batches'", "an integer >= 1"},
      {"seed = -1\n", "'seed'", "an integer >= 0"},
      {"run_dir = \"\"\n", "'run_dir'", "a non-empty string"},
  };
  for (const Case& c : cases) {
    std::string e = parse_error(c.text);
    EXPECT_HAS(e, c.key);
    EXPECT_HAS(e, c.expect);
    EXPECT_HAS(e, "recipe.toml at line");
  }
}

TEST(Recipe, InconsistentValues) {
  std::string e = parse_error("[batch]\nmicro_batch = 8\nglobal_batch = 12\n");
  EXPECT_HAS(e, "'batch.global_batch' in recipe.toml at line 3: expected a positive multiple of "
                "batch.micro_batch (8), found 12");

  e = parse_error("[schedule]\nwarmup_steps = 400\n");
  EXPECT_HAS(e, "'schedule.warmup_steps' in recipe.toml at line 2: expected at most schedule.total_steps (300)");

  e = parse_error("[schedule]\nwarmup_steps = 250\n");  // 250 + 0.2 * 300 > 300
  EXPECT_HAS(e, "'schedule.decay_fraction'");
  EXPECT_HAS(e, "recipe.toml at line 2: expected warmup_steps + decay_fraction * total_steps <= total_steps, found 250 + 60 > 300");
  EXPECT_NO_THROW(parse_recipe("[schedule]\nkind = \"cosine\"\nwarmup_steps = 300\n", "c.toml"));

  e = parse_error("[batch]\nramp_start = 12\n");
  EXPECT_HAS(e, "'batch.ramp_start'");
  EXPECT_HAS(e, "multiple of batch.micro_batch (8)");

  e = parse_error("[batch]\nramp_start = 8\n");
  EXPECT_HAS(e, "'batch.ramp_steps'");
  EXPECT_NO_THROW(parse_recipe("[batch]\nramp_start = 8\nramp_steps = 50\n", "ramp.toml"));

  e = parse_error("[model]\npreset = \"\"\n");
  EXPECT_HAS(e, "'model.preset'");
  EXPECT_NO_THROW(parse_recipe("[model]\npreset = \"\"\nconfig = \"c.json\"\n", "m.toml"));

  // No tokenizer: the vocabulary comes from the data and no samples are generated.
  EXPECT_NO_THROW(parse_recipe("[data]\ntokenizer = \"\"\n", "t.toml"));

  // Multiple-choice questions are text: they need the tokenizer.
  e = parse_error("[data]\ntokenizer = \"\"\n[eval]\nchoices = \"q.jsonl\"\n");
  EXPECT_HAS(e, "'eval.choices' in recipe.toml at line 4: expected \"\" when data.tokenizer is \"\"");

  e = parse_error("[stability]\npolicy = \"rollback\"\n[checkpoint]\nevery = 0\n");
  EXPECT_HAS(e, "'stability.policy'");
  EXPECT_HAS(e, "checkpoint.every");

  // Context parallelism cuts sequences into 2 x context_parallel chunks, with or without
  // document resets.
  e = parse_error("[parallel]\ncontext_parallel = 3\n");  // seq_len 256 is not a multiple of 6
  EXPECT_HAS(e, "'data.seq_len'");
  EXPECT_HAS(e, "expected a multiple of 2 x parallel.context_parallel (6), found 256");
  EXPECT_NO_THROW(parse_recipe(
      "[data]\nreset_at_document_boundary = true\n[parallel]\ncontext_parallel = 2\n", "cp_resets.toml"));
  EXPECT_NO_THROW(parse_recipe("[parallel]\ncontext_parallel = 4\n", "cp.toml"));
  e = parse_error("[parallel]\ncontext_parallel = 0\n");
  EXPECT_HAS(e, "'parallel.context_parallel'");

  // An in-memory recipe is checked the same way.
  Recipe r;
  r.optimizer.adam_beta1 = 1.0;
  e = error_of([&] { validate_recipe(r, "my recipe"); });
  EXPECT_HAS(e, "'optimizer.adam_beta1' in my recipe: expected a float in [0, 1), found float 1.0");
}

TEST(Recipe, SeveralProblemsAreAllReported) {
  std::string e = parse_error("[optimizer]\nlr = -1\nlrr = 2\n[schedule]\nkind = 3\n");
  EXPECT_HAS(e, "3 problems in recipe.toml");
  EXPECT_HAS(e, "'optimizer.lr'");
  EXPECT_HAS(e, "'optimizer.lrr'");
  EXPECT_HAS(e, "'schedule.kind'");
  EXPECT_LT(e.find("'optimizer.lr' "), e.find("'schedule.kind'"));  // in file order
}

TEST(Recipe, SyntaxErrorsHaveLineAndColumn) {
  std::string e = parse_error("seed = 1\n[optimizer]\nlr = = 3\n");
  EXPECT_HAS(e, "TOML syntax error in recipe.toml at line 3, column");
  e = parse_error("[optimizer\n");
  EXPECT_HAS(e, "TOML syntax error in recipe.toml at line 1");
  e = parse_error("seed = 1\nseed = 2\n");  // duplicate key
  EXPECT_HAS(e, "TOML syntax error in recipe.toml at line 2");
  e = parse_error("run_dir = \"\xff\"\n");
  EXPECT_HAS(e, "TOML syntax error in recipe.toml");
}

TEST(Recipe, LoadErrorsNameThePath) {
  std::string e = error_of([] { load_recipe("/nonexistent/recipe.toml"); });
  EXPECT_HAS(e, "cannot open recipe file '/nonexistent/recipe.toml'");
  e = error_of([] { load_recipe(ZAYA_SOURCE_DIR); });
  EXPECT_HAS(e, "is a directory");

  std::string path = ::testing::TempDir() + "zaya_recipe_test.toml";
  {
    std::ofstream out(path);
    out << "[optimizer]\nlr = 0\n";
  }
  e = error_of([&] { load_recipe(path); });
  EXPECT_HAS(e, "'optimizer.lr' in " + path + " at line 2");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace zaya
