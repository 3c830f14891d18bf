#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": clang, -fsanitize=fuzzer,address,undefined) and
# runs each for FUZZ_SECONDS (default 30) on a scratch copy of its seed corpus under
# tests/fuzz/corpus/. Exits non-zero if any target crashes, leaks, times out or runs out of
# memory; the reproducer is left under build-fuzz/fuzz-run/<target>/artifacts/.
#   FUZZ_SECONDS=300 scripts/fuzz.sh            # longer run
#   FUZZ_TARGETS="safetensors" scripts/fuzz.sh  # one target
#   JOBS=2                                      # build parallelism
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-30}
targets=${FUZZ_TARGETS:-"safetensors config shard completion_request recipe chat"}
build=build-fuzz

cmake --preset fuzz >/dev/null
build_targets=()
for t in $targets; do build_targets+=("fuzz_$t"); done
cmake --build "$build" -j "${JOBS:-2}" --target "${build_targets[@]}"

status=0
for t in $targets; do
  bin="$build/bin/fuzz_$t"
  work="$build/fuzz-run/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp -r tests/fuzz/corpus/"$t"/. "$work/corpus/"
  echo "fuzz: running fuzz_$t for ${seconds}s (corpus: $work/corpus)"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  set +e
  "$bin" "$work/corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 >"$work/log.txt" 2>&1
  rc=$?
  set -e
  grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)' "$work/log.txt" || true
  if [ $rc -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
    echo "fuzz: fuzz_$t FAILED (exit $rc); reproducers:" >&2
    ls "$work/artifacts" >&2 || true
    tail -n 60 "$work/log.txt" >&2
    status=1
  else
    echo "fuzz: fuzz_$t ok"
  fi
done
exit $status
