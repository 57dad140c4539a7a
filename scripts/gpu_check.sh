#!/usr/bin/env bash
# GPU machine check: builds tandem against the machine's PyTorch 2.x LibTorch
# (with CUDA) and runs the `gpu`-labelled tests and the benchmarks.
# GPU machines have no internet: this script installs nothing and says which
# dependency is missing instead.
#   scripts/gpu_check.sh [BUILD_DIR]      (default build-gpu)
set -uo pipefail
cd "$(dirname "$0")/.."
build="${1:-build-gpu}"
out="${OUT:-$build/gpu-check}"
mkdir -p "$out"

# The Python whose torch (with CUDA) to build against: $TANDEM_PYTHON, else python3.
python=${TANDEM_PYTHON:-$(command -v python3)}
prefix=$("$python" -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
  echo "gpu_check: $python cannot import torch; no PyTorch LibTorch to build against (set TANDEM_PYTHON)" >&2
  exit 1
}
"$python" -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' | tee "$out/torch.txt"
nvidia-smi -L 2>/dev/null | tee "$out/gpus.txt" || true

missing=()
for header in yaml-cpp/yaml.h nlohmann/json.hpp CLI/CLI.hpp gloo/rendezvous/store.h gtest/gtest.h; do
  [[ -e /usr/include/$header || -e /usr/local/include/$header ]] || missing+=("$header")
done
if ((${#missing[@]})); then
  echo "gpu_check: missing headers on this machine: ${missing[*]} (install the Debian -dev packages listed in scripts/setup.sh)" >&2
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  2>&1 | tee "$out/configure.log" || exit 1
cmake --build "$build" -j"$(nproc)" 2>&1 | tee "$out/build.log" | tail -20
[[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "gpu_check: build failed, see $out/build.log" >&2; exit 1; }

status=0
ctest --test-dir "$build" -L gpu --output-on-failure 2>&1 | tee "$out/ctest-gpu.log" || status=1
"$build/bin/tandem" env --json > "$out/env.json" 2>&1 || status=1
for bench in "$build"/bin/bench_*; do
  [[ -x "$bench" ]] || continue
  echo "== $(basename "$bench")" | tee -a "$out/bench.log"
  "$build/bin/tandem" launch --nproc-per-node 2 --standalone "$bench" 2>&1 | tail -3 | tee -a "$out/bench.log" || status=1
done
# The demo on one GPU in fp32, bf16 and fp16 (with the loss scaler): whether
# each converges, and its tokens/s (issue 5's GPU items).
for precision in no bf16 fp16; do
  echo "== gpt_addition --mixed-precision $precision" | tee -a "$out/demo.log"
  "$build/bin/tandem" launch --nproc-per-node 1 --standalone --mixed-precision "$precision" \
    "$build/bin/gpt_addition" --eval-every 500 --metrics-file "$out/demo-$precision.jsonl" \
    2>&1 | tail -2 | tee -a "$out/demo.log" || status=1
done
exit $status
