#!/usr/bin/env bash
# Data-parallel equivalence (issue: MPI data parallel, deliverables 4 and 6): the same 20-step
# run with 1, 2 and 3 ranks gives the same per-step losses and final weights, and a run
# checkpointed by 2 ranks at step 10 and resumed by 3 ranks continues identically.
# Usage: dp_equivalence.sh MPIEXEC zaya_dp_check WORKDIR [BACKEND]
# BACKEND (default cpu): cuda-fp32 runs the same check on the GPU (every rank on the node's GPUs,
# sharing them when there are fewer; fp32 GEMMs, so the CPU tolerances apply); without a GPU it
# prints "dp_equivalence: skipped: no GPU".
set -euo pipefail
mpiexec="$1"; check="$2"; work="$3"; backend="${4:-cpu}"
rm -rf "$work"; mkdir -p "$work"
export OMP_NUM_THREADS=1
mpi() { local n="$1"; shift; "$mpiexec" --oversubscribe -np "$n" "$@"; }

first=$("$check" train "$work/np1" --backend "$backend")
echo "$first"
if [[ "$first" == *"skipped: no GPU"* ]]; then echo "dp_equivalence: skipped: no GPU"; exit 0; fi
mpi 2 "$check" train "$work/np2" --backend "$backend"
"$check" compare "$work/np1" "$work/np2"
mpi 3 "$check" train "$work/np3" --backend "$backend"
"$check" compare "$work/np1" "$work/np3"
# Reshape on load: 2 ranks to step 10, then 3 ranks to the end.
mkdir -p "$work/resume"
cp "$work/np1/train.bin" "$work/np1/val.bin" "$work/resume/"
mpi 2 "$check" train "$work/resume" --stop-after 10 --backend "$backend"
mpi 3 "$check" train "$work/resume" --backend "$backend"
"$check" compare "$work/np1" "$work/resume"
echo "dp_equivalence: OK"
