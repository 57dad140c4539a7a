#!/usr/bin/env bash
# Runs issue 43's preemption and scancel tests under the namespace Slurm
# (tests/slurm/: USR1 and SIGTERM at a random step, requeue and resume, at
# DDP, ZeRO-2 and ZeRO-3; scancel of srun tasks and of launchers; two steps
# of one job at once, and a time limit without a warning signal) N times in
# a row, and says how many rounds passed. Needs root, slurm-wlm and munge,
# as the `slurm` ctest label does.
#   scripts/stress_slurm.sh N [build_dir=build]
set -uo pipefail

rounds=${1:?usage: scripts/stress_slurm.sh N [build_dir]}
build=${2:-build}
source "$(dirname "$0")/stress_rounds.sh"
STRESS_NO_SKIPS=1 stress_rounds "$build/bin/tandem_slurm_tests" 'SlurmPreemption.*:SlurmCleanup.*:SlurmSteps.*' \
  "$rounds" --gtest_shuffle
