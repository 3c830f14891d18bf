#!/usr/bin/env bash
# Compile check of the GPU backend without a GPU: every src/backend/cuda/*.cu to an object
# file only, with nvcc for sm_80 and sm_90 and with hipcc for gfx90a (when hipcc is installed).
# Exits non-zero on any compile error, and on any kernel that spills registers to local memory
# for sm_80 or sm_90 (ptxas -warn-spills, with every ptxas warning an error: a spill in a
# tensor-core kernel costs more than any tuning wins, and ptxas warns of nothing today). A missing compiler is reported and skipped, unless
# STRICT=1 (then it is an error). JOBS (default 1) compiles that many files at once.
# The NCCL/RCCL communicator (every comm_nccl*.cu) needs the collective library's header: nccl.h
# for nvcc (next to nvcc, under ZAYA_NCCL_ROOT, or in /usr/include; missing counts like a missing
# compiler), rccl.h for hipcc (under ZAYA_RCCL_ROOT or /opt/rocm; Debian has no RCCL package, so
# without it those files are skipped for hipcc with a "skipped" line each, which is not an error).
# No stand-in header is used here: scripts/hip_standin_check.sh compiles the RCCL and hipBLASLt
# paths against our compile-only headers in tests/gpu/standin/include.
# HIP=0 leaves hipcc out (CI: scripts/hip_build_check.sh compiles the same files with hipcc and
# links them).
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
want_hip="${HIP:-1}"

sources=("$root"/src/backend/cuda/*.cu)
comm_sources=("$root"/src/backend/cuda/comm_nccl*.cu)  # the NCCL/RCCL communicator's files
failures=0
missing=0
compiled=0
started=$(date +%s)

# The first directory of "$@" that holds the header $1 (a relative path), or nothing.
find_header() {
  local header="$1" dir
  shift
  for dir in "$@"; do
    if [ -n "$dir" ] && [ -f "$dir/$header" ]; then echo "$dir"; return; fi
  done
}

# Whether $1 is one of comm_sources.
is_comm_source() {
  local comm
  for comm in "${comm_sources[@]}"; do
    if [ "$1" = "$comm" ]; then return 0; fi
  done
  return 1
}

# Sets srcs to every source, or every source but the comm_nccl*.cu files when $1 is empty (no
# header).
select_sources() {
  srcs=()
  local src
  for src in "${sources[@]}"; do
    if [ -z "$1" ] && is_comm_source "$src"; then continue; fi
    srcs+=("$src")
  done
}

# One "skip" line per comm_nccl*.cu: $1 = label, $2 = why.
skip_comm_sources() {
  local src
  for src in "${comm_sources[@]}"; do
    echo "skip  $1 $(basename "$src"): skipped: $2"
  done
}

run_all() {  # $1 = label, $2 = object dir, rest = compile command prefix; each file in srcs appends "-c src -o obj"
  local label="$1" dir="$2"
  shift 2
  local pids=() names=()
  for src in "${srcs[@]}"; do
    local name
    name="$(basename "$src" .cu)"
    ( "$@" -c "$src" -o "$out/$dir/$name.o" > "$out/$dir/$name.log" 2>&1 ) &
    pids+=($!)
    names+=("$name")
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do sleep 0.2; done
  done
  compiled=$((compiled + ${#pids[@]}))
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
  nccl_inc="$(find_header nccl.h "${ZAYA_NCCL_ROOT:+$ZAYA_NCCL_ROOT/include}" "$(dirname "$nvcc")/../include" \
    /usr/local/cuda/include /usr/include)"
  nccl_flags=()
  if [ -n "$nccl_inc" ]; then
    nccl_flags=(-I"$nccl_inc")
  else
    skip_comm_sources "nvcc sm_80+sm_90" "no nccl.h (install NCCL or set ZAYA_NCCL_ROOT)"
    missing=$((missing + 1))
  fi
  select_sources "$nccl_inc"
  run_all "nvcc sm_80+sm_90" cuda "$nvcc" -std=c++20 -O2 -I"$root/src" "${nccl_flags[@]}" \
    -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
    -Xptxas=-warn-spills,-Werror -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter
else
  echo "nvcc not found: CUDA compile check skipped"
  missing=$((missing + 1))
fi

if [ "$want_hip" = 0 ]; then
  echo "hipcc left out (HIP=0)"
elif [ -n "$hipcc" ]; then
  rccl_inc="$(find_header rccl/rccl.h "${ZAYA_RCCL_ROOT:+$ZAYA_RCCL_ROOT/include}" /opt/rocm/include /usr/include)"
  [ -n "$rccl_inc" ] || rccl_inc="$(find_header rccl.h "${ZAYA_RCCL_ROOT:+$ZAYA_RCCL_ROOT/include}" /opt/rocm/include /usr/include)"
  rccl_flags=()
  if [ -n "$rccl_inc" ]; then
    rccl_flags=(-DZAYA_HAVE_RCCL -I"$rccl_inc")
  else
    skip_comm_sources "hipcc gfx90a" "no rccl.h (Debian has no RCCL package; set ZAYA_RCCL_ROOT where it is installed)"
  fi
  select_sources "$rccl_inc"
  run_all "hipcc gfx90a" hip "$hipcc" --offload-arch=gfx90a -std=c++20 -O2 -DZAYA_HIP -I"$root/src" "${rccl_flags[@]}" -x hip
else
  echo "hipcc not found: HIP compile check skipped (Debian: apt-get install hipcc)"
  missing=$((missing + 1))
fi

echo "gpu compile check: ${#sources[@]} files, $compiled compiles, $failures failure(s), $(( $(date +%s) - started )) s"
[ "$keep" = 1 ] || rm -rf "$out"
if [ "$failures" -gt 0 ]; then exit 1; fi
if [ "$strict" = 1 ] && [ "$missing" -gt 0 ]; then exit 1; fi
exit 0
