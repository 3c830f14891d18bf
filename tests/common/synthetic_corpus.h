// A learnable synthetic language for the training tests (tests/unit/test_trainer.cpp and the
// data-parallel check tests/dp/dp_check.cpp): a noisy deterministic successor chain over 64
// symbols (unigram entropy ~ln 64, conditional entropy far lower), written as one document;
// and the base of their recipes, zaya-tiny on that corpus; and two shard datasets for phases.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/shard_writer.h"
#include "data/token_file.h"
#include "train/recipe.h"

namespace zaya::test {

// Writes n tokens drawn with `seed` to the token file at path.
inline void write_synthetic_corpus(const std::string& path, size_t n, uint64_t seed) {
  TokenFile f;
  f.vocab_size = 64;
  f.documents = 1;
  Rng rng(seed);
  uint32_t a = 3;
  for (size_t i = 0; i < n; ++i) {
    uint32_t next = rng.uniform() < 0.9 ? (a * 5 + 3) % 64 : uint32_t(rng.next_u64() % 64);
    f.tokens.push_back(next);
    a = next;
  }
  write_token_file(path, f);
}

// Two shard datasets, dir/a and dir/b (train and val splits), of short documents (5-44 tokens
// and EOS = 1, so packed windows cross many boundaries) from two successor chains over 64
// symbols: the data of the curriculum tests (phases mixing a and b). mask_b: dataset b is
// supervised fine-tuning data, the first third of each document a prompt (loss mask 0).
inline void write_synthetic_shard_datasets(const std::string& dir, bool mask_b = false) {
  Rng rng(9);
  for (const char* name : {"a", "b"}) {
    const std::string out = dir + "/" + name;
    std::filesystem::create_directories(out);
    const bool masked = mask_b && name[0] == 'b';
    Manifest m;
    m.vocab_size = 64;
    m.eos_id = 1;
    m.loss_mask = masked;
    if (masked) m.prompt_field = "prompt", m.completion_field = "completion";
    for (const char* split : {"train", "val"}) {
      ShardWriter w({out, split, 4096, 0, 64, masked});
      for (int d = 0; d < (std::string(split) == "train" ? 80 : 12); ++d) {
        std::vector<uint32_t> doc;
        uint32_t a = uint32_t(rng.next_u64() % 64);
        const int len = 5 + int(rng.next_u64() % 40);
        for (int i = 0; i < len; ++i) doc.push_back(a = (a * (name[0] == 'a' ? 5 : 7) + 3) % 64);
        doc.push_back(1);
        std::vector<uint8_t> mask;
        if (masked)
          for (size_t i = 0; i < doc.size(); ++i) mask.push_back(i >= doc.size() / 3 ? 1 : 0);
        w.add_document(doc, name, mask);
      }
      m.splits[split] = w.finish();
    }
    write_manifest(out, m);
  }
}

// zaya-tiny trained on dir/train.bin, evaluated on dir/val.bin (no tokenizer, 32-token
// sequences, no samples), run directory dir/run, lr 1e-2 with 2 warmup steps. The callers set
// the seed, batch, length, checkpoint and eval cadence.
inline Recipe synthetic_recipe(const std::string& dir) {
  Recipe r;
  r.run_dir = dir + "/run";
  r.model.preset = "zaya-tiny";
  r.data.train = dir + "/train.bin";
  r.data.val = dir + "/val.bin";
  r.data.tokenizer = "";
  r.data.seq_len = 32;
  r.optimizer.lr = 1e-2;
  r.schedule.warmup_steps = 2;
  r.eval.sample_tokens = 0;
  return r;
}

}  // namespace zaya::test
