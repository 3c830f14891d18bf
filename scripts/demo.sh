#!/usr/bin/env bash
# The README's main job until training lands: build a small random ZAYA model, show its
# shape, and stream a short greedy generation through the incremental decoder.
set -euo pipefail
cd "$(dirname "$0")/.."
ZAYA=build/bin/zaya
MODEL=runs/demo-model
$ZAYA init --preset zaya-small --out "$MODEL" --seed 7
$ZAYA info --model "$MODEL"
echo "--- greedy generation from a random model (ids) ---"
$ZAYA generate --model "$MODEL" --ids 2,17,301,45 --max-tokens 24 --temperature 0
