#!/usr/bin/env bash
# Compile check of the HIP build's hipBLASLt and RCCL paths on a machine without those libraries
# (Debian has neither; CI runs this after scripts/hip_build_check.sh). hipcc compiles for gfx90a,
# to objects only, the src/backend/cuda/*.cu files that those paths change: every comm_nccl*.cu
# (the RCCL communicator) and every file using the BLASLt names (ZAYA_GPU_BLASLT, gpuBlasLt*),
# with -DZAYA_HAVE_HIPBLASLT -DZAYA_HAVE_RCCL against our compile-only stand-in headers in
# tests/gpu/standin/include (hipblaslt/hipblaslt.h, rccl/rccl.h: the subset of each API that zaya
# uses). Only this script uses the stand-ins; cmake and scripts/gpu_compile_check.sh keep looking
# for the real headers. Nothing is linked or run. Exits non-zero on any compile error or when
# hipcc is missing (HIPCC picks another). JOBS (default 2) compiles that many files at once.
#   scripts/hip_standin_check.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${JOBS:-2}"
hipcc="${HIPCC:-$(command -v hipcc || true)}"
if [ -z "$hipcc" ]; then
  echo "hip stand-in check: hipcc not found (Debian: apt-get install hipcc)" >&2
  exit 1
fi
started=$(date +%s)
out="$(mktemp -d /tmp/zaya_hip_standin.XXXXXX)"
trap 'rm -rf "$out"' EXIT

srcs=()
for src in "$root"/src/backend/cuda/*.cu; do
  case "$(basename "$src")" in
    comm_nccl*.cu) srcs+=("$src") ;;
    *) if grep -qE 'ZAYA_GPU_BLASLT|gpuBlasLt' "$src"; then srcs+=("$src"); fi ;;
  esac
done

flags=(--offload-arch=gfx90a -std=c++20 -O2 -DZAYA_HIP -DZAYA_HAVE_HIPBLASLT -DZAYA_HAVE_RCCL
  -I"$root/src" -I"$root/tests/gpu/standin/include" -x hip)
pids=()
names=()
for src in "${srcs[@]}"; do
  name="$(basename "$src" .cu)"
  "$hipcc" "${flags[@]}" -c "$src" -o "$out/$name.o" > "$out/$name.log" 2>&1 &
  pids+=($!)
  names+=("$name")
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
done

failures=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "ok    hipcc gfx90a (stand-ins) ${names[$i]}.cu"
  else
    echo "FAIL  hipcc gfx90a (stand-ins) ${names[$i]}.cu"
    sed 's/^/      /' "$out/${names[$i]}.log"
    failures=$((failures + 1))
  fi
done

echo "hip stand-in check: ${#srcs[@]} files, $failures failure(s), $(( $(date +%s) - started )) s"
[ "$failures" -eq 0 ]
