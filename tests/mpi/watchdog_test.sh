#!/usr/bin/env bash
# The communication watchdog end to end: `mpirun -np 3 comm_check --watchdog-test`, where rank 1
# stops itself (SIGSTOP) before an all_reduce. Passes when the run ends within 30 s of rank 1
# stopping, with a non-zero status, and rank 0 printed its watchdog line naming peer 1; afterwards
# no process of this run may be left (stopped or not): leftovers are continued and killed.
# The 30 s count from rank 1's stop, not from mpirun's start: under ASan on a loaded 2-core CI
# machine, starting 3 ranks alone has taken 41 s. Reaching the stop has a 150 s limit of its own.
# usage: watchdog_test.sh MPIEXEC COMM_CHECK
set -u
mpiexec=${1:?usage: watchdog_test.sh MPIEXEC COMM_CHECK}
check=${2:?usage: watchdog_test.sh MPIEXEC COMM_CHECK}

# Run the program under a unique path so that leftovers are found by name, and only ours.
dir=$(mktemp -d "${TMPDIR:-/tmp}/zaya_watchdog.XXXXXX")
prog="$dir/comm_check_wd$$"
ln -s "$(readlink -f "$check")" "$prog"
unset ZAYA_COMM_TIMEOUT
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

status=0
fail() { echo "watchdog_test: FAILED: $*"; status=1; }

stop_line="comm_check: rank 1 (pid"
start=$SECONDS
"$mpiexec" --oversubscribe -np 3 "$prog" --watchdog-test >"$dir/stdout" 2>"$dir/stderr" &
mpirun_pid=$!
# Phase 1: until rank 1 says it stops (or the run ends first); phase 2: 30 s for the run to end.
reached_stop=no
while kill -0 "$mpirun_pid" 2>/dev/null && [ $((SECONDS - start)) -lt 150 ]; do
  if grep -qF "$stop_line" "$dir/stderr"; then reached_stop=yes; break; fi
  sleep 0.2
done
stopped_at=$SECONDS
ended=no
while [ $((SECONDS - stopped_at)) -lt 30 ]; do
  if ! kill -0 "$mpirun_pid" 2>/dev/null; then ended=yes; break; fi
  sleep 0.2
done
if [ "$ended" = no ]; then
  kill -TERM "$mpirun_pid" 2>/dev/null
  sleep 5
  kill -KILL "$mpirun_pid" 2>/dev/null
fi
wait "$mpirun_pid"
rc=$?
elapsed=$((SECONDS - start))
after_stop=$((SECONDS - stopped_at))
grep -qF "$stop_line" "$dir/stderr" && reached_stop=yes

# Leftovers: give mpirun a moment to reap its ranks, then continue and kill whatever remains.
for _ in 1 2 3 4 5 6 7 8 9 10; do
  pgrep -f "$prog" >/dev/null || break
  sleep 0.5
done
if pgrep -f "$prog" >/dev/null; then
  echo "watchdog_test: warning: processes left behind by mpirun, killing them:"
  ps -o pid,stat,args -p "$(pgrep -d, -f "$prog")" || true
  pkill -CONT -f "$prog"
  pkill -KILL -f "$prog"
  sleep 1
  pgrep -f "$prog" >/dev/null && fail "processes of this run survive kill -9: $(pgrep -d' ' -f "$prog")"
fi

line="zaya: comm watchdog: all_reduce #3 (4096 bytes, f32 sum) on rank 0 of 3 timed out after 3.0 s; peers not heard from: 1"
if [ "$reached_stop" = no ]; then fail "rank 1 never reached its stop (150 s limit, or the run ended first)"; fi
if [ "$ended" = no ]; then fail "the run did not end within 30 s of rank 1 stopping"; fi
if [ "$ended" = yes ] && [ "$rc" -eq 0 ]; then fail "the run exited 0"; fi
grep -qxF "$line" "$dir/stderr" || fail "rank 0's watchdog line is missing; expected: $line"
if grep -q "got past the all_reduce" "$dir/stderr"; then fail "a rank got past the all_reduce rank 1 never joined"; fi

echo "watchdog_test: mpirun exited $rc after ${elapsed} s, ${after_stop} s after rank 1 stopped (86 is the watchdog's exit status)"
grep "comm watchdog" "$dir/stderr"
if [ "$status" -ne 0 ]; then
  echo "--- stderr of the run:"
  cat "$dir/stderr"
  echo "--- stdout of the run:"
  cat "$dir/stdout"
fi
rm -rf "$dir"
[ "$status" -eq 0 ] && echo "watchdog_test: OK"
exit "$status"
