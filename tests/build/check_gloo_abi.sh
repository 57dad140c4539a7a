#!/usr/bin/env bash
# Gloo's headers come from Debian's libgloo-dev, not from the Gloo built into
# libtorch_cpu (docs/architecture.md, "Gloo headers"). That is sound only
# while tandem's own code holds no Gloo layout: this checks, on the built
# library, that
#   1. libtandem defines no code or data of Gloo's classes, of GlooStore or of
#      ProcessGroupGloo (no vtable, typeinfo or inline member emitted here:
#      every such object is built inside libtorch_cpu, with its own headers);
#   2. every Gloo-related function libtandem calls is exported by the
#      libtorch_cpu it loads, under the same mangled name (the signatures seen
#      through Debian's headers match LibTorch's).
#   check_gloo_abi.sh <libtandem.so>
set -euo pipefail
lib=$1
torch_cpu=$(ldd "$lib" | awk '/libtorch_cpu\.so/ {print $3}')
[[ -f $torch_cpu ]] || { echo "FAIL: $lib does not load libtorch_cpu.so" >&2; exit 1; }

defined=$(nm -C --defined-only "$lib" |
  grep -E " (vtable for |typeinfo for |typeinfo name for |VTT for )?(c10d::ProcessGroupGloo::|gloo::)" || true)
if [[ -n $defined ]]; then
  echo "FAIL: libtandem defines Gloo code or data (its layout would come from Debian's headers):" >&2
  echo "$defined" >&2
  exit 1
fi

calls=$(nm -D --undefined-only "$lib" | awk '{print $2}' | grep -iE "gloo" || true)
[[ -n $calls ]] || { echo "FAIL: libtandem calls nothing of ProcessGroupGloo; is Gloo built in?" >&2; exit 1; }
exported=$(nm -D --defined-only "$torch_cpu" | awk '{print $3}')
missing=$(comm -23 <(sort -u <<< "$calls") <(sort -u <<< "$exported"))
if [[ -n $missing ]]; then
  echo "FAIL: libtorch_cpu ($torch_cpu) does not export these Gloo symbols libtandem calls:" >&2
  c++filt <<< "$missing" >&2
  exit 1
fi
echo "ok: libtandem defines no Gloo code; its $(wc -l <<< "$calls") Gloo calls all resolve in $torch_cpu:"
c++filt <<< "$calls" | sed 's/^/  /'
