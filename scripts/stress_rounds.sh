# Sourced by the stress scripts: runs a gtest binary's filtered tests N
# rounds in a row, one log per round, and says how many rounds passed.
#   stress_rounds BINARY FILTER ROUNDS [GTEST_ARGS...]
# A round fails when a test fails or, with STRESS_NO_SKIPS=1, is skipped.
stress_rounds() {
  local binary=$1 filter=$2 rounds=$3
  shift 3
  [[ -x "$binary" ]] || { echo "stress: no $binary; build first (see README)" >&2; return 2; }
  local logs passed=0 start round round_start verdict log
  logs=$(mktemp -d /tmp/tandem_stress_XXXXXX)
  start=$(date +%s)
  for ((round = 1; round <= rounds; round++)); do
    round_start=$(date +%s)
    log="$logs/round$round.log"
    if "$binary" --gtest_filter="$filter" "$@" >"$log" 2>&1 &&
       ! { [[ ${STRESS_NO_SKIPS:-0} == 1 ]] && grep -q 'skipped:' "$log"; }; then
      passed=$((passed + 1))
      verdict=passed
    else
      verdict="FAILED (log: $log)"
      grep -E '^\[  FAILED  \]|skipped:' "$log" | sort -u >&2
    fi
    echo "round $round: $verdict, $(grep -c '^\[       OK \]' "$log") tests ok, $(($(date +%s) - round_start)) s"
  done
  echo "stress: $passed of $rounds rounds passed in $(($(date +%s) - start)) s (logs: $logs)"
  ((passed == rounds))
}
