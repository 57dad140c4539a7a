#!/usr/bin/env bash
# No tandem binary may call std::filesystem's operations (remove_all,
# create_directories, status, ...): LibTorch 2.11's CUDA libtorch.so exports
# its own copy of exactly these, which then wins over libstdc++'s and crashed
# (include/tandem/core/file_system.h, docs/architecture.md "LibTorch
# versions"). tandem::fs replaces them; std::filesystem::path stays allowed.
# Fails listing binary: symbol for every undefined reference to one.
#   check_no_std_filesystem_ops.sh BINARY_OR_DIR...
#   check_no_std_filesystem_ops.sh --self-test SCRATCH_DIR   (the check can fail)
set -euo pipefail

# The operations LibTorch 2.11.0+cu130's libtorch.so defines (nm -D
# --defined-only libtorch.so | c++filt | grep filesystem), as mangled names:
# _ZNSt10filesystem<length><name>, optionally with the [abi:cxx11] tag.
ops='absolute|canonical|copy|copy_file|copy_symlink|create_directories|create_directory'
ops+='|create_directory_symlink|create_hard_link|create_symlink|current_path|equivalent'
ops+='|file_size|hard_link_count|is_empty|last_write_time|permissions|proximate|read_symlink'
ops+='|relative|remove|remove_all|rename|resize_file|space|status|symlink_status'
ops+='|temp_directory_path|weakly_canonical'
pattern="^_ZNSt10filesystem[0-9]+($ops)(B5cxx11)?E"

binaries() {
  local arg file
  for arg in "$@"; do
    if [[ -d $arg ]]; then
      find "$arg" -maxdepth 1 -type f \( -perm -u+x -o -name '*.so*' \) | sort
    else
      echo "$arg"
    fi
  done
}

check() {
  local found=0 file symbol checked=0
  while IFS= read -r file; do
    # Skip scripts and anything else that is not ELF.
    [[ $(head -c 4 "$file" | od -An -c | tr -d ' ') == 177ELF ]] || continue
    checked=$((checked + 1))
    while IFS= read -r symbol; do
      [[ -z $symbol ]] && continue
      if ((found == 0)); then
        echo "std::filesystem operations referenced (use tandem::fs instead):" >&2
      fi
      echo "  $file: $(c++filt "$symbol")" >&2
      found=1
    done < <(nm -D --undefined-only "$file" 2>/dev/null | awk '{print $NF}' | sed 's/@.*//' |
             grep -E "$pattern" || true)
  done < <(binaries "$@")
  ((found == 0)) || return 1
  ((checked > 0)) || { echo "no ELF binaries found in: $*" >&2; return 1; }
  echo "$checked binaries reference no std::filesystem operation"
}

if [[ ${1:-} == --self-test ]]; then
  scratch=$2
  rm -rf "$scratch" && mkdir -p "$scratch"
  printf '#include <filesystem>\nint main(int c, char** v) { std::filesystem::remove_all(v[0]);'`
        `' return std::filesystem::exists(v[0]) ? c : 0; }\n' > "$scratch/planted.cpp"
  printf '#include <filesystem>\nint main(int, char** v) {'`
        `' return std::filesystem::path(v[0]).filename().empty(); }\n' > "$scratch/clean.cpp"
  c++ -std=c++17 -o "$scratch/planted" "$scratch/planted.cpp"
  c++ -std=c++17 -o "$scratch/clean" "$scratch/clean.cpp"
  if out=$(check "$scratch/planted" 2>&1); then
    echo "FAIL: the planted remove_all/exists were not reported" >&2
    exit 1
  fi
  for expected in "std::filesystem::remove_all" "std::filesystem::status"; do
    grep -qF "$expected" <<<"$out" || { echo "FAIL: '$expected' not named in: $out" >&2; exit 1; }
  done
  check "$scratch/clean" || { echo "FAIL: path members alone were reported" >&2; exit 1; }
  echo "self-test: planted operations reported, path members allowed"
  exit 0
fi
check "$@"
