#!/usr/bin/env bash
# Installs the Debian 12 packages kvtier needs, by group:
#   build  compile the libraries, kvtier-server and kvtierctl with tests, bench and Python off (what
#          deploy/docker/Dockerfile's build stage installs)
#   test   everything else scripts/build.sh, scripts/test.sh, the sanitizers, fuzzers, bench, the Python
#          module, scripts/format.sh and the demo use
#   image  buildah and mmdebstrap, to build and smoke-run the container image without Docker
#          (deploy/docker/build-image.sh). Not in the default: buildah brings iptables, uidmap and the
#          containers tooling, which nothing else needs.
# Idempotent: packages already present are skipped, and apt is not touched when nothing is missing.
# Usage: scripts/install-deps.sh [build] [test] [image]   (default: build test; as root, or with sudo)
set -euo pipefail

BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libucx-dev
  libyaml-cpp-dev libspdlog-dev libxxhash-dev libssl-dev prometheus-cpp-dev libcivetweb-dev libcli11-dev nlohmann-json3-dev
  libc-ares-dev  # DNS membership (client_lib); also a gRPC dependency
  libzmq3-dev  # KV events (docs/events.md)
)
TEST_PACKAGES=(
  git python3 ucx-utils
  libgtest-dev googletest libgmock-dev libbenchmark-dev
  librsvg2-bin  # policy_sim --png
  redis-server libhiredis-dev  # transfer_bench: the Redis baseline
  curl procps
  iproute2  # tests/fault: `ip netns` and veth pairs for the network-partition test
  python3-dev python3-pybind11 python3-numpy python3-pip python3-setuptools python3-wheel  # bindings/python
  clang libclang-rt-14-dev clang-format  # sanitizers, fuzzers; scripts/format.sh
  # tests/deploy: promtool (Debian's prometheus package) checks /metrics and deploy/prometheus; node and
  # npm install kubernetes-models to validate deploy/k8s.
  prometheus
  dnsmasq-base  # DNS membership tests (dns_membership_test.cc, tests/python/*_suite.py): a DNS server on a high port
  python3-msgpack python3-zmq  # test_vllm_events.py, examples/router: read the vLLM-format event stream
  openssl  # the security tests (tests/integration/security, tests/python/*_suite.py) make certificates with its CLI
)
# nodejs from NodeSource ships npm itself and conflicts with Debian's npm.
if ! command -v npm >/dev/null 2>&1; then TEST_PACKAGES+=(nodejs npm); fi
IMAGE_PACKAGES=(buildah mmdebstrap curl python3)  # the last two: smoke-image.sh reads /metrics and the status report

groups=("$@")
if ((${#groups[@]} == 0)); then groups=(build test); fi
PACKAGES=()
for g in "${groups[@]}"; do
  case $g in
    build) PACKAGES+=("${BUILD_PACKAGES[@]}") ;;
    test) PACKAGES+=("${TEST_PACKAGES[@]}") ;;
    image) PACKAGES+=("${IMAGE_PACKAGES[@]}") ;;
    *) echo "install-deps: unknown group \"$g\" (build, test, image)" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present (${groups[*]})"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
