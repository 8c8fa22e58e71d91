#!/usr/bin/env bash
# Builds and runs the test suites under sanitizers:
#   asan: every unit and integration suite with AddressSanitizer + UndefinedBehaviorSanitizer (not the
#         fault suite, whose deadlines and pacing assume an uninstrumented build);
#   tsan: the core suites (fingerprints, ring, index, allocator, eviction, leases, tiers) under
#         ThreadSanitizer, without gRPC (Debian's abseil and gRPC are not instrumented). No suppressions.
# Usage: scripts/sanitizers.sh [asan|tsan]...   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${KVTIER_JOBS:-2}
stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(asan tsan)
for stage in "${stages[@]}"; do
  start=$(date +%s)
  case "$stage" in
    asan)
      cmake --preset asan >/dev/null
      cmake --build build-asan -j "$JOBS"
      ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp \
        ctest --test-dir build-asan --output-on-failure -j 2 -E '^python_' -LE fault
      ;;
    tsan)
      cmake --preset tsan >/dev/null
      cmake --build build-tsan -j "$JOBS" --target kvtier_common_unit_test kvtier_server_unit_test
      export KVTIER_SOURCE_DIR=$PWD  # tests that read tests/data find it whatever __FILE__ says
      TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp build-tsan/tests/kvtier_common_unit_test
      TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/sanitizers/tsan.supp build-tsan/tests/kvtier_server_unit_test
      ;;
    *) echo "sanitizers.sh: unknown stage $stage" >&2; exit 2 ;;
  esac
  echo "sanitizers.sh: $stage took $(( $(date +%s) - start )) s"
done
