#!/usr/bin/env bash
# Checks kvtier the way users install it, from a tree built like setup.py builds it (build-python/:
# Release, no tests, no bench, no CUDA, the Python module on), configured for /usr:
#   1. cmake --install into a fresh prefix; every installed header compiles with only that prefix (and
#      the system) on the include path, and no installed text file names this source tree;
#   2. examples/cpp_client (shared and static client) and examples/c_client are configured with
#      find_package(kvtier CONFIG) against the prefix alone, and built again with pkg-config; each runs
#      against a kvtier-server started from the prefix;
#   3. cpack builds the .deb packages, `apt-get install ./*.deb` installs them, and the installed
#      kvtier-server --version and kvtierctl --help run (the packages are purged afterwards);
#   4. `pip install ./bindings/python` (offline: --no-index --no-build-isolation, in a venv over
#      Debian's Python) installs a module that talks to the server.
# Prints the seconds each step took. Usage: scripts/package-check.sh [cmake -D arguments for step 1]
# (step 3 runs apt-get: as root, or with sudo).
# KVTIER_PACKAGE_DEB=0 skips step 3 (it installs into /usr); KVTIER_JOBS sets build jobs (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=$ROOT/build-python  # the tree setup.py configures, so pip reuses what step 1 built
JOBS=${KVTIER_JOBS:-2}
WORK=$(mktemp -d /tmp/kvtier-package.XXXXXX)
PREFIX=$WORK/prefix
SERVER_PID=""
DEBS_INSTALLED=0
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export UCX_NET_DEVICES=lo

cleanup() {
  if [[ -n $SERVER_PID ]]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  if ((DEBS_INSTALLED)); then
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get purge -y -qq kvtier-server libkvtier-dev libkvtier0 >/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

total_start=$(date +%s)
step_start=$total_start
step() {  # step NAME: report the previous step's time, start timing the next
  local now
  now=$(date +%s)
  if [[ -n ${STEP_NAME:-} ]]; then echo "package-check: ${STEP_NAME} took $((now - step_start)) s"; fi
  STEP_NAME=$1
  step_start=$now
  echo "package-check: == $1"
}

step "configure and build ($BUILD)"
# The venv of step 4, made first so that this tree is configured for its interpreter as setup.py will.
/usr/bin/python3 -m venv --system-site-packages --without-pip "$WORK/venv"  # Debian's pip, from the system site
generator=(-G Ninja)
cmake -S . -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DKVTIER_BUILD_TESTS=OFF -DKVTIER_BUILD_BENCH=OFF -DKVTIER_BUILD_PYTHON=ON -DKVTIER_WITH_CUDA=OFF \
  -DKVTIER_PYTHON_EXECUTABLE="$WORK/venv/bin/python" "$@" >/dev/null
# Only what is installed, and the Python module (neither tests, examples nor the header check).
cmake --build "$BUILD" -j "$JOBS" --target kvtier-server kvtierctl kvtier_client_shared kvtier_client_static kvtier_c \
  kvtier_python

step "install into a prefix"
cmake --install "$BUILD" --prefix "$PREFIX" >/dev/null
LIBDIR=$(find "$PREFIX" -name 'libkvtier_client.so' -printf '%h\n' | head -1)
for f in bin/kvtier-server bin/kvtierctl include/kvtier/client/client.h include/kvtier/kvtier.h; do
  [[ -e $PREFIX/$f ]] || { echo "package-check: $f was not installed" >&2; exit 1; }
done
for f in libkvtier_client.a libkvtier.so cmake/kvtier/kvtier-config.cmake pkgconfig/kvtier.pc pkgconfig/kvtier-client.pc; do
  [[ -e $LIBDIR/$f ]] || { echo "package-check: $LIBDIR/$f was not installed" >&2; exit 1; }
done
if grep -rl --include='*.cmake' --include='*.pc' --include='*.h' "$ROOT" "$PREFIX"; then
  echo "package-check: the installed files above name the source or build tree" >&2
  exit 1
fi
n=0
while IFS= read -r h; do  # each header alone, with only the prefix added to the include path
  rel=${h#"$PREFIX"/include/}
  if [[ $rel == kvtier/kvtier.h ]]; then
    echo "#include \"$rel\"" | cc -std=c99 -Wall -Wextra -Werror -fsyntax-only -I"$PREFIX/include" -x c -
  fi
  echo "#include \"$rel\"" | c++ -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$PREFIX/include" -x c++ -
  n=$((n + 1))
done < <(find "$PREFIX/include" -name '*.h' | sort)
echo "package-check: $n installed headers compile against the prefix alone"

step "build the examples against the prefix"
example() {  # example SOURCE_DIR BUILD_DIR [cmake args...]
  local src=$1 dir=$2
  shift 2
  cmake -S "$src" -B "$dir" "${generator[@]}" -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
    -DCMAKE_COMPILE_WARNING_AS_ERROR=ON "$@" >/dev/null
  cmake --build "$dir" >/dev/null
}
example examples/cpp_client "$WORK/cpp"
example examples/cpp_client "$WORK/cpp-static" -DKVTIER_EXAMPLE_STATIC=ON
example examples/c_client "$WORK/c"
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig
# shellcheck disable=SC2046  # pkg-config output is meant to split into words
cc -std=c99 -Wall -Wextra -Werror examples/c_client/main.c -o "$WORK/c_client_pc" $(pkg-config --cflags --libs kvtier) \
  -Wl,-rpath,"$LIBDIR"
# shellcheck disable=SC2046
c++ -std=c++20 -Wall -Wextra -Werror examples/cpp_client/main.cc -o "$WORK/cpp_client_pc" \
  $(pkg-config --cflags --libs kvtier-client) -Wl,-rpath,"$LIBDIR"
for bin in "$WORK/cpp/cpp_client" "$WORK/c/c_client" "$WORK/c_client_pc" "$WORK/cpp_client_pc"; do
  libs=$(ldd "$bin")  # not piped into grep -q: its early exit would fail ldd (pipefail)
  if [[ $libs != *"$LIBDIR/libkvtier"* ]]; then
    echo "package-check: $bin does not load kvtier from the prefix:" >&2
    echo "$libs" >&2
    exit 1
  fi
done
if [[ $(ldd "$WORK/cpp-static/cpp_client") == *libkvtier* ]]; then
  echo "package-check: the static cpp_client loads a kvtier shared library" >&2
  exit 1
fi

step "run the examples against a server from the prefix"
"$PREFIX/bin/kvtier-server" --version
"$PREFIX/bin/kvtier-server" --node_id=package-1 --listen_address=127.0.0.1:0 --metrics_address=none \
  --port_file="$WORK/port" --host_cache_bytes=64MiB >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 200); do [[ -s $WORK/port ]] && break; sleep 0.05; done
[[ -s $WORK/port ]] || { echo "package-check: the server wrote no port file" >&2; cat "$WORK/server.log" >&2; exit 1; }
ADDRESS=127.0.0.1:$(awk '{print $1; exit}' "$WORK/port")
for bin in "$WORK/cpp/cpp_client" "$WORK/cpp-static/cpp_client" "$WORK/c/c_client" "$WORK/c_client_pc" "$WORK/cpp_client_pc"; do
  "$bin" "$ADDRESS"
done

if [[ ${KVTIER_PACKAGE_DEB:-1} != 0 ]]; then
  step "build and install the .deb packages"
  (cd "$BUILD" && cpack -G DEB -B "$WORK/debs" >/dev/null)
  ls "$WORK"/debs/*.deb
  for p in kvtier-server libkvtier-dev libkvtier0; do
    if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      echo "package-check: $p is already installed; remove it first" >&2
      exit 1
    fi
  done
  DEBS_INSTALLED=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$WORK"/debs/*.deb >/dev/null
  /usr/bin/kvtier-server --version | grep -qx "kvtier-server $(awk -F'[ ()]+' '/^project\(kvtier VERSION/ {print $4}' CMakeLists.txt)"
  /usr/bin/kvtierctl --help >/dev/null
  pkg-config --exists kvtier kvtier-client
  example examples/c_client "$WORK/c-system"  # the packaged CMake package, found without a prefix path
  "$WORK/c-system/c_client" "$ADDRESS"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get purge -y -qq kvtier-server libkvtier-dev libkvtier0 >/dev/null
  DEBS_INSTALLED=0
fi

step "pip install ./bindings/python (offline, venv over Debian's Python)"
CMAKE_BUILD_PARALLEL_LEVEL=$JOBS "$WORK/venv/bin/python" -m pip install -q --no-index --no-build-isolation ./bindings/python
(cd "$WORK" && "$WORK/venv/bin/python" - "$ADDRESS" "$WORK/venv" <<'EOF'
import sys

import numpy as np

import kvtier

address, venv = sys.argv[1], sys.argv[2]
assert kvtier.__file__.startswith(venv), f"kvtier imported from {kvtier.__file__}, not the venv"
ns = kvtier.Namespace("package-check", "pip/tiny", num_layers=2, num_kv_heads=2, head_dim=16, block_tokens=16)
with kvtier.Client([address]) as client:
    fps = kvtier.fingerprints(ns, list(range(3 * 16)))
    blocks = np.arange(3 * ns.block_bytes, dtype=np.uint8).reshape(3, -1)
    client.put(ns, fps, blocks)
    out = np.zeros_like(blocks)
    assert kvtier.leading_hits(client.get(ns, fps, out)) == 3 and (out == blocks).all()
print(f"package-check: pip-installed kvtier {kvtier.__version__} stored and read back 3 blocks")
EOF
)
step "done"
echo "package-check: all steps passed in $(($(date +%s) - total_start)) s"
