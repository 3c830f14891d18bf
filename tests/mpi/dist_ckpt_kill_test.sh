#!/usr/bin/env bash
# kill -9 in the middle of a sharded checkpoint save must never damage the previous checkpoint,
# and the partial save must never appear as step-*. For 1 rank (no mpirun) and 2 ranks (mpirun):
#   1. dist_ckpt_check big-save commits step 1;
#   2. a save of step 2 runs with a slow writer (ZAYA_CKPT_TEST_WRITE_DELAY_MS); once every
#      rank's file exists in .tmp-step-00000002, each rank is killed with kill -9 (by pid);
#   3. step-00000002 must not exist (it is watched for during the whole save), the partial
#      .tmp-step-00000002 must, and step 1 must load, verify and hold its values
#      (dist_ckpt_check big-verify, and `zaya ckpt inspect` when the binary is given);
#   4. a new save (step 3) succeeds and removes the partial directory.
# usage: dist_ckpt_kill_test.sh MPIEXEC DIST_CKPT_CHECK [ZAYA]
set -u
mpiexec=${1:?usage: dist_ckpt_kill_test.sh MPIEXEC DIST_CKPT_CHECK [ZAYA]}
check=${2:?usage: dist_ckpt_kill_test.sh MPIEXEC DIST_CKPT_CHECK [ZAYA]}
zaya=${3:-}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
export ZAYA_COMM_TIMEOUT=${ZAYA_COMM_TIMEOUT:-60}
unset ZAYA_CKPT_TEST_WRITE_DELAY_MS

dir=$(mktemp -d "${TMPDIR:-/tmp}/zaya_ckpt_kill.XXXXXX")
mib=48
status=0
fail() { echo "dist_ckpt_kill_test: FAILED: $*"; status=1; }

launch() {  # launch NP ARGS...: one rank directly, more under mpirun
  local np=$1
  shift
  if [ "$np" -eq 1 ]; then "$check" "$@"; else "$mpiexec" --oversubscribe -np "$np" "$check" "$@"; fi
}

for np in 1 2; do
  root="$dir/np$np"
  piddir="$dir/pids$np"
  mkdir -p "$piddir"
  echo "dist_ckpt_kill_test: $np rank(s)"
  launch "$np" big-save "$root" 1 "$mib" >"$dir/save1.log" 2>&1 || { fail "np=$np: step 1 did not save"; cat "$dir/save1.log"; continue; }

  ZAYA_CKPT_TEST_WRITE_DELAY_MS=100 launch "$np" big-save "$root" 2 "$mib" "$piddir" >"$dir/save2.log" 2>&1 &
  bg=$!
  # Wait until every rank has its pid file and its rank file in the temporary directory.
  ready=0
  for _ in $(seq 1 600); do
    [ -e "$root/step-00000002" ] && fail "np=$np: step-00000002 appeared during the save"
    n_pids=$(ls "$piddir" 2>/dev/null | wc -l)
    n_files=$(ls "$root/.tmp-step-00000002" 2>/dev/null | grep -c '^rank-' || true)
    if [ "$n_pids" -eq "$np" ] && [ "$n_files" -eq "$np" ]; then ready=1; break; fi
    if ! kill -0 "$bg" 2>/dev/null; then break; fi
    sleep 0.05
  done
  [ "$ready" -eq 1 ] || fail "np=$np: the slow save never got going"
  sleep 0.3  # a few chunks into the writes (each takes 100 ms; the save needs seconds)
  [ -e "$root/step-00000002" ] && fail "np=$np: step-00000002 appeared before the kill"
  for f in "$piddir"/pid.*; do
    [ -e "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
  done
  wait "$bg" 2>/dev/null
  rc=$?
  [ "$rc" -eq 0 ] && fail "np=$np: the killed save exited 0 (it finished before the kill?)"
  grep -q "big-save committed" "$dir/save2.log" && fail "np=$np: the killed save committed"

  [ -e "$root/step-00000002" ] && fail "np=$np: the killed save appears as step-00000002"
  [ -d "$root/.tmp-step-00000002" ] || fail "np=$np: no partial .tmp-step-00000002 (was it killed mid-save?)"
  "$check" big-verify "$root" 1 "$mib" || fail "np=$np: step 1 does not verify after the kill"
  if [ -n "$zaya" ]; then
    "$zaya" ckpt inspect --no-tensors "$root/step-00000001" >"$dir/inspect.log" 2>&1 ||
      { fail "np=$np: zaya ckpt inspect step-00000001 failed"; cat "$dir/inspect.log"; }
    "$zaya" ckpt inspect --no-tensors "$root" >"$dir/inspect.log" 2>&1 ||
      { fail "np=$np: zaya ckpt inspect of the root failed"; cat "$dir/inspect.log"; }
  fi

  launch "$np" big-save "$root" 3 "$mib" >"$dir/save3.log" 2>&1 || { fail "np=$np: step 3 did not save after the kill"; cat "$dir/save3.log"; }
  [ -e "$root/.tmp-step-00000002" ] && fail "np=$np: the next save left the partial directory behind"
  "$check" big-verify "$root" 3 "$mib" || fail "np=$np: step 3 does not verify"
  rm -rf "$root"
done

rm -rf "$dir"
[ "$status" -eq 0 ] && echo "dist_ckpt_kill_test: OK"
exit "$status"
