#!/usr/bin/env bash
# Runs issue 43's preemption and scancel tests under the namespace Slurm
# (tests/slurm/: USR1 and SIGTERM at a random step, requeue and resume, at
# DDP, ZeRO-2 and ZeRO-3; scancel of srun tasks and of launchers) N times in
# a row, and says how many rounds passed. Needs root, slurm-wlm and munge,
# as the `slurm` ctest label does.
#   scripts/stress_slurm.sh N [build_dir=build]
set -uo pipefail

rounds=${1:?usage: scripts/stress_slurm.sh N [build_dir]}
build=${2:-build}
binary="$build/bin/tandem_slurm_tests"
[[ -x "$binary" ]] || { echo "stress: no $binary; build first (see README)" >&2; exit 2; }

tests='SlurmPreemption.*:SlurmCleanup.*'
logs=$(mktemp -d /tmp/tandem_slurm_XXXXXX)
passed=0
start=$(date +%s)
for ((round = 1; round <= rounds; round++)); do
  round_start=$(date +%s)
  if "$binary" --gtest_filter="$tests" --gtest_shuffle >"$logs/round$round.log" 2>&1 &&
     ! grep -q 'skipped:' "$logs/round$round.log"; then
    passed=$((passed + 1))
    verdict=passed
  else
    verdict="FAILED or skipped (log: $logs/round$round.log)"
    grep -E '^\[  FAILED  \]|skipped:' "$logs/round$round.log" | sort -u >&2
  fi
  tests_ok=$(grep -c '^\[       OK \]' "$logs/round$round.log")
  echo "round $round: $verdict, $tests_ok tests ok, $(($(date +%s) - round_start)) s"
done
echo "stress: $passed of $rounds rounds passed in $(($(date +%s) - start)) s (logs: $logs)"
((passed == rounds))
