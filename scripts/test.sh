#!/usr/bin/env bash
# Installs what is missing, builds kvtier and runs the whole test suite (unit, integration, fault).
# Usage: scripts/test.sh [ctest arguments...], e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
start=$(date +%s)
scripts/build.sh
echo "test.sh: build took $(( $(date +%s) - start )) s"
start=$(date +%s)
ctest --test-dir "${KVTIER_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
echo "test.sh: tests took $(( $(date +%s) - start )) s"
