#!/usr/bin/env bash
# Data-parallel scaling of the real trainer: `zaya train` on the default recipe's model for STEPS
# steps (--stop-after), in three configurations with the same global batch:
#   np1-omp1  one process,  OMP_NUM_THREADS=1   (one core)
#   np2-omp1  mpirun -np 2, OMP_NUM_THREADS=1 per rank (both cores)
#   np1-omp2  one process,  OMP_NUM_THREADS=2   (both cores, for context)
# Throughput = median of the per-step tok_per_s in the run's metrics.jsonl (global tokens per
# second of wall time), skipping the first SKIP steps. Scaling efficiency =
# tok/s(np2-omp1) / (2 x tok/s(np1-omp1)). The configurations alternate ROUNDS times so they
# see the same machine load; each run uses a fresh run directory (no resume), with periodic
# checkpoints, eval and the sample off (a final "stopped" checkpoint is still written after
# the last step; it is not in the timed steps).
#
# Usage: bench/run_dp_bench.sh [OUT_DIR]          (default /tmp/zaya_dp_bench)
# Environment: ZAYA (default build/bin/zaya), STEPS (default 12), SKIP (default 2), ROUNDS
#   (default 2), GLOBAL_BATCH (default 16), MICRO_BATCH (default 8), PRESET (model preset;
#   default: the recipe's, zaya-small), EXTRA_SET (more "--set k=v" arguments).
# mpirun runs with --oversubscribe; as root it needs OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1, set here.
set -euo pipefail
cd "$(dirname "$0")/.."
ZAYA=${ZAYA:-build/bin/zaya}
OUT=${1:-/tmp/zaya_dp_bench}
STEPS=${STEPS:-12}
SKIP=${SKIP:-2}
ROUNDS=${ROUNDS:-2}
GLOBAL_BATCH=${GLOBAL_BATCH:-16}
MICRO_BATCH=${MICRO_BATCH:-8}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
[ -x "$ZAYA" ] || { echo "no $ZAYA: build it first (cmake --build build --target zaya)" >&2; exit 1; }
[ -f data/sotu/train.bin ] || { echo "no data/sotu: run scripts/setup.sh and zaya data demo first" >&2; exit 1; }
rm -rf "$OUT"
mkdir -p "$OUT"

sets=(--set checkpoint.every=0 --set eval.every=0 --set eval.sample_tokens=0 --set logging.plot=false
      --set logging.every=1 --set batch.global_batch="$GLOBAL_BATCH" --set batch.micro_batch="$MICRO_BATCH"
      --set schedule.total_steps=1000)
[ -n "${PRESET:-}" ] && sets+=(--set model.preset="$PRESET")
# shellcheck disable=SC2206
[ -n "${EXTRA_SET:-}" ] && sets+=(${EXTRA_SET})

run() {  # name np omp round
  local name=$1 np=$2 omp=$3 round=$4 dir="$OUT/$1.r$4"
  echo "== round $round: $name (np=$np, OMP_NUM_THREADS=$omp); load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  local cmd=("$ZAYA" train --stop-after "$STEPS" --set run_dir="$dir" "${sets[@]}")
  if [ "$np" = 1 ]; then
    OMP_NUM_THREADS=$omp "${cmd[@]}" >"$OUT/$name.r$round.log" 2>&1
  else
    mpirun --oversubscribe -np "$np" -x OMP_NUM_THREADS="$omp" -x OMP_WAIT_POLICY "${cmd[@]}" \
      >"$OUT/$name.r$round.log" 2>&1
  fi
  rm -rf "$dir/checkpoints"  # the final "stopped" checkpoint: not needed
}

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; $ZAYA; global batch $GLOBAL_BATCH, micro $MICRO_BATCH; $STEPS steps, first $SKIP skipped" >&2
for r in $(seq 1 "$ROUNDS"); do
  if [ $((r % 2)) = 1 ]; then order="np1-omp1 np2-omp1 np1-omp2"; else order="np1-omp2 np2-omp1 np1-omp1"; fi
  for name in $order; do
    case $name in
      np1-omp1) run "$name" 1 1 "$r" ;;
      np2-omp1) run "$name" 2 1 "$r" ;;
      np1-omp2) run "$name" 1 2 "$r" ;;
    esac
  done
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "$OUT" "$ROUNDS" "$SKIP" <<'PY'
import json, statistics, sys
out, rounds, skip = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
res = {}
for name in ["np1-omp1", "np2-omp1", "np1-omp2"]:
    all_steps, per_round = [], []
    for r in range(1, rounds + 1):
        recs = [json.loads(l) for l in open(f"{out}/{name}.r{r}/metrics.jsonl") if l.strip()]
        recs = [x for x in recs if "tok_per_s" in x]
        tps = [x["tok_per_s"] for x in recs[skip:]]
        all_steps += tps
        per_round.append(statistics.median(tps))
    res[name] = {"median_tok_per_s": statistics.median(all_steps), "per_round": per_round, "steps": len(all_steps)}
    print(f"{name}: median {res[name]['median_tok_per_s']:.0f} tok/s over {len(all_steps)} steps "
          f"(per round: {', '.join(f'{v:.0f}' for v in per_round)})")
t1, t2, t12 = (res[n]["median_tok_per_s"] for n in ["np1-omp1", "np2-omp1", "np1-omp2"])
eff = t2 / (2 * t1)
res["efficiency_np2"] = eff
res["np2_over_np1_omp2"] = t2 / t12
print(f"scaling efficiency np=2 vs np=1 (1 thread per rank): {t2:.0f} / (2 x {t1:.0f}) = {100 * eff:.1f}%")
print(f"np=2 (1 thread each) vs np=1 with 2 threads: {t2 / t12:.2f}x")
json.dump(res, open(f"{out}/summary.json", "w"), indent=2)
PY
