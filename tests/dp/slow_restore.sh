#!/usr/bin/env bash
# A resume on slow storage: 2 ranks train to step 5 of 10 and checkpoint; 2 ranks resume with
# every rank-local checkpoint read and write of the last rank held 8 s
# (ZAYA_CKPT_TEST_DISK_DELAY_MS) under a 5 s comm watchdog (ZAYA_COMM_TIMEOUT). Loading,
# restoring the training state and saving meet in short rounds meanwhile, so the watchdog never
# fires (it would end the run with status 86), and the run ends where one process does.
# Usage: slow_restore.sh MPIEXEC zaya_dp_check WORKDIR
set -euo pipefail
mpiexec="$1"; check="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
export OMP_NUM_THREADS=1
mpi() { local n="$1"; shift; "$mpiexec" --oversubscribe -np "$n" "$@"; }

"$check" train "$work/np1" --steps 10
mkdir -p "$work/resume"
cp "$work/np1/train.bin" "$work/np1/val.bin" "$work/resume/"
mpi 2 "$check" train "$work/resume" --steps 10 --stop-after 5
start=$(date +%s)
ZAYA_COMM_TIMEOUT=5 ZAYA_CKPT_TEST_DISK_DELAY_MS=8000 mpi 2 "$check" train "$work/resume" --steps 10
echo "slow resume took $(( $(date +%s) - start )) s"
"$check" compare "$work/np1" "$work/resume" --steps 10
echo "slow_restore: OK"
