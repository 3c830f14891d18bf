#!/usr/bin/env bash
# Builds the libFuzzer targets (preset "fuzz": clang, -fsanitize=fuzzer,address,undefined) and
# runs each for FUZZ_SECONDS (default 30), JOBS at a time, on a scratch copy of its seed corpus under
# tests/fuzz/corpus/. Exits non-zero if any target crashes, leaks, times out or runs out of
# memory; the reproducer is left under build-fuzz/fuzz-run/<target>/artifacts/.
#   FUZZ_SECONDS=300 scripts/fuzz.sh            # longer run
#   FUZZ_TARGETS="safetensors" scripts/fuzz.sh  # one target
#   JOBS=2                                      # build parallelism, and targets run at once
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-30}
targets=${FUZZ_TARGETS:-"safetensors config shard completion_request recipe chat tokenizer"}
build=build-fuzz

cmake --preset fuzz >/dev/null
build_targets=()
for t in $targets; do build_targets+=("fuzz_$t"); done
cmake --build "$build" -j "${JOBS:-2}" --target "${build_targets[@]}"

# One target's run; its verdict is left in $work/verdict (ok, or the exit status).
run_target() {
  local t="$1" bin="$build/bin/fuzz_$1" work="$build/fuzz-run/$1" rc dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  set +e
  "$bin" "$work/corpus" "${dict[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -artifact_prefix="$work/artifacts/" -print_final_stats=1 >"$work/log.txt" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then echo "$rc" > "$work/verdict"; else echo ok > "$work/verdict"; fi
}

# The targets run side by side, JOBS at a time (each is one process on one core); their results
# are reported in order once all have ended.
running=0
for t in $targets; do
  work="$build/fuzz-run/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp -r tests/fuzz/corpus/"$t"/. "$work/corpus/"
  if [ "$running" -ge "${JOBS:-2}" ]; then wait -n || true; running=$((running - 1)); fi
  echo "fuzz: running fuzz_$t for ${seconds}s (corpus: $work/corpus)"
  run_target "$t" &
  running=$((running + 1))
done
wait

status=0
for t in $targets; do
  work="$build/fuzz-run/$t"
  grep -E '^(stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)' "$work/log.txt" || true
  verdict=$(cat "$work/verdict" 2>/dev/null || echo "no verdict")
  if [ "$verdict" != ok ]; then
    echo "fuzz: fuzz_$t FAILED (exit $verdict); reproducers:" >&2
    ls "$work/artifacts" >&2 || true
    tail -n 60 "$work/log.txt" >&2
    status=1
  else
    echo "fuzz: fuzz_$t ok"
  fi
done
exit $status
