#!/usr/bin/env bash
# `zaya launch` end to end on real training jobs (the fault-tolerance supervisor, src/supervise/):
#   1. one process: the job is killed with kill -9, restarted, then stopped with SIGSTOP (a hang
#      only the heartbeat sees), killed and restarted again; the trained model is byte-identical
#      to an uninterrupted run's;
#   2. two ranks under mpirun, with the health check (`zaya doctor`) before every attempt: rank 1
#      is killed with kill -9, then stopped with SIGSTOP (rank 0's comm watchdog ends the job with
#      status 86); again the model equals an uninterrupted 2-rank run's;
#   3. a job that can never start is given up after 3 attempts, with exit status 1;
#   4. SIGTERM to the supervisor stops the job and is not followed by a restart.
# The faults land between checkpoints (checkpoint.every = 25; steps 60 and 85), and the timeouts
# leave room for a slow fsync on a busy machine: checkpoint timing is tested in test_supervisor.cpp.
# Usage: launch_test.sh ZAYA MPIEXEC WORKDIR
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/heartbeat_field.sh"  # field FILE NAME
zaya="$(realpath "$1")"; mpiexec="$2"; work="$(realpath -m "$3")"
rm -rf "$work"; mkdir -p "$work"
# The demo data's paths in the recipe are relative to the repository root.
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
note() { echo "launch_test: $*"; }
die() { echo "launch_test: FAILED: $*" >&2; exit 1; }
trap 'die "a command failed at line $LINENO (logs under $work)"' ERR

recipe=(--set model.preset=zaya-tiny --set data.seq_len=64 --set batch.micro_batch=2 --set batch.global_batch=4
        --set schedule.total_steps=150 --set schedule.warmup_steps=2 --set checkpoint.every=25 --set eval.every=0
        --set eval.sample_tokens=0 --set logging.every=100)


# wait_for RUN RANK STEP OLD_PID: until RANK's heartbeat comes from a process other than OLD_PID
# and reports step >= STEP; prints that process's pid.
wait_for() {
  local hb="$1/heartbeat/rank-0000$2.json" step="$3" old="$4" pid s
  for _ in $(seq 1 3000); do
    pid=$(field "$hb" pid); s=$(field "$hb" step)
    if [[ -n "$pid" && "$pid" != "$old" && -n "$s" && "$s" -ge "$step" ]]; then echo "$pid"; return 0; fi
    sleep 0.02
  done
  die "rank $2 of $1 never reached step $step"
}

# stop_in_step RUN STEP OLD_PID: stops rank 0 of RUN with SIGSTOP once its heartbeat (from a
# process other than OLD_PID) reports step >= STEP, and prints its pid. A stop right after a
# "checkpoint" beat (a background save's commit) would be allowed --checkpoint-timeout rather
# than the --heartbeat-timeout under test, so the job is then resumed and stopped at a later step.
stop_in_step() {
  local run="$1" step="$2" old="$3" hb="$1/heartbeat/rank-00000.json" pid
  for _ in $(seq 1 50); do
    pid=$(wait_for "$run" 0 "$step" "$old") || exit 1  # (no set -e inside $(...))
    kill -STOP "$pid"
    local state=""
    until [[ "$state" == [Tt] ]]; do
      state=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null || true)
      [[ -n "$state" && "$state" != Z ]] || die "rank 0 of $run (pid $pid) ended before it stopped"
      sleep 0.01
    done
    if [[ "$(field "$hb" phase)" != checkpoint ]]; then echo "$pid"; return 0; fi
    echo "launch_test: rank 0 stopped in a checkpoint commit at step $(field "$hb" step); resumed" >&2
    kill -CONT "$pid"
    step=$(($(field "$hb" step) + 1))
  done
  die "rank 0 of $run was stopped in a checkpoint commit 50 times"
}

same_model() {
  cmp -s "$1/model/model.safetensors" "$2/model/model.safetensors" ||
    die "$2's model differs from the uninterrupted run's ($1)"
}

events() { grep -c "\"event\":\"$2\"" "$1/supervisor.jsonl" || true; }

# ---- 1. one process: a crash, then a hang ----
"$zaya" train "${recipe[@]}" --set run_dir="$work/ref1" > "$work/ref1.log" 2>&1
"$zaya" launch "${recipe[@]}" --set run_dir="$work/ft1" --heartbeat-timeout 10 --checkpoint-timeout 300 \
  --restart-delay 0.2 --kill-grace 2 > "$work/ft1.log" 2>&1 &
launcher=$!
pid=$(wait_for "$work/ft1" 0 60 none); kill -9 "$pid"; note "killed the job (pid $pid) with kill -9"
pid=$(stop_in_step "$work/ft1" 85 "$pid"); note "stopped the job (pid $pid) with SIGSTOP"
wait "$launcher" || { rc=$?; cat "$work/ft1.log"; die "zaya launch exited $rc (one process)"; }
[[ $(events "$work/ft1" failure) -eq 1 && $(events "$work/ft1" hang) -eq 1 && $(events "$work/ft1" finished) -eq 1 ]] ||
  { cat "$work/ft1/supervisor.jsonl"; die "expected one failure, one hang and a finish"; }
grep -q 'killed by signal 9' "$work/ft1/supervisor.jsonl" || die "the crash was not reported as signal 9"
grep -q 'has not beaten for' "$work/ft1/supervisor.jsonl" || die "the hang was not reported"
same_model "$work/ref1" "$work/ft1"
note "one process: recovered from a crash and a hang; the model equals the uninterrupted run's"

# ---- 2. two ranks: a rank crash, then a stopped rank (comm watchdog) ----
mpi=("$mpiexec" --oversubscribe -np 2)
"${mpi[@]}" "$zaya" train "${recipe[@]}" --set run_dir="$work/ref2" > "$work/ref2.log" 2>&1
"$zaya" launch "${recipe[@]}" --set run_dir="$work/ft2" --np 2 --mpirun="$mpiexec" --mpirun-arg=--oversubscribe \
  --comm-timeout 30 --heartbeat-timeout 90 --restart-delay 0.2 --kill-grace 2 --preflight --preflight-burn-in 0.2 \
  > "$work/ft2.log" 2>&1 &
launcher=$!
pid=$(wait_for "$work/ft2" 1 60 none); kill -9 "$pid"; note "killed rank 1 (pid $pid) with kill -9"
pid=$(wait_for "$work/ft2" 1 85 "$pid"); kill -STOP "$pid"; note "stopped rank 1 (pid $pid) with SIGSTOP"
wait "$launcher" || { rc=$?; cat "$work/ft2.log"; die "zaya launch exited $rc (two ranks)"; }
[[ $(events "$work/ft2" failure) -eq 2 && $(events "$work/ft2" hang) -eq 0 && $(events "$work/ft2" finished) -eq 1 ]] ||
  { cat "$work/ft2/supervisor.jsonl"; die "expected two failures and a finish"; }
[[ $(events "$work/ft2" preflight) -eq 3 && $(grep -c 'zaya doctor: all ranks healthy' "$work/ft2.log") -eq 3 ]] ||
  die "expected a passed health check before each of the 3 attempts"
grep -q 'killed by signal 9' "$work/ft2/supervisor.jsonl" || die "the rank crash was not reported as signal 9"
grep -q 'status 86: a collective timed out' "$work/ft2/supervisor.jsonl" || die "the stopped rank was not reported as a watchdog timeout"
kill -0 "$pid" 2>/dev/null && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] &&
  die "the stopped rank (pid $pid) outlived its job"
same_model "$work/ref2" "$work/ft2"
note "two ranks: health-checked, recovered from a rank crash and a stopped rank; the model equals the uninterrupted run's"

# ---- 3. a job that cannot start: no endless restarts ----
status=0
"$zaya" launch "${recipe[@]}" --set run_dir="$work/bad" --set data.train="$work/missing.bin" --restart-delay 0 \
  > "$work/bad.log" 2>&1 || status=$?
[[ $status -eq 1 ]] || { cat "$work/bad.log"; die "a job that cannot start: zaya launch exited $status, not 1"; }
[[ $(events "$work/bad" start) -eq 3 && $(events "$work/bad" gave_up) -eq 1 ]] || die "expected 3 attempts, then giving up"
grep -q 'giving up: 3 attempts in a row failed without committing a new checkpoint' "$work/bad.log" ||
  die "the give-up message is missing"
note "a job that cannot start: given up after 3 attempts"

# ---- 4. SIGTERM to the supervisor ----
"$zaya" launch "${recipe[@]}" --set run_dir="$work/term" > "$work/term.log" 2>&1 &
launcher=$!
pid=$(wait_for "$work/term" 0 50 none)
kill -TERM "$launcher"
status=0; wait "$launcher" || status=$?
[[ $status -eq 143 ]] || { cat "$work/term.log"; die "SIGTERM: zaya launch exited $status, not 143"; }
[[ $(events "$work/term" stopped) -eq 1 && $(events "$work/term" restart) -eq 0 ]] || die "SIGTERM: expected a stop and no restart"
kill -0 "$pid" 2>/dev/null && [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]] &&
  die "SIGTERM: the job (pid $pid) outlived its supervisor"
note "SIGTERM: the job was stopped and not restarted"
echo "launch_test: OK"
