#!/usr/bin/env bash
# Runs issue 31's multi-host fault tests (item 5: a host killed, a link down,
# a slow lossy link, the head SIGKILLed, a wrong store token, a host that
# comes back; for --hostfile jobs and for c10d nodes) N times in a row on the
# namespace cluster, and says how many rounds passed. Needs root (network
# namespaces), as the `multinode` ctest label does.
#   scripts/stress_multinode_faults.sh N [build_dir=build]
set -uo pipefail

rounds=${1:?usage: scripts/stress_multinode_faults.sh N [build_dir]}
build=${2:-build}
binary="$build/bin/tandem_multinode_tests"
[[ -x "$binary" ]] || { echo "stress: no $binary; build first (see README)" >&2; exit 2; }

faults='HostfileFaults.*'
faults+=':HostfileJob.KillingTheHeadWithSigkillLeavesNoProcessOnAnyHost'
faults+=':HostfileJob.CtrlCOnTheHeadStopsEveryHost'
faults+=':MultiNode.ANodeWithTheWrongTokenIsRefusedWithTheFix'
faults+=':HostfileRestarts.LosingAHostResumesFromTheLastCheckpointOnTheOthers'
faults+=':HostfileRestarts.AHostThatComesBackRejoinsWithoutAFailure'
faults+=':ElasticNodes.*'

logs=$(mktemp -d /tmp/tandem_faults_XXXXXX)
passed=0
start=$(date +%s)
for ((round = 1; round <= rounds; round++)); do
  round_start=$(date +%s)
  if "$binary" --gtest_filter="$faults" >"$logs/round$round.log" 2>&1; then
    passed=$((passed + 1))
    verdict=passed
  else
    verdict="FAILED (log: $logs/round$round.log)"
    grep -E '^\[  FAILED  \]' "$logs/round$round.log" | sort -u >&2
  fi
  tests=$(grep -c '^\[       OK \]' "$logs/round$round.log")
  echo "round $round: $verdict, $tests tests ok, $(($(date +%s) - round_start)) s"
done
echo "stress: $passed of $rounds rounds passed in $(($(date +%s) - start)) s (logs: $logs)"
((passed == rounds))
