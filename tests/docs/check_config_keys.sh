#!/usr/bin/env bash
# docs/config.md's key index ("## Key index") must name exactly the keys the
# config readers accept, with the same disposition (implemented, warn, refuse).
#   check_config_keys.sh LISTER ROOT
#   check_config_keys.sh --self-test LISTER ROOT SCRATCH   (the check can fail)
# LISTER prints the readers' keys as FORMAT<TAB>KEY<TAB>DISPOSITION lines
# (tests/docs/print_config_keys.cpp, from src/config/key_index.h); ROOT is the
# source tree. The key index marks keys so: under a `###` heading that names
# its formats in backticks (`deepspeed_json`, `tandem_yaml`,
# `accelerate_yaml`), tables with the columns level | implemented | warn | refuse;
# the level cell's first backticked word is the level's dotted path (none:
# the top level), and every backticked word in the other cells is a key at
# that level. The check also fails when a reader in src/config passes
# for_each_key() a table that src/config/key_index.cpp does not list, since
# LISTER would then miss that table's keys.
set -euo pipefail

# The key index of a config.md as FORMAT<TAB>KEY<TAB>DISPOSITION lines.
documented_keys() {
  awk -F'|' '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    # The backticked words of s, into words[1..n]; returns n.
    function backticked(s, words,   n) {
      n = 0
      while (match(s, /`[^`]+`/)) {
        words[++n] = substr(s, RSTART + 1, RLENGTH - 2)
        s = substr(s, RSTART + RLENGTH)
      }
      return n
    }
    function fail(what) { printf "%s:%d: %s\n", FILENAME, FNR, what > "/dev/stderr"; bad = 1 }
    /^## / { in_index = ($0 == "## Key index"); seen = seen || in_index; next }
    !in_index { next }
    /^### / {
      nformats = 0; ncols = 0
      n = backticked($0, words)
      for (i = 1; i <= n; i++) {
        if (words[i] ~ /^(deepspeed_json|tandem_yaml|accelerate_yaml)$/) formats[++nformats] = words[i]
      }
      if (nformats == 0) fail("this heading names no format (`deepspeed_json`, `tandem_yaml`, `accelerate_yaml`)")
      next
    }
    /^\|/ {
      if ($2 ~ /^[ \t]*-+[ \t]*$/) next
      if (trim($2) == "level") {
        ncols = NF - 1
        for (i = 3; i < NF; i++) {
          column[i] = trim($i)
          if (column[i] !~ /^(implemented|warn|refuse)$/) fail("unknown column \"" column[i] "\"; the columns are level, implemented, warn and refuse")
        }
        next
      }
      if (ncols == 0 || nformats == 0) { fail("a table row outside a key table"); next }
      level = backticked($2, words) ? words[1] "." : ""
      for (i = 3; i < NF; i++) {
        n = backticked($i, words)
        for (k = 1; k <= n; k++) {
          for (f = 1; f <= nformats; f++) printf "%s\t%s%s\t%s\n", formats[f], level, words[k], column[i]
        }
      }
    }
    END {
      if (!seen) { print FILENAME ": no \"## Key index\" section" > "/dev/stderr"; bad = 1 }
      exit bad
    }
  ' "$1"
}

# The tables the readers pass to for_each_key() that key_index.cpp does not list.
unlisted_tables() {
  local root=$1 call table
  while IFS= read -r call; do
    table=$(sed -E 's/^for_each_key\([^,]*, *//; s/,$//' <<<"$call")
    if [[ $table != *"("* ]]; then
      echo "  $call: pass one of src/config/readers.h's key tables, not a local one"
    elif ! grep -qw -- "${table%%(*}" "$root/src/config/key_index.cpp"; then
      echo "  $call: ${table%%(*} is not in src/config/key_index.cpp's key_levels()"
    fi
  done < <(grep -ohE 'for_each_key\([A-Za-z_][A-Za-z0-9_]*, *[^,]+(,|$)' "$root"/src/config/*.cpp | sort -u)
}

check() {
  local lister=$1 root=$2 listed documented failed=0
  listed=$("$lister" | sort -u)
  documented=$(documented_keys "$root/docs/config.md" | sort -u) || failed=1
  [[ -n $listed ]] || { echo "$lister printed no keys" >&2; return 1; }
  [[ -n $documented ]] || { echo "docs/config.md's key index names no keys" >&2; return 1; }

  local undocumented unknown tables
  undocumented=$(comm -23 <(echo "$listed") <(echo "$documented"))
  unknown=$(comm -13 <(echo "$listed") <(echo "$documented"))
  tables=$(unlisted_tables "$root")
  if [[ -n $undocumented ]]; then
    echo "The readers accept these keys (format, key, disposition), but docs/config.md's key index" \
         "does not name them so; add each with what tandem does with it:" >&2
    sed 's/^/  /' <<<"$undocumented" >&2
    failed=1
  fi
  if [[ -n $unknown ]]; then
    echo "docs/config.md's key index names these keys (format, key, disposition), but no reader" \
         "accepts them so; remove them or fix the format, path or column:" >&2
    sed 's/^/  /' <<<"$unknown" >&2
    failed=1
  fi
  if [[ -n $tables ]]; then
    echo "Key tables the check cannot see:" >&2
    echo "$tables" >&2
    failed=1
  fi
  ((failed == 0)) || return 1
  echo "docs/config.md's key index names the $(wc -l <<<"$listed") keys the readers accept" \
       "(per format), and no other"
}

if [[ ${1:-} == --self-test ]]; then
  lister=$2 root=$3 scratch=$4
  rm -rf "$scratch" && mkdir -p "$scratch/docs" "$scratch/src/config"
  cp "$root/docs/config.md" "$scratch/docs/"
  cp "$root"/src/config/*.cpp "$scratch/src/config/"
  # expect_failure NAME PLANTED LISTER ROOT: the check must fail and name PLANTED.
  expect_failure() {
    local out
    if out=$(check "$3" "$4" 2>&1); then
      echo "self-test: the check passed with $1" >&2
      return 1
    fi
    if ! grep -q -- "$2" <<<"$out"; then
      echo "self-test: the check failed with $1, but did not name $2:" >&2
      echo "$out" >&2
      return 1
    fi
    echo "with $1, the check fails:"
    sed 's/^/  | /' <<<"$out"
  }
  echo "unchanged copies:"
  check "$lister" "$scratch" | sed 's/^/  | /'

  # A key only docs/config.md names: a new first row of the first key table.
  cp "$root/docs/config.md" "$scratch/docs/config.md.orig"
  awk '/^## /{s = ($0 == "## Key index")} {print} s && !done && /^\|[ -]*-\|/ {
         print "| `zero_optimization` | `planted_doc_only_key` | | |"; done = 1 }' \
    "$scratch/docs/config.md.orig" >"$scratch/docs/config.md"
  expect_failure "a key planted in docs/config.md only" planted_doc_only_key "$lister" "$scratch"
  cp "$scratch/docs/config.md.orig" "$scratch/docs/config.md"

  # A key only the readers accept: the lister's output plus one line.
  printf '#!/usr/bin/env bash\n"%s" && printf "deepspeed_json\\tzero_optimization.%s\\timplemented\\n"\n' \
    "$lister" planted_parser_only_key >"$scratch/lister.sh"
  chmod +x "$scratch/lister.sh"
  expect_failure "a key planted in the readers only" planted_parser_only_key "$scratch/lister.sh" \
    "$scratch"

  # A reader with a table key_index.cpp does not list.
  echo 'void planted(const Value& v) { for_each_key(v, planted_keys(), visit); }' \
    >>"$scratch/src/config/tandem_yaml.cpp"
  expect_failure "a key table planted in a reader" planted_keys "$lister" "$scratch"
  echo "self-test passed: the check fails when a key is on one side only"
  exit 0
fi

check "$1" "$2"
