#!/usr/bin/env bash
# Builds tandem's fuzz targets (fuzz/, clang + libFuzzer + ASan + UBSan) and
# runs each for a while over a copy of its seed corpus.
#   scripts/fuzz.sh [build_dir=build/fuzz] [seconds=20] [target...]
# Targets are the <name>s of fuzz/corpus/<name>/ (binary fuzz_<name>); all
# by default. With seconds=0 it only builds (ctest's Fuzz.Build fixture, so
# that the brief runs never build the same directory at once). Exits 1 when a target crashes (the input is kept under
# <build_dir>/crashes/<name>/), 77 when clang++ is missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build/fuzz}
seconds=${2:-20}
shift $(( $# < 2 ? $# : 2 ))

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found; install it with scripts/setup.sh (Debian package clang)" >&2
  exit 77
fi

config=(-S "$root/fuzz" -B "$build" -DCMAKE_CXX_COMPILER=clang++)
if command -v ninja >/dev/null; then config+=(-G Ninja); fi
if command -v ccache >/dev/null; then config+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# Configure when there is no build file yet, which also repairs a directory
# whose first configure failed (say, before libfmt-dev was there). Not every
# time: the brief runs start together, and concurrent configures collide.
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  cmake "${config[@]}" >/dev/null
fi
cmake --build "$build"
if [[ "$seconds" == 0 ]]; then exit 0; fi

targets=("$@")
if ((${#targets[@]} == 0)); then
  for dir in "$root"/fuzz/corpus/*/; do targets+=("$(basename "$dir")"); done
fi

status=0
for name in "${targets[@]}"; do
  binary="$build/fuzz_$name"
  [[ -x "$binary" ]] || { echo "fuzz: no binary $binary for target '$name'" >&2; exit 2; }
  corpus="$build/corpus/$name"    # grows; the committed seeds stay as they are
  crashes="$build/crashes/$name"
  mkdir -p "$corpus" "$crashes"
  cp -n "$root/fuzz/corpus/$name/"* "$corpus/" 2>/dev/null || true
  args=(-max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$crashes/"
        -timeout=10 -rss_limit_mb=2048)
  dict="$root/fuzz/dicts/$name.dict"
  if [[ -f "$dict" ]]; then args+=(-dict="$dict"); fi
  echo "fuzz: $name for ${seconds}s"
  log="$build/$name.log"
  if "$binary" "${args[@]}" "$corpus" >"$log" 2>&1; then
    grep -E "DONE|stat::(number_of_executed_units|average_exec_per_sec|new_units_added)" "$log" || true
  else
    status=1
    tail -n 60 "$log" >&2
    echo "fuzz: $name CRASHED; reproduce with: $binary $crashes/<crash-file>" >&2
  fi
done
exit $status
