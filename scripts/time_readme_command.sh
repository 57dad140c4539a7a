#!/usr/bin/env bash
# Times README command N (1 or 2 of the quickstart) as a newcomer meets it:
# a fresh clone of this checkout in DIR, ccache off, each part of the command
# (setup, configure, build, then the demo or the tests) timed on its own.
#   scripts/time_readme_command.sh N DIR
# Logs: DIR.part<i>.log. docs/development.md records the figures.
n=$1 dir=$2
rm -rf "$dir" && git clone -q "$(cd "$(dirname "$0")/.." && pwd)" "$dir" && cd "$dir" || exit 1
export CCACHE_DISABLE=1
cmd=$(sed -n "/^# $n\. /{n;p;q}" README.md)
echo "command $n: $cmd"
mapfile -t parts < <(sed 's/ && /\n/g' <<<"$cmd")
t_all=$(date +%s); rc=0
for i in "${!parts[@]}"; do p=${parts[$i]}
  t0=$(date +%s)
  eval "$p" > "$dir.part$i.log" 2>&1 || { rc=$?; echo "FAILED ($rc): $p"; }
  echo "part $(($(date +%s) - t0)) s: $p"
  ((rc == 0)) || break
done
echo "command $n total $(($(date +%s) - t_all)) s, rc $rc"
