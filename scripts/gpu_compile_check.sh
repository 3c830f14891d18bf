#!/usr/bin/env bash
# Compile check of the GPU backend without a GPU: every src/backend/cuda/*.cu to an object
# file only, with nvcc for sm_80 and sm_90 and with hipcc for gfx90a (when hipcc is installed).
# Exits non-zero on any compile error. A missing compiler is reported and skipped, unless
# STRICT=1 (then it is an error). JOBS (default 1) compiles that many files at once.
#   scripts/gpu_compile_check.sh            # objects go to a temporary directory, removed after
#   OUT_DIR=/tmp/gpu_objs JOBS=4 scripts/gpu_compile_check.sh
set -uo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
jobs="${JOBS:-1}"
strict="${STRICT:-0}"
out="${OUT_DIR:-}"
keep=1
if [ -z "$out" ]; then
  out="$(mktemp -d /tmp/zaya_gpu_check.XXXXXX)"
  keep=0
fi
mkdir -p "$out/cuda" "$out/hip"

nvcc="${NVCC:-}"
if [ -z "$nvcc" ]; then
  if command -v nvcc >/dev/null 2>&1; then nvcc="$(command -v nvcc)";
  elif [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
fi
hipcc="${HIPCC:-$(command -v hipcc || true)}"

sources=("$root"/src/backend/cuda/*.cu)
failures=0
missing=0
started=$(date +%s)

run_all() {  # $1 = label, rest = compile command prefix; each file appends "-c src -o obj"
  local label="$1" dir="$2"
  shift 2
  local pids=() names=()
  for src in "${sources[@]}"; do
    local name
    name="$(basename "$src" .cu)"
    ( "$@" -c "$src" -o "$out/$dir/$name.o" > "$out/$dir/$name.log" 2>&1 ) &
    pids+=($!)
    names+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  done
  for i in "${!pids[@]}"; do
    if wait "${pids[$i]}"; then
      echo "ok    $label ${names[$i]}.cu"
    else
      echo "FAIL  $label ${names[$i]}.cu"
      sed 's/^/      /' "$out/$dir/${names[$i]}.log"
      failures=$((failures + 1))
    fi
  done
}

if [ -n "$nvcc" ]; then
  run_all "nvcc sm_80+sm_90" cuda "$nvcc" -std=c++20 -O2 -I"$root/src" \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter
else
  echo "nvcc not found: CUDA compile check skipped"
  missing=$((missing + 1))
fi

if [ -n "$hipcc" ]; then
  run_all "hipcc gfx90a" hip "$hipcc" --offload-arch=gfx90a -std=c++20 -O2 -DZAYA_HIP -I"$root/src" -x hip
else
  echo "hipcc not found: HIP compile check skipped (Debian: apt-get install hipcc)"
  missing=$((missing + 1))
fi

echo "gpu compile check: ${#sources[@]} files, $failures failure(s), $(( $(date +%s) - started )) s"
[ "$keep" = 1 ] || rm -rf "$out"
if [ "$failures" -gt 0 ]; then exit 1; fi
if [ "$strict" = 1 ] && [ "$missing" -gt 0 ]; then exit 1; fi
exit 0
