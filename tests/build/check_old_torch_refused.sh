#!/usr/bin/env bash
# Configuring tandem against a LibTorch older than 2.11 must stop with a
# message that names the version found and says how to get a supported one.
# The "LibTorch" here is a stand-in package that only reports version
# 2.10.0, the release just below the floor.
#   check_old_torch_refused.sh SOURCE_DIR SCRATCH_DIR
set -euo pipefail
src=$1
scratch=$2
rm -rf "$scratch"
mkdir -p "$scratch/torch"
cat > "$scratch/torch/TorchConfig.cmake" <<'CMAKE'
set(TORCH_FOUND TRUE)
set(TORCH_LIBRARIES torch)
set(TORCH_INCLUDE_DIRS "${CMAKE_CURRENT_LIST_DIR}/include")
CMAKE
cat > "$scratch/torch/TorchConfigVersion.cmake" <<'CMAKE'
set(PACKAGE_VERSION "2.10.0")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
CMAKE
if cmake -S "$src" -B "$scratch/build" -DTorch_DIR="$scratch/torch" -DTANDEM_BUILD_TESTS=OFF \
     -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_EXAMPLES=OFF > "$scratch/configure.log" 2>&1; then
  echo "FAIL: configure accepted LibTorch 2.10.0" >&2
  exit 1
fi
for expected in "LibTorch 2.10.0" "is too old" "needs 2.11 or newer" "scripts/setup.sh"; do
  # CMake wraps the message; compare with whitespace squeezed.
  if ! tr -s ' \n' ' ' < "$scratch/configure.log" | grep -qF "$expected"; then
    echo "FAIL: the configure error does not say '$expected':" >&2
    cat "$scratch/configure.log" >&2
    exit 1
  fi
done
echo "configure refused LibTorch 2.10.0 with a clear message"
