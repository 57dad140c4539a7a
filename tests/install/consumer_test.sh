#!/usr/bin/env bash
# Builds tests/install/consumer against tandem and runs it under `tandem
# launch` on 2 ranks and on 1, then checks that both trained to the same
# parameters (2 ranks x 16 samples = 1 rank x 32 per step).
#   consumer_test.sh install      <tandem build dir> <scratch dir>  # find_package(tandem) on `cmake --install`
#   consumer_test.sh subdirectory <tandem build dir> <scratch dir>  # add_subdirectory(<tandem source>)
set -euo pipefail
mode=$1 build=$(cd "$2" && pwd) work=$3
src=$(cd "$(dirname "$0")/../.." && pwd)
cmake=${CMAKE_COMMAND:-cmake}
rm -rf "$work" && mkdir -p "$work"
# Unoptimised and without debug info: these builds prove that the package and
# the source tree work in another project, not how fast the code runs, and
# the add_subdirectory one compiles the whole library and CLI again. At -O0
# and in one unity batch per target (TANDEM_UNITY_BATCH_SIZE=0: LibTorch's
# headers parsed once for the library, once for the CLI) that took 127 s of
# CPU with ccache off on 2026-11-28, against 189 s in batches of 32 on the
# same box; batches of 8 took 214 s and -O3 about 470 s on a slower one. The
# test runs beside others in CI, where CPU time, not the one long compile,
# is what counts.
build_type=(-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0)

# The consumer builds against the LibTorch the tandem build used, and for a
# CUDA LibTorch with the CUDA toolkit settings that build was given (LibTorch's
# CMake config looks for the toolkit again in every project).
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -1; }
cuda_args=()
for var in CUDA_TOOLKIT_ROOT_DIR CMAKE_CUDA_COMPILER CUDA_nvrtc_LIBRARY; do
  value=$(cache_value "$var")
  if [[ -n $value && $value != *NOTFOUND ]]; then cuda_args+=("-D$var=$value"); fi
done
python_args=()
if [[ -n $(cache_value TANDEM_PYTHON) ]]; then python_args+=("-DTANDEM_PYTHON=$(cache_value TANDEM_PYTHON)"); fi

case $mode in
  install)
    "$cmake" --install "$build" --prefix "$work/prefix" > "$work/install.log"
    for f in bin/tandem lib/libtandem.so include/tandem/tandem.h \
             lib/cmake/tandem/tandemConfig.cmake lib/cmake/tandem/tandemConfigVersion.cmake \
             lib/cmake/tandem/tandemTargets.cmake; do
      [[ -e $work/prefix/$f ]] || { echo "FAIL: the install has no $f" >&2; exit 1; }
    done
    # Nothing of the build tree leaks into the package (it must work once the build is gone).
    if grep -l "$build" "$work"/prefix/lib/cmake/tandem/*.cmake; then
      echo "FAIL: the CMake package names the build directory $build" >&2; exit 1
    fi
    "$cmake" -S "$src/tests/install/consumer" -B "$work/app" -G Ninja \
      -DCMAKE_PREFIX_PATH="$work/prefix" "${build_type[@]}" "${cuda_args[@]}" \
      > "$work/configure.log"
    launcher=$work/prefix/bin/tandem
    ;;
  subdirectory)
    "$cmake" -S "$src/tests/install/consumer" -B "$work/app" -G Ninja \
      -DTANDEM_SOURCE_DIR="$src" -DTANDEM_UNITY_BATCH_SIZE=0 "${build_type[@]}" \
      "${python_args[@]}" "${cuda_args[@]}" > "$work/configure.log"
    launcher=$work/app/bin/tandem
    ;;
  *) echo "usage: $0 install|subdirectory BUILD_DIR SCRATCH_DIR" >&2; exit 2 ;;
esac
"$cmake" --build "$work/app" > "$work/build.log" || { tail -40 "$work/build.log"; exit 1; }
app=$(find "$work/app" -maxdepth 2 -name app -type f -perm -u+x | head -1)

"$launcher" env --json > "$work/env.json"   # the installed CLI finds its libraries
two=$("$launcher" launch --nproc-per-node 2 --master-port 0 "$app" 16 | tail -1 | sed 's/^[^{]*//')
one=$("$launcher" launch --nproc-per-node 1 --master-port 0 "$app" 32 | tail -1 | sed 's/^[^{]*//')
echo "2 ranks: $two"  # the launcher's [rankN]: prefix stripped
echo "1 rank:  $one"
python3 - "$two" "$one" <<'PY'
import json, math, sys
two, one = (json.loads(a) for a in sys.argv[1:])
assert two["world_size"] == 2 and one["world_size"] == 1, (two, one)
for key in ("param_sum", "param_sumsq"):
    a, b = two[key], one[key]
    assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-5), f"{key}: 2 ranks {a} vs 1 rank {b}"
print("consumer: 2-rank and 1-rank training agree")
PY
