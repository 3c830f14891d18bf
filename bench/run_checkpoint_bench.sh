#!/usr/bin/env bash
# Checkpoint stall benchmark (bench/bench_checkpoint.cpp): the sharded async save against a
# naive gather-to-rank-0 synchronous save of the same >= 500M-parameter training state, with
# one process and with `mpirun -np 2`. Builds the target in the configured build/ dir first.
#
# Usage: bench/run_checkpoint_bench.sh [OUT_DIR]     (default /tmp/zaya_ckpt_bench_out)
# Environment: BUILD_DIR (default build), NPS (default "1 2"), ROUNDS (default 3), THREADS
#   (OMP_NUM_THREADS per rank, default 1), ROOT (checkpoint directory, default
#   /tmp/zaya_ckpt_bench; removed at the end), BUILD=0 to skip the build, EXTRA_ARGS for
#   bench_checkpoint (e.g. "--staging 256,full --step-seconds 0.5").
# mpirun runs with --oversubscribe; as root it needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1, set here.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT=${1:-/tmp/zaya_ckpt_bench_out}
NPS=${NPS:-1 2}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1}
ROOT=${ROOT:-/tmp/zaya_ckpt_bench}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
mkdir -p "$OUT"

if [ "${BUILD:-1}" = 1 ]; then
  echo "== build: cmake --build $BUILD_DIR -j2 --target bench_checkpoint" >&2
  cmake --build "$BUILD_DIR" -j2 --target bench_checkpoint >&2
fi
BIN=$BUILD_DIR/bin/bench_checkpoint
DEV=$(basename "$(df --output=source "$(dirname "$ROOT")" | tail -1)")

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB; disk $DEV, $(df -h --output=avail "$(dirname "$ROOT")" | tail -1 | tr -d ' ') free" >&2
for np in $NPS; do
  echo "== np=$np, OMP_NUM_THREADS=$THREADS; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  args=(--root "$ROOT" --rounds "$ROUNDS" --disk "$DEV" --json "$OUT/np$np.json")
  # shellcheck disable=SC2206
  [ -n "${EXTRA_ARGS:-}" ] && args+=(${EXTRA_ARGS})
  if [ "$np" = 1 ]; then
    OMP_NUM_THREADS=$THREADS "$BIN" "${args[@]}" | tee "$OUT/np$np.txt"
  else
    mpirun --oversubscribe -np "$np" -x OMP_NUM_THREADS="$THREADS" -x OMP_WAIT_POLICY "$BIN" "${args[@]}" |
      tee "$OUT/np$np.txt"
  fi
  echo "== np=$np done; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
rm -rf "$ROOT"
grep -h '^RESULT' "$OUT"/np*.txt
