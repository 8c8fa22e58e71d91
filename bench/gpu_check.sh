#!/usr/bin/env bash
# GPU check of kernels/: builds kernels/ STANDALONE (only the CUDA toolkit, CMake, a C++ compiler and
# GoogleTest sources are needed), runs the kernel tests (GPU tests included) and kernel_bench, and prints
# a summary. Meant for a GPU machine that has none of the project's Debian packages; finishes in well
# under 4 minutes on a 16-core machine.
#
#   bench/gpu_check.sh --prepare   # here (dev machine): copy /usr/src/googletest into
#                                  # kernels/third_party_cache/googletest (gitignored), to be carried
#   bench/gpu_check.sh             # on the GPU machine, from the repository root
#
# With the device tool: run(command="bench/gpu_check.sh", carry=["kernels/third_party_cache"],
# timeout_s=300). Logs go to $OUT (if set) as gpu_check_*.log.
# Environment: KVTIER_CUDA_ARCH (default 90), KVTIER_BUILD_DIR (default /tmp/kbuild),
# KVTIER_GTEST_SOURCE_DIR (default kernels/third_party_cache/googletest, else /usr/src/googletest),
# KVTIER_BENCH_ARGS (default: none; e.g. "--iters 50").
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=$ROOT/kernels/third_party_cache/googletest

if [[ "${1:-}" == "--prepare" ]]; then
  src=${KVTIER_GTEST_SOURCE_DIR:-/usr/src/googletest}
  [[ -f $src/CMakeLists.txt ]] || { echo "no GoogleTest sources at $src (apt-get install googletest)"; exit 1; }
  rm -rf "$CACHE" && mkdir -p "$(dirname "$CACHE")" && cp -a "$src" "$CACHE"
  echo "copied $src -> kernels/third_party_cache/googletest ($(du -sh "$CACHE" | cut -f1))"
  echo "now run on the GPU machine: bench/gpu_check.sh, carrying kernels/third_party_cache"
  echo "  (device tool: carry=[\"kernels/third_party_cache\"])"
  exit 0
fi

START=$(date +%s)
LOG_DIR=${OUT:-/tmp/kvtier_gpu_check}
mkdir -p "$LOG_DIR"
BUILD=${KVTIER_BUILD_DIR:-/tmp/kbuild}
ARCH=${KVTIER_CUDA_ARCH:-90}
GTEST=${KVTIER_GTEST_SOURCE_DIR:-}
if [[ -z $GTEST ]]; then
  if [[ -f $CACHE/CMakeLists.txt ]]; then GTEST=$CACHE; else GTEST=/usr/src/googletest; fi
fi
if [[ ! -f $GTEST/CMakeLists.txt ]]; then
  echo "gpu_check: no GoogleTest sources at $GTEST. Run 'bench/gpu_check.sh --prepare' on the dev machine"
  echo "and carry kernels/third_party_cache to this one."
  exit 2
fi
GEN=(-G Ninja)
command -v ninja >/dev/null || GEN=()
export PATH=$PATH:/usr/local/cuda/bin
JOBS=$(nproc 2>/dev/null || echo 4)

echo "== gpu_check: $(hostname), $(nproc) cores, arch sm_$ARCH, googletest from $GTEST"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
command -v nvcc >/dev/null && nvcc --version | tail -1
cmake --version | head -1

step() {  # step NAME TIMEOUT_S CMD...: runs CMD with a time limit, logs it, records the result
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" >"$LOG_DIR/gpu_check_$name.log" 2>&1
  local rc=$?
  RESULTS+=("$(printf '%-10s rc=%-3s %4ss' "$name" "$rc" "$(( $(date +%s) - t0 ))")")
  [[ $rc -eq 0 ]] || { echo "-- $name failed (rc $rc); last lines:"; tail -30 "$LOG_DIR/gpu_check_$name.log"; FAILED=1; }
  return $rc
}
RESULTS=()
FAILED=0

rm -rf "$BUILD"
step configure 120 cmake -S kernels -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DKVTIER_WITH_CUDA=ON -DKVTIER_GTEST_SOURCE_DIR="$GTEST" &&
step build 180 cmake --build "$BUILD" -j "$JOBS" &&
{ step test 120 bash -c "cd \"$BUILD\" && ctest --output-on-failure -j 4"; true; } &&
{ step bench_smoke 60 "$BUILD/kernel_bench/kernel_bench" --smoke; true; } &&
{ step bench 120 "$BUILD/kernel_bench/kernel_bench" ${KVTIER_BENCH_ARGS:-}; true; }

echo
echo "== gpu_check summary ($(( $(date +%s) - START )) s; logs in $LOG_DIR)"
printf '%s\n' "${RESULTS[@]}"
if [[ -f $LOG_DIR/gpu_check_test.log ]]; then
  grep -E "tests passed|tests failed" "$LOG_DIR/gpu_check_test.log"
  skipped=$(grep -c '\*\*\*Skipped' "$LOG_DIR/gpu_check_test.log")
  echo "skipped tests: $skipped (0 expected on a GPU machine)"
  if [[ $skipped -gt 0 ]] && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    echo "-- a GPU is present but tests skipped:"; grep '\*\*\*Skipped' "$LOG_DIR/gpu_check_test.log" | head
    FAILED=1
  fi
fi
if [[ -f $LOG_DIR/gpu_check_bench.log ]]; then
  echo "-- kernel_bench:"; cat "$LOG_DIR/gpu_check_bench.log"
fi
echo "== gpu_check: $([[ $FAILED -eq 0 ]] && echo PASS || echo FAIL)"
exit $FAILED
