#!/usr/bin/env bash
# Installs tandem's build and test dependencies:
#   - Debian 12 packages (compiler, CMake, yaml-cpp, nlohmann-json, CLI11,
#     GoogleTest, Google Benchmark, Gloo's headers, Open MPI, clang);
#   - PyTorch's LibTorch 2.13 (CPU) from pip, into the project-local virtual
#     environment .venv/ (or $TANDEM_VENV). CMake finds Torch through its
#     Python, and the tests and benchmarks use that Python as the peer;
#     with it the Python tools the tests compare against (safetensors,
#     tensorboard, accelerate, deepspeed, mlflow).
# Idempotent: installs only what is missing, and runs apt-get update only then.
#   scripts/setup.sh              everything above
#   scripts/setup.sh --no-peers   without the Python tools (README command 1:
#                                 building and running needs only torch)
set -euo pipefail
cd "$(dirname "$0")/.."

peers=1
for arg in "$@"; do
  case $arg in
    --no-peers) peers=0 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup: unknown argument '$arg' (--no-peers leaves out the Python tools; --help)" >&2
       exit 2 ;;
  esac
done

torch_version=2.13.0
venv=${TANDEM_VENV:-.venv}

packages=(
  build-essential cmake ninja-build ccache git pkg-config python3-venv
  libgloo-dev                  # the <gloo/...> headers c10d's ProcessGroupGloo.hpp includes (docs/architecture.md)
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  libfmt-dev                   # the torch-free fuzz targets (fuzz/); the library uses LibTorch's fmt
  libgtest-dev libgmock-dev libbenchmark-dev
  openmpi-bin libopenmpi-dev   # tests that tandem workers also run under mpirun
  iproute2                     # the multi-node tests' hosts as network namespaces (tests/support/test_cluster.h)
  openssh-server openssh-client  # an ssh server on each of those hosts, with keys the test makes
  slurm-wlm munge              # a real Slurm on those hosts (tests/support/slurm_cluster.h; the tests start and stop its daemons)
  clang libclang-rt-dev        # libFuzzer targets (scripts/fuzz.sh): clang and its fuzzer/ASan runtimes
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
  echo "setup: all Debian packages present"
fi

# python3 is whatever the PATH gives (pyenv's or Debian's); pip's wheels must
# match it (torch 2.13.0 for CPython 3.11 lies on this machine's disk).
if ! "$venv/bin/python" -c "import torch, numpy; assert torch.__version__.startswith('$torch_version')" \
    2>/dev/null; then
  echo "setup: installing torch==$torch_version into $venv"
  python3 -m venv "$venv"
  # --no-compile: Python compiles each module when first imported instead
  # (and caches it, unless PYTHONDONTWRITEBYTECODE is set): torch's thousands
  # of modules took 46 s to install compiled, 21 s without (2-core box).
  "$venv/bin/pip" install -q --no-compile "torch==$torch_version" numpy
else
  echo "setup: $venv has torch $torch_version"
fi
# The Python tools tandem is checked against, for tests and benchmarks only
# (the library needs no Python): safetensors, TensorBoard, Accelerate,
# DeepSpeed (tests/config/conformance.py reads every config with it, and the
# ZeRO benchmarks run it; DS_ACCELERATOR=cpu lets it import without CUDA) and
# MLflow (its server, for the MLflow tracker's test).
if ((peers == 0)); then
  echo "setup: the Python tools (safetensors, tensorboard, accelerate, deepspeed, mlflow) left out" \
       "(--no-peers); the tests that compare against them need them"
elif ! DS_ACCELERATOR=cpu "$venv/bin/python" -c \
    "import safetensors, tensorboard, accelerate, deepspeed, mlflow" 2>/dev/null; then
  echo "setup: installing safetensors, tensorboard, accelerate, deepspeed and mlflow into $venv"
  "$venv/bin/pip" install -q --no-compile safetensors tensorboard accelerate deepspeed mlflow \
    > "$venv/pip-tools.log" 2>&1 || {
    cat "$venv/pip-tools.log" >&2; echo "setup: pip could not install them" >&2; exit 1; }
fi
