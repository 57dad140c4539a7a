#!/usr/bin/env bash
# Installs tandem's build and test dependencies from Debian 12 packages.
# Idempotent: installs only what is missing, and runs apt-get update only then.
#   scripts/setup.sh          build, tests, and Python torch (the tests' and
#                             benchmarks' peer)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache git pkg-config
  libtorch-dev libgloo-dev
  libopenblas0-openmp   # without it LibTorch silently uses reference BLAS (~6x slower)
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  openmpi-bin libopenmpi-dev   # tests that tandem workers also run under mpirun
  iproute2                     # the two-namespace multi-node test
  clang libclang-rt-dev       # libFuzzer targets (scripts/fuzz.sh): clang and its fuzzer/ASan runtimes
  python3-torch                # tests read tandem's safetensors files back in Python
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all dependencies present"
fi
