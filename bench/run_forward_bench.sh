#!/usr/bin/env bash
# Forward (inference) benchmark, one command: builds zaya (Release), writes the zaya-60m
# random model once, runs bench_forward (C++) and bench_twin.py (PyTorch twin) on the same
# weights and shapes, and prints the ratios against the targets:
#   prefill tok/s zaya / twin >= 4, decode >= 70% of the bandwidth bound, plus MFU.
#
# Usage: bench/run_forward_bench.sh [OUT_DIR]
# Environment: BUILD_DIR (default build-bench), JOBS (default 1), THREADS (default: all
#   cores; used for OpenMP in zaya and torch.set_num_threads in the twin), PYTHON
#   (default /usr/bin/python3), PROFILE=0 to skip the per-op breakdown, EXTRA_ARGS for
#   bench_forward, ROUNDS (default 3) alternations of zaya and the twin.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT=${1:-$ROOT/build-bench/forward-bench}
BUILD_DIR=${BUILD_DIR:-build-bench}
JOBS=${JOBS:-1}
THREADS=${THREADS:-$(nproc)}
PYTHON=${PYTHON:-/usr/bin/python3}
PROFILE=${PROFILE:-1}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"

echo "== build ($BUILD_DIR, Release, -j$JOBS)" >&2
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DZAYA_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS" --target bench_forward zaya >&2

MODEL=$OUT/zaya-60m
if [ ! -f "$MODEL/model.safetensors" ]; then
  echo "== writing $MODEL (zaya init --preset zaya-60m --seed 1234)" >&2
  "$BUILD_DIR/bin/zaya" init --preset zaya-60m --out "$MODEL" --seed 1234 >&2
fi

echo "== machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(uptime | sed 's/.*load average: //')" >&2
# ROUNDS > 1 alternates zaya and the twin so both see the same (shared-machine) load; the
# summary reports the median over rounds of each round's medians and of each round's ratio.
for r in $(seq 1 "$ROUNDS"); do
  prof=()
  [ "$PROFILE" = 1 ] && [ "$r" = 1 ] && prof=(--profile)
  check=(--no-plain)  # the fixture check and the plain-path timing: first round only
  [ "$r" = 1 ] && check=(--check)
  echo "== round $r/$ROUNDS: bench_forward (OMP_NUM_THREADS=$THREADS); load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  OMP_NUM_THREADS=$THREADS "$BUILD_DIR/bin/bench_forward" --model "$MODEL" "${prof[@]}" ${EXTRA_ARGS:-} >"$OUT/zaya.$r.json"
  echo "== round $r/$ROUNDS: bench_twin.py (torch threads $THREADS); load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  "$PYTHON" bench/bench_twin.py --model "$MODEL" --threads "$THREADS" "${check[@]}" >"$OUT/twin.$r.json"
done
echo "== load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

"$PYTHON" - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
Z = [json.load(open(f"{out}/zaya.{r}.json")) for r in range(1, rounds + 1)]
TW = [json.load(open(f"{out}/twin.{r}.json")) for r in range(1, rounds + 1)]
med = statistics.median


def merged(z, t):
    """One round's numbers: zaya prefill/decode medians and the twin's matching medians."""
    rows = {}
    for p in z["prefill"]:
        tw = {r["fast"]: r["tokens_per_s"]["median"] for r in t["prefill"] if r["B"] == p["B"] and r["T"] == p["T"]}
        rows[(p["B"], p["T"])] = dict(zaya=p["tokens_per_s"]["median"], gflops=p["gflops_per_s"], mfu=p.get("mfu"),
                                      fast=tw.get(True), plain=tw.get(False))
    return rows


R = [merged(z, t) for z, t in zip(Z, TW)]
z = {"sgemm_peak_gflops": med([x["sgemm_peak_gflops"] for x in Z]), "read_bw_gbs": med([x["read_bw_gbs"] for x in Z]),
     "threads": Z[0]["threads"], "prefill": [], "decode": None}
for key in R[0]:
    col = lambda k: [r[key][k] for r in R if r[key][k] is not None]
    z["prefill"].append({"B": key[0], "T": key[1], "tokens_per_s": {"median": med(col("zaya"))},
                         "gflops_per_s": med(col("gflops")), "mfu": med(col("mfu")),
                         "twin_fast": med(col("fast")), "twin_plain": med(col("plain")) if col("plain") else None,
                         "ratio_rounds": [r[key]["zaya"] / r[key]["fast"] for r in R]})
d = [x["decode"] for x in Z]
z["decode"] = {"tokens_per_s": {"median": med([x["tokens_per_s"]["median"] for x in d])},
               "bound_tokens_per_s": med([x["bound_tokens_per_s"] for x in d]),
               "fraction_of_bound": med([x["fraction_of_bound"] for x in d]),
               "fraction_of_bound_model_size_bw": med([x["fraction_of_bound_model_size_bw"] for x in d]),
               "bytes_per_token": d[0]["bytes_per_token"],
               "rounds": [(x["tokens_per_s"]["median"], x["bound_tokens_per_s"], x["fraction_of_bound"]) for x in d]}
summary = {"rounds": rounds, "sgemm_peak_gflops": z["sgemm_peak_gflops"], "read_bw_gbs": z["read_bw_gbs"],
           "prefill": [], "decode": {}}
print(f"sgemm peak {z['sgemm_peak_gflops']:.1f} GFLOP/s, read bandwidth {z['read_bw_gbs']:.2f} GB/s "
      f"({z['threads']} threads)")
for p in z["prefill"]:
    B, T = p["B"], p["T"]
    zt, fast, plain = p["tokens_per_s"]["median"], p["twin_fast"], p["twin_plain"]
    ratio = med(p["ratio_rounds"])
    row = {"B": B, "T": T, "zaya_tok_s": zt, "twin_fast_tok_s": fast, "ratio_vs_twin_fast": ratio,
           "ratio_per_round": p["ratio_rounds"], "zaya_gflops": p["gflops_per_s"], "mfu": p.get("mfu"),
           "target_ratio": 4.0, "met": ratio >= 4.0}
    line = (f"prefill B={B} T={T}: zaya {zt:.0f} tok/s, twin(fast) {fast:.0f} tok/s -> {ratio:.2f}x "
            f"(median of per-round ratios {', '.join(f'{x:.2f}' for x in p['ratio_rounds'])}; "
            f"target >= 4x: {'MET' if row['met'] else 'NOT MET'})")
    if plain:
        row["twin_plain_tok_s"] = plain
        row["ratio_vs_twin_plain"] = zt / plain
        line += f"; twin(plain, round 1 only) {plain:.0f} tok/s"
    line += f"; {p['gflops_per_s']:.1f} GFLOP/s, MFU {100 * p['mfu']:.1f}%"
    print(line)
    summary["prefill"].append(row)
d = z["decode"]
frac = d["fraction_of_bound"]
summary["decode"] = {"tok_s": d["tokens_per_s"]["median"], "bound_tok_s": d["bound_tokens_per_s"],
                     "fraction_of_bound": frac, "per_round_tok_s_bound_fraction": d["rounds"], "target": 0.7,
                     "met": frac >= 0.7}
print(f"decode B=1: {d['tokens_per_s']['median']:.1f} tok/s, bound {d['bound_tokens_per_s']:.1f} tok/s "
      f"({d['bytes_per_token'] / 1e6:.1f} MB/token) -> {100 * frac:.1f}% of bound "
      f"(median of per-round fractions "
      f"{', '.join(f'{100 * f:.0f}% [{t:.0f}/{b:.0f}]' for t, b, f in d['rounds'])}; "
      f"target >= 70%: {'MET' if frac >= 0.7 else 'NOT MET'})")
print(f"decode vs bandwidth measured over a weights-sized array (L3-resident on this VM): "
      f"{100 * z['decode']['fraction_of_bound_model_size_bw']:.1f}% of bound")
summary["decode"]["fraction_of_bound_model_size_bw"] = z["decode"]["fraction_of_bound_model_size_bw"]
json.dump(summary, open(f"{out}/summary.json", "w"), indent=2)
print(f"JSON: {out}/zaya.N.json, {out}/twin.N.json, {out}/summary.json")
EOF
