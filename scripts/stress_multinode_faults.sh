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

faults='HostfileFaults.*'
faults+=':HostfileJob.KillingTheHeadWithSigkillLeavesNoProcessOnAnyHost'
faults+=':HostfileJob.CtrlCOnTheHeadStopsEveryHost'
faults+=':MultiNode.ANodeWithTheWrongTokenIsRefusedWithTheFix'
faults+=':HostfileRestarts.LosingAHostResumesFromTheLastCheckpointOnTheOthers'
faults+=':HostfileRestarts.AHostThatComesBackRejoinsWithoutAFailure'
faults+=':ElasticNodes.*'

source "$(dirname "$0")/stress_rounds.sh"
stress_rounds "$binary" "$faults" "$rounds"
