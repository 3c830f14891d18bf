#!/usr/bin/env bash
# Data-parallel equivalence (issue: MPI data parallel, deliverables 4 and 6): the same 20-step
# run with 1, 2 and 3 ranks gives the same per-step losses and final weights, and a run
# checkpointed by 2 ranks at step 10 and resumed by 3 ranks continues identically (DP_STEPS=N: N
# steps, resumed at N/2). Every run also scores multiple-choice questions at each evaluation, split
# over the ranks; the accuracy they measure together must equal one process scoring the final model.
# Usage: [DP_STEPS=N] [DP_TRAIN_FLAGS=--device-comm] dp_equivalence.sh MPIEXEC zaya_dp_check WORKDIR [BACKEND]
# BACKEND (default cpu): cuda-fp32 runs the same check on the GPU (every rank on the node's GPUs,
# sharing them when there are fewer; fp32 GEMMs, so the CPU tolerances apply); without a GPU it
# prints "dp_equivalence: skipped: no GPU".
set -euo pipefail
mpiexec="$1"; check="$2"; work="$3"; backend="${4:-cpu}"
# DP_STEPS: steps per run (default 20; the resume stops at half). DP_TRAIN_FLAGS: more options for
# every training run (--device-comm: gradients and weights over the device communicator).
steps="${DP_STEPS:-20}"; half=$((steps / 2))
read -r -a flags <<< "${DP_TRAIN_FLAGS:-}"
rm -rf "$work"; mkdir -p "$work"
export OMP_NUM_THREADS=1
mpi() { local n="$1"; shift; "$mpiexec" --oversubscribe -np "$n" "$@"; }
args=(--steps "$steps" --backend "$backend" --choices ${flags[@]+"${flags[@]}"})
compare() { "$check" compare "$1" "$2" --steps "$steps"; }

first=$("$check" train "$work/np1" "${args[@]}")
echo "$first"
if [[ "$first" == *"skipped: no GPU"* ]]; then echo "dp_equivalence: skipped: no GPU"; exit 0; fi
mpi 2 "$check" train "$work/np2" "${args[@]}"
compare "$work/np1" "$work/np2"
mpi 3 "$check" train "$work/np3" "${args[@]}"
compare "$work/np1" "$work/np3"
# Reshape on load: 2 ranks to half way, then 3 ranks to the end.
mkdir -p "$work/resume"
cp "$work/np1/train.bin" "$work/np1/val.bin" "$work/resume/"
mpi 2 "$check" train "$work/resume" --stop-after "$half" "${args[@]}"
mpi 3 "$check" train "$work/resume" "${args[@]}"
compare "$work/np1" "$work/resume"
echo "dp_equivalence: OK"
