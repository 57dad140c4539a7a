#!/usr/bin/env bash
# The GPU kit: verifies tandem's GPU paths on a GPU machine in one run.
#
#   scripts/gpu_kit.sh prepare [KIT_DIR]   on a Debian 12 machine like CI's (network)
#   scripts/gpu_kit.sh run [KIT_DIR]       on the GPU machine (no network)
#   scripts/gpu_kit.sh dry-run [KIT_DIR]   `run` here, with Debian's -dev packages hidden
#
# KIT_DIR defaults to .gpu-kit/ (git-ignored). The GPU machines this project
# gets have their own PyTorch (2.11, CUDA 13), CMake, ninja, nvcc and a
# compiler, but none of Debian's -dev packages and no network. `prepare`
# downloads the .deb files tandem's build needs besides LibTorch (yaml-cpp,
# nlohmann-json, CLI11, GoogleTest, Gloo's headers) into KIT_DIR; `run`
# unpacks them into a private prefix, configures against the machine's own
# PyTorch (TANDEM_PYTHON, else python3), builds only what the GPU checks need
# on all cores, runs them, and writes into $OUT (else gpu-out/):
#   summary.json       every check: passed/failed/skipped with its reason, and the figures
#   build.log          configure and build
#   gpu-tests.log      tandem_gpu_tests (ctest label gpu), verbose
#   gtest.json         its per-test results (one process per test)
#   speed.log          the demo against Python eager on the same GPU
#   gpt2.log           bench/compare_gpt2.py at 124m and tiny (gpt2.jsonl: every case)
#   profile-124m.txt   where a 124m step's device time goes (torch.profiler, Python eager)
#   profile-tandem-124m.txt  the same for tandem's eager step (its kernels, summed)
#   env.json           `tandem env --json`
# It exits non-zero, naming the failed checks, if any check failed.
# docs/gpu.md lists the checks and what each compares against.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

verb=${1:-}
kit=${2:-.gpu-kit}
kit=$(cd "$(dirname "$kit")" 2>/dev/null && echo "$PWD/$(basename "$kit")") || kit=$root/.gpu-kit

# The Debian 12 (bookworm, amd64) packages whose files the build uses. The
# runtime library of yaml-cpp comes with its -dev package; googletest's
# static libraries are in libgtest-dev.
packages=(libyaml-cpp-dev libyaml-cpp0.7 nlohmann-json3-dev libcli11-dev libgtest-dev libgloo-dev)
# A header of each, to say which one is missing.
headers=(yaml-cpp/yaml.h nlohmann/json.hpp CLI/CLI.hpp gtest/gtest.h gloo/rendezvous/store.h)

die() { echo "gpu_kit: $*" >&2; exit 1; }

prepare() {
  command -v apt-get >/dev/null || die "prepare needs apt-get (a Debian 12 machine like CI's)"
  mkdir -p "$kit/debs"
  rm -f "$kit"/debs/*.deb
  (cd "$kit/debs" && apt-get download "${packages[@]}") >"$kit/prepare.log" 2>&1 || {
    # A fresh machine may not have the package lists yet.
    apt-get update -qq >>"$kit/prepare.log" 2>&1
    (cd "$kit/debs" && apt-get download "${packages[@]}") >>"$kit/prepare.log" 2>&1
  } || { cat "$kit/prepare.log" >&2; die "apt-get download failed"; }
  local kit_bytes source_bytes
  kit_bytes=$(du -sb "$kit" | cut -f1)
  source_bytes=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
  echo "gpu_kit: $kit: $(ls "$kit/debs" | wc -l) packages, $((kit_bytes / 1024)) KiB;" \
       "with the source $(((kit_bytes + source_bytes) / 1024 / 1024)) MiB (limit 48 MiB)"
  ((kit_bytes + source_bytes <= 48 * 1024 * 1024)) || die "the kit and the source exceed 48 MiB"
}

# Unpacks a .deb into $2 with dpkg-deb, or with Python's standard library
# where dpkg is missing (an ar archive holding data.tar.*).
unpack_deb() {
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2"
    return
  fi
  "$python" - "$1" "$2" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", deb
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(dest)
    pos += 60 + size + (size & 1)
PY
}

run() {
  local out=${OUT:-$root/gpu-out}
  mkdir -p "$out"
  local work=${TANDEM_GPU_KIT_WORK:-/tmp/tandem-gpu-kit}
  local build=$work/build prefix=$work/prefix
  mkdir -p "$work"
  rm -f "$work/figures.jsonl" "$out/summary.json"
  local t0 t1 t2 t2b t3
  t0=$(date +%s)
  python=${TANDEM_PYTHON:-$(command -v python3)}
  "$python" - >"$work/torch.json" <<'PY' || die "$python cannot import torch (set TANDEM_PYTHON)"
import json, torch
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda,
                  "gpus": torch.cuda.device_count(),
                  "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                  "cmake_prefix_path": torch.utils.cmake_prefix_path}))
PY
  echo "gpu_kit: $(cat "$work/torch.json")"

  # Debian's packages into a private prefix; the system's own copies, where
  # a machine has them, are not used.
  ls "$kit"/debs/*.deb >/dev/null 2>&1 || die "no .deb files in $kit/debs: run 'scripts/gpu_kit.sh prepare' first"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for deb in "$kit"/debs/*.deb; do unpack_deb "$deb" "$prefix" || die "cannot unpack $deb"; done
  local missing=()
  for header in "${headers[@]}"; do [[ -e $prefix/usr/include/$header ]] || missing+=("$header"); done
  ((${#missing[@]} == 0)) || die "the kit lacks ${missing[*]}: run 'scripts/gpu_kit.sh prepare' again"

  # LibTorch's CMake wants a CUDA toolkit ($CUDA_HOME, else /usr/local/cuda)
  # and libnvrtc, which pip's torch carries beside it.
  local cuda_root=${CUDA_HOME:-/usr/local/cuda} nvrtc= site
  if [[ ! -x $cuda_root/bin/nvcc ]] && command -v nvcc >/dev/null; then
    cuda_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  fi
  site=$("$python" -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  for lib in "$cuda_root"/lib64/libnvrtc.so "$site"/nvidia/*/lib/libnvrtc.so.* \
             "$site"/nvidia/*/lib/libnvrtc.so; do
    if [[ -f $lib && $lib != *builtins* && $lib != *.alt.* ]]; then nvrtc=$(readlink -f "$lib"); break; fi
  done
  local cuda_args=()
  if [[ -x $cuda_root/bin/nvcc ]]; then
    cuda_args+=(-DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DCMAKE_CUDA_COMPILER="$cuda_root/bin/nvcc")
  fi
  [[ -n $nvrtc ]] && cuda_args+=(-DCUDA_nvrtc_LIBRARY="$nvrtc")
  # The machine's LibTorch, and the kit's packages ahead of any system copy.
  local torch_prefix
  torch_prefix=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)')
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # Batches of 8 sources: on the GPU machine's 16 cores more, smaller unity
  # batches finish sooner than the 2-core default of 32.
  {
    cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
      -DTANDEM_PYTHON="$python" -DCMAKE_PREFIX_PATH="$prefix/usr;$torch_prefix" \
      -DTANDEM_BUILD_BENCH=OFF -DTANDEM_INSTALL=OFF -DTANDEM_UNITY_BATCH_SIZE=8 \
      "${cuda_args[@]}" &&
      cmake --build "$build" -j"$(nproc)" --target tandem tandem_cli tandem_gpu_tests \
        gpt_addition gpt2 -- -k 0
  } >"$out/build.log" 2>&1
  local build_rc=$?
  # The GPT-2 example alone failing to build leaves every other check.
  if ((build_rc != 0)) && [[ -x $build/bin/tandem_gpu_tests && -x $build/bin/gpt_addition ]]; then
    echo "gpu_kit: gpt2 did not build (see build.log); the other checks go on"
    build_rc=0
  fi
  t1=$(date +%s)
  grep -E "^-- tandem:" "$out/build.log"
  if ((build_rc != 0)); then
    tail -40 "$out/build.log" >&2
    "$python" "$root/scripts/gpu_kit_summary.py" --out "$out" --work "$work" \
      --build-failed --times "build=$((t1 - t0))"
    die "configure or build failed (see $out/build.log)"
  fi
  echo "gpu_kit: built in $((t1 - t0)) s"

  "$build/bin/tandem" env --json >"$out/env.json" 2>&1
  # The checks, one process per test: a crash or a hang (killed after
  # TANDEM_GPU_KIT_TEST_TIMEOUT s) costs that test alone. The peer Python
  # of the Python comparisons (TANDEM_PEER_PYTHON) is $python.
  # TANDEM_GPU_KIT_DEADLINE (s from the start, default 450) bounds the whole
  # run, so that a hang cannot lose the summary to the machine's 10-minute
  # limit: tests and speed runs not started by then are skipped as such.
  local test_timeout=${TANDEM_GPU_KIT_TEST_TIMEOUT:-120} name rc tests
  local deadline=$((t0 + ${TANDEM_GPU_KIT_DEADLINE:-450}))
  tests=$("$build/bin/tandem_gpu_tests" --gtest_list_tests \
          --gtest_filter="${TANDEM_GPU_KIT_FILTER:-*}" |
          awk '/^[^ ]/ {suite = $1} /^  [^ ]/ {print suite $1}')
  rm -rf "$work/gtest" && mkdir -p "$work/gtest"
  : >"$out/gpu-tests.log"
  for name in $tests; do
    if (($(date +%s) + 30 > deadline)); then
      echo "=== out of time $name" >>"$out/gpu-tests.log"
      echo "gpu_kit: $name: not run, past the kit's deadline"
      continue
    fi
    echo "=== $name" >>"$out/gpu-tests.log"
    TANDEM_GPU_FIGURES=$work/figures.jsonl timeout -k 10 "$test_timeout" \
      "$build/bin/tandem_gpu_tests" --gtest_color=no --gtest_filter="$name" \
      --gtest_output=json:"$work/gtest/${name//\//_}.json" >>"$out/gpu-tests.log" 2>&1
    rc=$?
    echo "=== exit $rc $name" >>"$out/gpu-tests.log"
    echo "gpu_kit: $name: exit $rc (at $(($(date +%s) - t0)) s)"
  done
  t2=$(date +%s)

  # GPT-2 (examples/gpt2) against Python on the same GPU: eager, both
  # torch.compile modes, a manual CUDA graph, tandem eager and tandem's
  # captured step (bench/compare_gpt2.py), at 124m (bf16) then tiny; each case
  # gets its own limit, none runs past TANDEM_GPU_KIT_END (s from the start,
  # default 560). Then a profile of Python's eager 124m step.
  local end=$((t0 + ${TANDEM_GPU_KIT_END:-560})) preset remaining gpus
  gpus=$("$python" -c 'import torch; print(torch.cuda.device_count())')
  : >"$out/gpt2.log"
  rm -f "$out/gpt2.jsonl"
  for preset in ${TANDEM_GPU_KIT_GPT2_PRESETS:-124m tiny}; do
    remaining=$((end - $(date +%s)))
    if ((gpus == 0 || remaining < 60)); then
      echo "== skipped $preset: no CUDA device or past the kit's end" >>"$out/gpt2.log"
      continue
    fi
    echo "== compare_gpt2.py --preset $preset (at $(($(date +%s) - t0)) s)" >>"$out/gpt2.log"
    timeout -k 5 "$remaining" "$python" "$root/bench/compare_gpt2.py" --build "$build" \
      --python "$python" --preset "$preset" --device cuda --mixed-precision bf16 \
      --max-steps "${TANDEM_GPU_KIT_GPT2_STEPS:-60}" --case-timeout "$((remaining / 4 < 150 ? remaining / 4 : 150))" \
      ${TANDEM_GPU_KIT_GPT2_CASES:+--cases "$TANDEM_GPU_KIT_GPT2_CASES"} \
      --out "$out/gpt2.jsonl" >>"$out/gpt2.log" 2>&1
    echo "exit $?" >>"$out/gpt2.log"
  done
  remaining=$((end - $(date +%s)))
  if ((gpus > 0 && remaining > 40)); then
    timeout -k 5 "$remaining" "$python" "$root/bench/gpt2_reference.py" --case eager \
      --preset 124m --device cuda --mixed-precision bf16 --max-steps 5 --warmup-measure 3 \
      --profile "$out/profile-124m.txt" >>"$out/gpt2.log" 2>&1
    echo "profile exit $?" >>"$out/gpt2.log"
  fi
  # The same for tandem's eager step (a captured one runs the same kernels):
  # the example's Chrome trace, its kernels summed (scripts/trace_kernels.py).
  remaining=$((end - $(date +%s)))
  if ((gpus > 0 && remaining > 30)) && [[ -x $build/bin/gpt2 ]]; then
    rm -rf "$work/trace"
    timeout -k 5 "$remaining" "$build/bin/gpt2" --preset 124m --device cuda \
      --mixed-precision bf16 --batch-size 16 --max-steps 5 --warmup-measure 5 \
      --profile "$work/trace" >>"$out/gpt2.log" 2>&1 &&
      "$python" "$root/scripts/trace_kernels.py" "$work/trace/profile_0.json" --steps 3 \
        >"$out/profile-tandem-124m.txt" 2>&1
    echo "tandem profile exit $?" >>"$out/gpt2.log"
  fi
  t2b=$(date +%s)

  # The demo on one GPU, fp32 and bf16, against the same model and recipe in
  # Python eager on the same GPU (bench/gpt_addition.py): tokens/s and peak
  # CUDA memory. Same global batch (128), steps and evaluation.
  local steps=${TANDEM_GPU_KIT_STEPS:-1500}
  : >"$out/speed.log"
  if ((gpus == 0)); then
    echo "== skipped: no CUDA device (torch.cuda.device_count() is 0)" >>"$out/speed.log"
  elif ((steps == 0)); then
    echo "== skipped: TANDEM_GPU_KIT_STEPS=0" >>"$out/speed.log"
  fi
  # Each run gets 90 s at most, and none ends later than 100 s past the deadline.
  local limit
  for precision in no bf16; do
    ((gpus > 0 && steps > 0)) || continue
    limit=$((deadline + 100 - $(date +%s)))
    if ((limit < 60)); then
      echo "== skipped: past the kit's deadline (TANDEM_GPU_KIT_DEADLINE)" >>"$out/speed.log"
      break
    fi
    echo "== tandem gpt_addition --mixed-precision $precision" >>"$out/speed.log"
    timeout -k 5 $((limit / 2 < 90 ? limit / 2 : 90)) "$build/bin/tandem" launch \
      --nproc-per-node 1 --standalone \
      --mixed-precision "$precision" "$build/bin/gpt_addition" --batch-size 128 \
      --max-steps "$steps" --eval-every 0 --metrics-file "$work/demo-$precision.jsonl" \
      >>"$out/speed.log" 2>&1
    echo "exit $?" >>"$out/speed.log"
    limit=$((deadline + 100 - $(date +%s)))
    echo "== python bench/gpt_addition.py --mixed-precision $precision" >>"$out/speed.log"
    timeout -k 5 $((limit < 90 ? limit : 90)) "$python" "$root/bench/gpt_addition.py" \
      --device cuda --mixed-precision "$precision" --batch-size 128 --max-steps "$steps" \
      --eval-every "$steps" >>"$out/speed.log" 2>&1
    echo "exit $?" >>"$out/speed.log"
  done
  t3=$(date +%s)
  "$python" "$root/scripts/gpu_kit_summary.py" --out "$out" --work "$work" \
    --times "build=$((t1 - t0)),checks=$((t2 - t1)),gpt2=$((t2b - t2)),speed=$((t3 - t2b)),total=$((t3 - t0))"
}

# `run` in a mount namespace where Debian's -dev packages tandem uses are
# hidden (their headers, CMake files and libraries replaced by empty mounts),
# as on the GPU machine: shows that `run` needs nothing but the kit. Needs
# root (unshare -m). TANDEM_PYTHON should name a Python with a CUDA build of
# torch; without a GPU the checks skip and say why.
dry_run() {
  [[ $(id -u) -eq 0 ]] || die "dry-run needs root (unshare -m and bind mounts)"
  local list=/tmp/gpu_kit_hidden.txt p f
  : >"$list"
  for p in "${packages[@]}" libgmock-dev googletest libbenchmark-dev libfmt-dev; do
    dpkg-query -W "$p" >/dev/null 2>&1 || continue
    while IFS= read -r f; do
      # A package's own folder under include/ or cmake/ becomes an empty
      # tmpfs; its libraries become /dev/null.
      if [[ -d $f && ! -L $f ]]; then
        case $f in
          /usr/include/*/* | /usr/lib/*/cmake/*/* | /usr/share/cmake/*/*) ;;
          /usr/include/* | /usr/lib/*/cmake/* | /usr/share/cmake/*) echo "dir $f" >>"$list" ;;
        esac
      elif [[ $f == /usr/lib/*/lib* && $f != */*/*/*/*/* ]]; then
        echo "file $f" >>"$list"
      fi
    done < <(dpkg -L "$p")
  done
  sort -u -o "$list" "$list"
  echo "gpu_kit: dry run, hiding $(wc -l <"$list") folders and libraries of Debian's -dev packages"
  unshare -m bash -c '
    set -e
    while read -r kind f; do
      if [[ $kind == dir ]]; then mount -t tmpfs none "$f"; else mount --bind /dev/null "$f"; fi
    done < /tmp/gpu_kit_hidden.txt
    for h in yaml-cpp/yaml.h nlohmann/json.hpp CLI/CLI.hpp gtest/gtest.h gloo/rendezvous/store.h; do
      if [[ -e /usr/include/$h ]]; then echo "gpu_kit: /usr/include/$h is still visible" >&2; exit 1; fi
    done
    echo "gpu_kit: /usr/include/{yaml-cpp,nlohmann,CLI,gtest,gloo} and their CMake files and libraries are hidden"
    exec "$0" run "$1"' "$root/scripts/gpu_kit.sh" "$kit"
}

case $verb in
  prepare) prepare ;;
  run) run ;;
  dry-run) dry_run ;;
  *) echo "usage: scripts/gpu_kit.sh prepare|run|dry-run [KIT_DIR]" >&2; exit 2 ;;
esac
