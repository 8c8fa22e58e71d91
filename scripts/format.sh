#!/usr/bin/env bash
# Formats kvtier's C and C++ sources with clang-format (.clang-format at the root).
# Usage: scripts/format.sh          rewrite every tracked source in place
#        scripts/format.sh --check  list the files that are not formatted and exit 1 if any (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.c' '*.cu' '*.cuh')
if [[ ${1:-} == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then bad+=("$f"); fi
  done
  if ((${#bad[@]} > 0)); then
    printf 'format: not formatted (run scripts/format.sh): %s\n' "${bad[@]}"
    exit 1
  fi
  echo "format: ${#files[@]} files formatted"
else
  clang-format -i "${files[@]}"
fi
