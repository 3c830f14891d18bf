#!/usr/bin/env bash
# The HIP build for AMD GPUs (gfx90a), linked, without an AMD GPU: configures build-hip with
# -DZAYA_HIP=ON (hipcc compiles every src/backend/cuda/*.cu; the objects join zaya_lib with the
# HIP runtime), builds zaya and zaya_gpu_tests, then checks that both start: every GPU test
# skips ("skipped: no GPU") and `zaya generate --backend cuda` stops with the no-device error.
# Needs hipcc and libamdhip64-dev (scripts/setup.sh with ZAYA_SETUP_HIP=1). JOBS (default 2).
# Built file by file (-DZAYA_UNITY=OFF), so a file that leans on a unity-batch neighbour for an
# #include or a helper fails here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build-hip}"
jobs="${JOBS:-2}"
started=$(date +%s)

mkdir -p "$build"
configure_log="$build/configure.log"
cmake -S "$root" -B "$build" -DZAYA_HIP=ON -DZAYA_UNITY=OFF -DCMAKE_BUILD_TYPE=Release > "$configure_log" 2>&1 ||
  { cat "$configure_log"; exit 1; }
grep "zaya HIP" "$configure_log"
if ! grep -q "zaya HIP: linked" "$configure_log"; then
  echo "hip build check: no HIP runtime found (libamdhip64): nothing linked" >&2
  exit 1
fi
cmake --build "$build" -j "$jobs" --target zaya zaya_gpu_tests

tests_log="$build/gpu_tests.log"
"$build/bin/zaya_gpu_tests" > "$tests_log" 2>&1 || { tail -20 "$tests_log"; exit 1; }
skipped=$(grep -c "skipped: no GPU" "$tests_log" || true)
passed_line=$(grep -E "^\[  PASSED  \]" "$tests_log" || true)
echo "zaya_gpu_tests (HIP): $skipped tests skipped with \"skipped: no GPU\"; $passed_line"
[ "$skipped" -gt 0 ] || { echo "hip build check: expected the GPU tests to skip without a GPU" >&2; exit 1; }

if out=$("$build/bin/zaya" generate --backend cuda --model "$root/tests/fixtures/tiny_gqa4_zero" --ids 1,2,3 2>&1); then
  echo "hip build check: zaya generate --backend cuda succeeded without a GPU?" >&2
  exit 1
fi
echo "$out" | grep -q "no GPU device is available" ||
  { echo "hip build check: unexpected error: $out" >&2; exit 1; }
echo "hip build check: zaya (HIP) stops cleanly without a device: ${out##*error: }"
echo "hip build check: OK ($(( $(date +%s) - started )) s)"
