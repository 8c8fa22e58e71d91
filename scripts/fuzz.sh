#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (preset "fuzz") and runs each for a bounded time on its
# checked-in corpus (tests/fuzz/corpus/<name>); new inputs go to a scratch copy, not the repo.
# Usage: scripts/fuzz.sh [seconds per target, default 60] [target...]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
shift || true
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=(config request disk_record)
if ! command -v clang++ >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi
cmake --preset fuzz >/dev/null
cmake --build build-fuzz -j "${KVTIER_JOBS:-2}" --target $(printf '%s_fuzzer ' "${targets[@]}")
for t in "${targets[@]}"; do
  work=$(mktemp -d /tmp/kvtier-fuzz-$t-XXXXXX)
  cp -r "tests/fuzz/corpus/$t/." "$work/"
  echo "fuzz.sh: $t for ${SECONDS_PER_TARGET}s"
  status=0
  build-fuzz/tests/fuzz/${t}_fuzzer "$work" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$work/" >"$work.log" 2>&1 || status=$?
  grep -E 'stat::number_of_executed_units|^Done|==ERROR|SUMMARY' "$work.log" || true
  if [[ $status -ne 0 ]]; then
    tail -50 "$work.log" >&2
    ls "$work"/crash-* "$work"/leak-* "$work"/timeout-* 2>/dev/null >&2 || true
  fi
  rm -f "$work.log"
  if [[ $status -ne 0 ]]; then echo "fuzz.sh: $t failed; inputs kept in $work" >&2; exit 1; fi
  rm -rf "$work"
done
