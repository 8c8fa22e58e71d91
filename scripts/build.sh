#!/usr/bin/env bash
# Configures and builds kvtier into build/ (Ninja, RelWithDebInfo). Extra arguments go to cmake.
# Usage: scripts/build.sh [-DKVTIER_WITH_CUDA=OFF ...]
# Environment: KVTIER_BUILD_DIR (default build), KVTIER_JOBS (default 2), KVTIER_BUILD_TARGETS (a
# space-separated list of targets to build instead of all, e.g. "kvtier-server kvtierctl").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${KVTIER_BUILD_DIR:-build}
JOBS=${KVTIER_JOBS:-2}
read -r -a TARGETS <<< "${KVTIER_BUILD_TARGETS:-}"
if [[ ! -f "$BUILD_DIR/build.ninja" || $# -gt 0 ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
fi
if ((${#TARGETS[@]} > 0)); then
  cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"
else
  cmake --build "$BUILD_DIR" -j "$JOBS"
fi
