#!/usr/bin/env bash
# Compiles and links tandem's CUDA-facing targets (the library, the CLI, the
# examples, the GPU checks and tandem_core_tests) against PyTorch's CUDA
# LibTorch, torch==2.14.1 (CUDA 13.0), with the NCCL backend on. The other
# test binaries and the benchmarks hold no CUDA code of their own and are
# left to the CPU build, which keeps CI inside its budget. Needs no GPU; it
# runs `tandem env`, the gpu-labelled tests, which skip without a device, and
# the LibTorch-internals tests (on the CPU): the CUDA paths are only compiled
# here (scripts/gpu_kit.sh runs them on a GPU machine). 2.14.1 rather than the
# GPU machines' 2.11: its wheel is on CI's disk, 2.11's is a 4.3 GB download,
# and 2.14 is the release that needs C++20 (docs/architecture.md). torch
# goes into its own virtual environment, .venv-cuda/ (or $TANDEM_CUDA_VENV);
# about 5.5 GB. Needs a CUDA toolkit for LibTorch's CMake ($CUDA_HOME).
#   scripts/cuda_build_check.sh [BUILD_DIR]      (default build-cuda)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
venv=${TANDEM_CUDA_VENV:-.venv-cuda}
torch_version=2.14.1

t0=$(date +%s)
if ! "$venv/bin/python" -c "import torch; assert torch.__version__.startswith('$torch_version') \
    and torch.version.cuda" 2>/dev/null; then
  echo "cuda_build_check: installing torch==$torch_version (CUDA) into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "torch==$torch_version"
fi
"$venv/bin/python" -c "import torch; print('cuda_build_check: torch', torch.__version__, \
'CUDA', torch.version.cuda, 'cuDNN', torch.backends.cudnn.version(), \
'NCCL', '.'.join(map(str, torch.cuda.nccl.version())))" 2>&1 | grep -v -e NumPy -e _conversion_method
t1=$(date +%s)

# LibTorch's CMake config wants a CUDA toolkit (headers, libcudart and nvcc,
# which also compiles tandem's own kernels; no GPU): $CUDA_HOME, else
# /usr/local/cuda.
cuda_root=${CUDA_HOME:-/usr/local/cuda}
[[ -f "$cuda_root/include/cuda_runtime.h" ]] || {
  echo "cuda_build_check: no CUDA toolkit at $cuda_root (set CUDA_HOME); LibTorch's CMake needs" \
       "its headers and libcudart" >&2; exit 1; }

# The pip packages carry libnvrtc, which a minimal toolkit may lack.
nvrtc=
for lib in "$cuda_root"/lib64/libnvrtc.so "$venv"/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.*; do
  if [[ -f "$lib" && "$lib" != *builtins* ]]; then nvrtc=$(readlink -f "$lib"); break; fi
done

# Torch is found through the venv's Python (no CMAKE_PREFIX_PATH): the same
# path the default build takes with .venv/. At -O0: this build proves that the
# code compiles and links, and what runs here (tandem env, the skipping GPU
# tests, TorchInternals) needs no speed; the CPU build compiles at its release
# levels. -O0 took 203 s against 251 s for Release (2026-11-28, 2-core box).
# One unity batch per target (TANDEM_UNITY_BATCH_SIZE=0): LibTorch's headers
# are parsed once for the library (49 s of CPU against 69 s in batches of 64),
# and a name two of the library's files both define in an unnamed namespace
# fails here, whichever batches the default build happens to make (the
# CPU-only half of that check is the add_subdirectory consumer's).
mkdir -p "$build"
cmake -S . -B "$build" -G Ninja -DTANDEM_PYTHON="$PWD/$venv/bin/python" \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DTANDEM_UNITY_BATCH_SIZE=0 \
  -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc" \
  ${nvrtc:+-DCUDA_nvrtc_LIBRARY="$nvrtc"} \
  > "$build/configure.log" 2>&1 \
  || { cat "$build/configure.log"; exit 1; }
grep -E "^-- tandem:" "$build/configure.log"
grep -q "NCCL backend: ON" "$build/configure.log" || {
  echo "cuda_build_check: FAIL: configure did not turn the NCCL backend on" >&2; exit 1; }
grep -q "CUDA kernels: ON" "$build/configure.log" || {
  echo "cuda_build_check: FAIL: configure left out tandem's CUDA kernels" >&2; exit 1; }
cmake --build "$build" --target tandem tandem_cli tandem_examples tandem_core_tests tandem_gpu_tests \
  benchmarks
t2=$(date +%s)

# The CLI links and loads: it reports the CUDA LibTorch (no GPU needed).
"$build/bin/tandem" env --json > "$build/env.json"
"$venv/bin/python" - "$build/env.json" "$torch_version" <<'PY'
import json, sys
report, version = json.load(open(sys.argv[1])), sys.argv[2]
v = report["versions"]
assert v["libtorch"] == version, v
assert v["cuda"] and v["nccl"], v
assert report["backends"]["nccl"] is True, report["backends"]
assert report["backends"]["tandem_cuda_kernels"] is True, report["backends"]
print("cuda_build_check: tandem env:", {k: v[k] for k in ("libtorch", "cuda", "cudnn", "nccl", "libtorch_cxx_abi")})
PY
# The CUDA test cases (label gpu) run; with no device they skip, saying so.
ctest --test-dir "$build" -L gpu -V > "$build/ctest-gpu.log" 2>&1 || {
  tail -60 "$build/ctest-gpu.log"; echo "cuda_build_check: FAIL: the gpu-labelled tests failed" >&2
  exit 1; }
echo "cuda_build_check: gpu-labelled tests: $(grep -c 'SKIPPED \].*ms)' "$build/ctest-gpu.log") skipped," \
     "$(grep -c '  OK \].*ms)' "$build/ctest-gpu.log") passed (details: $build/ctest-gpu.log)"
# The LibTorch-internals tests run against this LibTorch too (on the CPU):
# src/core/torch_internals.* is where a LibTorch upgrade breaks first.
"$build/bin/tandem_core_tests" --gtest_filter='TorchInternals.*' > "$build/internals.log" 2>&1 || {
  tail -40 "$build/internals.log"; echo "cuda_build_check: FAIL: TorchInternals.* on LibTorch" \
    "$torch_version" >&2; exit 1; }
echo "cuda_build_check: TorchInternals.* on LibTorch $torch_version:" \
     "$(grep -c '  OK \].*ms)' "$build/internals.log") passed"
programs=$(find "$build/bin" -maxdepth 1 -type f -perm -u+x | wc -l)
echo "cuda_build_check: ok, $programs programs linked against CUDA LibTorch $torch_version;" \
     "install $((t1 - t0)) s, build $((t2 - t1)) s"
