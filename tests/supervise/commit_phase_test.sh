#!/usr/bin/env bash
# The heartbeat's "checkpoint" phase covers a background save's commit: `zaya train` with a slow
# commit (ZAYA_CKPT_TEST_DISK_DELAY_MS holds rank 0's commit for 1.5 s) beats "checkpoint" at the
# step whose poll commits the save of step 30, a step that saves nothing itself, so that the
# supervisor allows the commit --checkpoint-timeout rather than --heartbeat-timeout. (The steps
# while the save is still being written beat "step" only: docs/fault-tolerance.md.) The 29 steps
# between the saves give the background write time to finish on a busy disk: with 9, a run beside
# the other tests once found it still writing at the next save, which then committed it.
# Usage: commit_phase_test.sh ZAYA WORKDIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/heartbeat_field.sh"  # field FILE NAME
zaya="$(realpath "$1")"; work="$(realpath -m "$2")"
rm -rf "$work"; mkdir -p "$work/hb"
cd "$(dirname "$0")/../.."  # the demo data's paths in the recipe are relative to the repository root
export OMP_NUM_THREADS=1
die() { echo "commit_phase_test: FAILED: $*" >&2; exit 1; }
hb="$work/hb/rank-00000.json"

ZAYA_HEARTBEAT_DIR="$work/hb" ZAYA_CKPT_TEST_DISK_DELAY_MS=1500 "$zaya" train \
  --set model.preset=zaya-tiny --set data.seq_len=64 --set batch.micro_batch=2 --set batch.global_batch=4 \
  --set schedule.total_steps=60 --set schedule.warmup_steps=2 --set checkpoint.every=30 --set eval.every=0 \
  --set eval.sample_tokens=0 --set logging.every=100 --set logging.plot=false --set run_dir="$work/run" \
  > "$work/train.log" 2>&1 &
job=$!
# Every (phase, step) the heartbeat shows, sampled every 20 ms until training returns.
seen=()
while kill -0 "$job" 2>/dev/null; do
  p=$(field "$hb" phase); s=$(field "$hb" step)
  if [[ -n "$p" && ( ${#seen[@]} -eq 0 || "${seen[-1]}" != "$p:$s" ) ]]; then seen+=("$p:$s"); fi
  sleep 0.02
done
wait "$job" || { cat "$work/train.log"; die "zaya train failed"; }
echo "commit_phase_test: phases seen: ${seen[*]}"
commit_step=""
for e in "${seen[@]}"; do
  s=${e#*:}
  if [[ ${e%%:*} == checkpoint && $s -gt 30 && $s -lt 60 ]]; then commit_step=$s; fi
done
[[ -n "$commit_step" ]] || die "no \"checkpoint\" beat between the saves of steps 30 and 60 (the commit of step 30's save)"
grep -q "checkpoint .*step-00000030 committed" "$work/train.log" || { cat "$work/train.log"; die "step 30's save was not committed during training"; }
echo "commit_phase_test: OK (step 30's save committed at step $commit_step under the checkpoint phase)"
