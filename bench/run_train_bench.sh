#!/usr/bin/env bash
# Training-step benchmark, one command: builds zaya (Release, its own build dir), writes the
# zaya-60m random model once, runs bench_train (C++) and bench_train_twin.py (PyTorch twin) on
# the same weights, batch (B=8 x T=256, one micro-batch) and optimizer routing, alternating
# them ROUNDS times so both see the same machine load, and prints zaya tok/s, twin tok/s, the
# ratio (median of the per-round ratios) and zaya's MFU, against the targets
# (>= 4x the twin's training tokens/s, >= 60% MFU).
#
# Usage: bench/run_train_bench.sh [OUT_DIR]
# Environment: BUILD_DIR (default build-trainbench), JOBS (default 1), THREADS (default: all
#   cores; OpenMP threads for zaya, torch.set_num_threads for the twin), PYTHON (default
#   /usr/bin/python3), ROUNDS (default 3), STEPS (timed steps per run, default 7), PROFILE=0 to
#   skip zaya's per-op breakdown (run once, after the rounds), EXTRA_ARGS for bench_train.
# OMP_WAIT_POLICY defaults to PASSIVE (as the zaya CLI sets it), for both engines.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build-trainbench}
OUT=${1:-$ROOT/$BUILD_DIR/train-bench}
JOBS=${JOBS:-1}
THREADS=${THREADS:-$(nproc)}
PYTHON=${PYTHON:-/usr/bin/python3}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-7}
PROFILE=${PROFILE:-1}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
mkdir -p "$OUT"

echo "== build ($BUILD_DIR, Release, -j$JOBS)" >&2
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS" --target bench_train zaya >&2

MODEL=$OUT/zaya-60m
if [ ! -f "$MODEL/model.safetensors" ]; then
  echo "== writing $MODEL (zaya init --preset zaya-60m --seed 1234)" >&2
  "$BUILD_DIR/bin/zaya" init --preset zaya-60m --out "$MODEL" --seed 1234 >&2
fi

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; OMP_WAIT_POLICY=$OMP_WAIT_POLICY; load: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$ROUNDS"); do
  check=()
  [ "$r" = 1 ] && check=(--check)   # fixture check of the twin's training path: first round only
  echo "== round $r/$ROUNDS: bench_train (OMP_NUM_THREADS=$THREADS); load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  OMP_NUM_THREADS=$THREADS "$BUILD_DIR/bin/bench_train" --model "$MODEL" --steps "$STEPS" ${EXTRA_ARGS:-} \
    >"$OUT/zaya.$r.json"
  echo "== round $r/$ROUNDS: bench_train_twin.py (torch threads $THREADS); load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  OMP_NUM_THREADS=$THREADS "$PYTHON" bench/bench_train_twin.py --model "$MODEL" --threads "$THREADS" \
    --steps "$STEPS" "${check[@]}" >"$OUT/twin.$r.json"
done
if [ "$PROFILE" = 1 ]; then
  echo "== profile: bench_train --profile --skip-peaks; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  OMP_NUM_THREADS=$THREADS "$BUILD_DIR/bin/bench_train" --model "$MODEL" --steps 5 --profile --skip-peaks \
    >"$OUT/zaya.profile.json"
fi
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

"$PYTHON" - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
Z = [json.load(open(f"{out}/zaya.{r}.json")) for r in range(1, rounds + 1)]
TW = [json.load(open(f"{out}/twin.{r}.json")) for r in range(1, rounds + 1)]
med = statistics.median
zt = [z["tokens_per_s"]["median"] for z in Z]
tt = [t["tokens_per_s"]["median"] for t in TW]
ratios = [a / b for a, b in zip(zt, tt)]
mfu = [z["mfu"] for z in Z]
ratio, m = med(ratios), med(mfu)
s = {"rounds": rounds, "zaya_tok_s": med(zt), "twin_tok_s": med(tt), "ratio": ratio, "ratio_per_round": ratios,
     "zaya_tok_s_per_round": zt, "twin_tok_s_per_round": tt, "mfu": m, "mfu_per_round": mfu,
     "sgemm_peak_gflops": med([z["sgemm_peak_gflops"] for z in Z]),
     "sgemm_peak_source": Z[0]["sgemm_peak_source"],
     "zaya_fwd_bwd_s": med([z["fwd_bwd_seconds"]["median"] for z in Z]),
     "zaya_optimizer_s": med([z["optimizer_seconds"]["median"] for z in Z]),
     "twin_fwd_bwd_s": med([t["fwd_bwd_seconds"]["median"] for t in TW]),
     "twin_optimizer_s": med([t["optimizer_seconds"]["median"] for t in TW]),
     "training_flops_per_token": Z[0]["training_flops_per_token"],
     "targets": {"ratio": 4.0, "mfu": 0.6}, "ratio_met": ratio >= 4.0, "mfu_met": m >= 0.6}
print(f"zaya  {s['zaya_tok_s']:.0f} tok/s (per round {', '.join(f'{x:.0f}' for x in zt)}); step split: "
      f"fwd+bwd {1e3 * s['zaya_fwd_bwd_s']:.0f} ms, optimizer {1e3 * s['zaya_optimizer_s']:.0f} ms")
print(f"twin  {s['twin_tok_s']:.0f} tok/s (per round {', '.join(f'{x:.0f}' for x in tt)}); step split: "
      f"fwd+bwd {1e3 * s['twin_fwd_bwd_s']:.0f} ms, optimizer {1e3 * s['twin_optimizer_s']:.0f} ms")
print(f"ratio {ratio:.2f}x (median of per-round ratios {', '.join(f'{x:.2f}' for x in ratios)}; "
      f"target >= 4x: {'MET' if s['ratio_met'] else 'NOT MET'})")
print(f"MFU   {100 * m:.1f}% ({s['training_flops_per_token'] / 1e9:.3f} GFLOP/token x tok/s / sgemm peak "
      f"{s['sgemm_peak_gflops']:.0f} GFLOP/s from {s['sgemm_peak_source']}; target >= 60%: "
      f"{'MET' if s['mfu_met'] else 'NOT MET'})")
json.dump(s, open(f"{out}/summary.json", "w"), indent=2)
print(f"JSON: {out}/zaya.N.json, {out}/twin.N.json, {out}/zaya.profile.json, {out}/summary.json")
PY
