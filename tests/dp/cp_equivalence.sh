#!/usr/bin/env bash
# Context-parallel equivalence: the same 20-step run trained with its sequences split over a
# context group (2 ranks in one group; 4 ranks as 2 groups of 2, i.e. data parallel x context
# parallel; 4 ranks in one group) gives the per-step losses and final weights of one process (also
# with sequences of 256 tokens, whose chunks of 64 take a GPU's GEMM attention path), and
# a checkpoint saved by a context-parallel run resumes as plain data parallelism; a curriculum
# turns context parallelism on for its long phase only, also with document resets in its packed
# sequences, and with prompt/completion data.
# Usage: [DP_STEPS=N] [DP_TRAIN_FLAGS=--device-comm] cp_equivalence.sh MPIEXEC zaya_dp_check WORKDIR [BACKEND]
# BACKEND (default cpu): another (cuda-fp32, the GPU or its host emulation) runs only the first
# check, the one with 64-query chunks and the one with document resets, one process against one
# group of 2, with DP_TRAIN_FLAGS on the group.
set -euo pipefail
mpiexec="$1"; check="$2"; work="$3"; backend="${4:-cpu}"
steps="${DP_STEPS:-20}"; half=$((steps / 2))
read -r -a flags <<< "${DP_TRAIN_FLAGS:-}"
rm -rf "$work"; mkdir -p "$work"
export OMP_NUM_THREADS=1
mpi() { local n="$1"; shift; "$mpiexec" --oversubscribe -np "$n" "$@"; }
# Weights within 1e-4 (dp_check.cpp explains why context parallelism needs more than 3e-5).
compare() { "$check" compare "$1" "$2" --steps "$steps" --weight-tol 1e-4; }
# train_expect N ARGS...: runs ARGS and checks that rank 0 trained N steps context parallel.
train_expect() {
  local n="$1"; shift
  local out; out=$("$@"); echo "$out"
  if [[ "$out" != *"($n context parallel)"* ]]; then
    echo "cp_equivalence: expected $n context-parallel steps"; exit 1
  fi
}

first=$("$check" train "$work/np1" --steps "$steps" --backend "$backend")
echo "$first"
if [[ "$first" == *"skipped: no GPU"* ]]; then echo "cp_equivalence: skipped: no GPU"; exit 0; fi
train_expect "$steps" mpi 2 "$check" train "$work/cp2" --steps "$steps" --cp 2 --backend "$backend" \
  ${flags[@]+"${flags[@]}"}
compare "$work/np1" "$work/cp2"
# Chunks of 64 queries (sequences of 256 tokens over a group of 2): from 64 queries on, a GPU runs
# a chunk's attention at its offset on the GEMM path (or the tensor-core flash forward), not the
# warp kernels the chunks of 8 above take. Three steps of 2 sequences (the emulated GPU is slow;
# the schedule needs more than its 2 warm-up steps).
long_chunks() {
  "$check" train "$work/ln1" --steps 3 --seq-len 256 --batch 2 --backend "$backend"
  train_expect 3 mpi 2 "$check" train "$work/ln2" --steps 3 --seq-len 256 --batch 2 --cp 2 --backend "$backend" \
    ${flags[@]+"${flags[@]}"}
  "$check" compare "$work/ln1" "$work/ln2" --steps 3 --weight-tol 1e-4
}
long_chunks
# A curriculum with document resets (reset_at_document_boundary) whose long phase alone is
# context parallel: documents of 6 to 46 tokens packed into sequences of 16 and 32, so chunks of
# 8 begin, end and straddle documents.
# (12 steps, the last 8 context parallel; 6 and 2 on the slow emulated GPU.)
resets() {
  local n=12; [[ "$backend" == cpu ]] || n=6
  "$check" train "$work/rs1" --steps "$n" --phased --resets --backend "$backend"
  train_expect $((n - 4)) mpi 2 "$check" train "$work/rs2" --steps "$n" --phased --phase-cp 2 --resets \
    --backend "$backend" ${flags[@]+"${flags[@]}"}
  "$check" compare "$work/rs1" "$work/rs2" --steps "$n" --weight-tol 1e-4
}
# The same with the second dataset prompt/completion data (a loss mask): the step's loss and
# gradient are means over the targets counted on every rank (data parallel in the first phase,
# context parallel in the second).
sft() {
  "$check" train "$work/sf1" --steps 12 --phased --resets --sft
  train_expect 8 mpi 2 "$check" train "$work/sf2" --steps 12 --phased --phase-cp 2 --resets --sft \
    ${flags[@]+"${flags[@]}"}
  "$check" compare "$work/sf1" "$work/sf2" --steps 12 --weight-tol 1e-4
}
if [[ "$backend" != cpu ]]; then resets; echo "cp_equivalence: OK"; exit 0; fi
train_expect "$steps" mpi 4 "$check" train "$work/dp2cp2" --steps "$steps" --cp 2
compare "$work/np1" "$work/dp2cp2"
train_expect "$steps" mpi 4 "$check" train "$work/cp4" --steps "$steps" --cp 4
compare "$work/np1" "$work/cp4"
# A context-parallel checkpoint resumes as plain data parallelism (2 ranks).
mkdir -p "$work/resume"
cp "$work/np1/train.bin" "$work/np1/val.bin" "$work/resume/"
train_expect "$half" mpi 2 "$check" train "$work/resume" --steps "$steps" --stop-after "$half" --cp 2
train_expect 0 mpi 2 "$check" train "$work/resume" --steps "$steps"
compare "$work/np1" "$work/resume"
# A curriculum whose second (longer) phase alone is context parallel, as ZAYA1's 32K phase: the
# layout changes at step 5 (2 ranks: data parallel, then one group of 2; 4 ranks: data parallel,
# then 2 groups of 2), straight and resumed inside the context-parallel phase.
"$check" train "$work/ph1" --steps 12 --phased
train_expect 8 mpi 2 "$check" train "$work/ph2" --steps 12 --phased --phase-cp 2
"$check" compare "$work/ph1" "$work/ph2" --steps 12 --weight-tol 1e-4
train_expect 8 mpi 4 "$check" train "$work/ph4" --steps 12 --phased --phase-cp 2
"$check" compare "$work/ph1" "$work/ph4" --steps 12 --weight-tol 1e-4
mkdir -p "$work/phr"
train_expect 2 mpi 2 "$check" train "$work/phr" --steps 12 --phased --phase-cp 2 --stop-after 6
train_expect 6 mpi 2 "$check" train "$work/phr" --steps 12 --phased --phase-cp 2
"$check" compare "$work/ph1" "$work/phr" --steps 12 --weight-tol 1e-4
resets
sft
echo "cp_equivalence: OK"
