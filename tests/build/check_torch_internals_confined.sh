#!/usr/bin/env bash
# LibTorch's internals (storages, autograd-internal hooks, version counters,
# the CPU allocator) may be touched only in src/core/torch_internals.{h,cpp}
# and src/core/torch_compat.h (docs/architecture.md, "LibTorch internals").
# Fails listing file:line of every other use in src/, tools/ and include/.
#   check_torch_internals_confined.sh SOURCE_DIR
#   check_torch_internals_confined.sh --self-test SCRATCH_DIR   (the check can fail)
set -euo pipefail

tokens='StorageImpl|set_data_ptr|unsafeGetStorageImpl|grad_accumulator|add_post_hook|add_pre_hook'
tokens+='|del_post_hook|bump_version|\.set_data\(|\.set_\(|SetCPUAllocator|c10::Allocator'
tokens+='|at::Allocator|FunctionPostHook|FunctionPreHook'

allowed=(
  src/core/torch_internals.h
  src/core/torch_internals.cpp
  src/core/torch_compat.h
  src/core/torch_compat_autograd.h
)

allowed_line() {
  local line=$1 path
  for path in "${allowed[@]}"; do
    # A folder allows what lies under it, a file only itself.
    if [[ $path == */ && $line == "$path"* ]] || [[ $line == "$path:"* ]]; then return 0; fi
  done
  return 1
}

check() {
  local root=$1 line found=0
  while IFS= read -r line; do
    [[ -z $line ]] && continue
    allowed_line "$line" && continue
    if ((found == 0)); then
      echo "LibTorch internals used outside src/core/torch_internals.{h,cpp}:" >&2
    fi
    echo "$line" >&2
    found=1
  done < <(cd "$root" && grep -rnE --include='*.h' --include='*.hpp' --include='*.cpp' \
             --include='*.cc' --include='*.cu' --include='*.cuh' "$tokens" src tools include \
             2>/dev/null)
  if ((found)); then
    echo "Call (or add) a function in src/core/torch_internals.h instead, with a comment" \
         "saying why the use is safe." >&2
    return 1
  fi
}

if [[ ${1:-} == --self-test ]]; then
  scratch=$2
  rm -rf "$scratch"
  mkdir -p "$scratch/src/zero" "$scratch/src/core" "$scratch/tools" "$scratch/include"
  printf 'void f(at::Tensor& p, const at::Tensor& v) {\n  p.set_data(v);\n}\n' \
    > "$scratch/src/zero/planted.cpp"
  printf 'struct A : c10::Allocator {};\n' > "$scratch/tools/planted.h"
  printf 'void g() { t.unsafeGetStorageImpl()->reset(); }\n' \
    > "$scratch/src/core/torch_internals.cpp"
  if out=$(check "$scratch" 2>&1); then
    echo "FAIL: planted uses were not reported" >&2
    exit 1
  fi
  for expected in "src/zero/planted.cpp:2:" "tools/planted.h:1:"; do
    if ! grep -qF "$expected" <<<"$out"; then
      echo "FAIL: no '$expected' in:" >&2
      echo "$out" >&2
      exit 1
    fi
  done
  if grep -qF torch_internals.cpp <<<"$out"; then
    echo "FAIL: torch_internals.cpp reported:" >&2
    echo "$out" >&2
    exit 1
  fi
  rm "$scratch/src/zero/planted.cpp" "$scratch/tools/planted.h"
  check "$scratch" || { echo "FAIL: a clean tree was reported" >&2; exit 1; }
  echo "ok"
  exit 0
fi

check "$1"
