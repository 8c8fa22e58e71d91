#!/usr/bin/env bash
# Configures and builds kvtier into build/ (Ninja, RelWithDebInfo). Extra arguments go to cmake.
# Usage: scripts/build.sh [-DKVTIER_WITH_CUDA=OFF ...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KVTIER_BUILD_DIR:-build}
JOBS=${KVTIER_JOBS:-2}
if [[ ! -f "$BUILD_DIR/build.ninja" || $# -gt 0 ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
