#!/usr/bin/env bash
# Context parallelism against plain data parallelism at the same global batch: 2 ranks train
# zaya-small on the demo data with sequences of SEQ tokens (default 4096 and 8192), once as 2
# data-parallel ranks (one sequence each per step) and once as one context group of 2 (every
# sequence split over both ranks). Prints the median tokens/s over the steps after the first and
# each rank's peak resident memory. Needs a built tree (make build) and the demo data.
# Usage: scripts/bench_context_parallel.sh [SEQ ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
seqs=("$@"); [[ ${#seqs[@]} -gt 0 ]] || seqs=(4096 8192)
steps=5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2)}'; }
printf '%-6s %-22s %10s %22s\n' seq layout "tok/s" "peak RSS per rank (MB)"
for seq in "${seqs[@]}"; do
  for cp in 1 2; do
    log="$work/log-$seq-$cp"
    mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 sh -c "/usr/bin/time -f 'maxrss %M' build/bin/zaya train \
      --set run_dir=$work/run-$seq-$cp --set parallel.context_parallel=$cp --set data.seq_len=$seq \
      --set batch.micro_batch=1 --set batch.global_batch=2 --set schedule.total_steps=$steps \
      --set schedule.warmup_steps=1 --set eval.every=0 --set eval.sample_tokens=0 --set checkpoint.every=0 \
      --set logging.every=1 --set logging.plot=false" > "$log" 2>&1
    toks=$(grep -o '| [0-9]* tok/s' "$log" | tail -n +2 | awk '{print $2}' | median)
    rss=$(grep -o 'maxrss [0-9]*' "$log" | awk '{printf "%d ", $2 / 1024}')
    layout=$([[ $cp == 1 ]] && echo "data parallel x2" || echo "context parallel x2")
    printf '%-6s %-22s %10s %22s\n' "$seq" "$layout" "$toks" "$rss"
  done
done
