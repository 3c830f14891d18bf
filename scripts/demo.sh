#!/usr/bin/env bash
# The README's main job: `zaya train` with no arguments trains the built-in default recipe
# (a small ZAYA model on the State of the Union demo corpus) on the CPU, then shows a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
build/bin/zaya train
