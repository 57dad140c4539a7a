#!/usr/bin/env bash
# Runs the whole suite N times in a row to shake out flaky tests.
#   scripts/stress_tests.sh N [build_dir=build]
# Each round runs every in-process test binary (ranks as threads, pure logic;
# tandem_unit_tests one area at a time) with --gtest_shuffle and a fresh
# random seed, two at a time so the box is as loaded as under `ctest -j2`,
# then the process-level ctest labels (cli, e2e, faults, multinode, docs,
# fuzz) in a random order with -j2. Every failure is printed with the
# command that reproduces it (binary, filter, seed). Exits 1 if any round
# failed, 0 when all N rounds passed.
set -uo pipefail

rounds=${1:?usage: scripts/stress_tests.sh N [build_dir]}
build=${2:-build}
bin="$build/bin"
[[ -d "$bin" ]] || { echo "stress: no $bin; build first (see README)" >&2; exit 2; }

# Jobs: each in-process binary, and tandem_unit_tests once per area
# (--area=NAME), so that two jobs at a time keep both cores busy.
jobs=()
for b in "$bin"/tandem_*_tests; do
  case "$(basename "$b")" in
    tandem_cli_tests | tandem_e2e_tests | tandem_faults_tests | tandem_multinode_tests) ;;  # process-level: ctest below
    tandem_unit_tests)
      for dir in "$(dirname "$0")"/../tests/*/; do
        area=$(basename "$dir")
        if "$b" --area="$area" --gtest_list_tests >/dev/null 2>&1; then jobs+=("$b --area=$area"); fi
      done ;;
    *) jobs+=("$b") ;;
  esac
done
((${#jobs[@]})) || { echo "stress: no test binaries in $bin" >&2; exit 2; }

logs=$(mktemp -d /tmp/tandem_stress_XXXXXX)
failures=0
start=$(date +%s)

# run_binary ROUND "BINARY [ARGS]": one shuffled run; on failure prints the
# failed tests and the command that repeats the same order.
run_binary() {
  local round=$1 binary=$2 seed=$((RANDOM % 99999 + 1))
  local log="$logs/$(basename "${binary// /_}").round$round.log"
  # shellcheck disable=SC2086  # BINARY [ARGS] splits on purpose
  if $binary --gtest_shuffle --gtest_random_seed="$seed" --gtest_color=no >"$log" 2>&1; then
    rm -f "$log"
    return 0
  fi
  echo "FAIL round $round: $binary (seed $seed)"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sort -u | sed 's/^/    /'
  echo "    repeat: $binary --gtest_shuffle --gtest_random_seed=$seed"
  echo "    log: $log"
  return 1
}
export -f run_binary
export logs

for ((round = 1; round <= rounds; ++round)); do
  round_start=$(date +%s)
  round_failed=0
  printf '%s\n' "${jobs[@]}" |
    xargs -P 2 -I{} bash -c 'run_binary "$0" "$1"' "$round" {} || round_failed=1
  if ! ctest --test-dir "$build" -L 'cli|e2e|faults|multinode|docs|fuzz' -j2 --schedule-random \
       --output-on-failure >"$logs/ctest.round$round.log" 2>&1; then
    round_failed=1
    echo "FAIL round $round: ctest -L 'cli|e2e|faults|multinode|docs|fuzz'"
    grep -E '\(Failed\)|\(Timeout\)|\*\*\*' "$logs/ctest.round$round.log" | sed 's/^/    /'
    echo "    log: $logs/ctest.round$round.log"
  fi
  failures=$((failures + round_failed))
  echo "round $round/$rounds: $([[ $round_failed == 0 ]] && echo passed || echo FAILED)" \
       "in $(($(date +%s) - round_start)) s"
done

echo "stress: $((rounds - failures)) of $rounds rounds passed in $(($(date +%s) - start)) s" \
     "(logs of failures in $logs)"
((failures == 0))
