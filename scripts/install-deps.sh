#!/usr/bin/env bash
# Installs the Debian 12 packages kvtier needs to build, test and run its demo.
# Idempotent: packages already present are skipped, and apt is not touched when nothing is missing.
# Usage: scripts/install-deps.sh   (as root, or with sudo available)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev librocksdb-dev libucx-dev ucx-utils
  libgtest-dev googletest libgmock-dev libbenchmark-dev
  librsvg2-bin  # policy_sim --png
  redis-server libhiredis-dev  # transfer_bench: the Redis baseline
  libyaml-cpp-dev libspdlog-dev libxxhash-dev libssl-dev prometheus-cpp-dev libcli11-dev nlohmann-json3-dev
  libc-ares-dev  # DNS membership (client_lib); also a gRPC dependency
  libzmq3-dev  # KV events (docs/events.md)
  curl procps
  iproute2  # tests/fault: `ip netns` and veth pairs for the network-partition test
  python3-dev python3-pybind11 python3-numpy python3-pip python3-setuptools python3-wheel  # bindings/python
  clang libclang-rt-14-dev clang-format  # sanitizers, fuzzers; scripts/format.sh
)
# tests/deploy: promtool (Debian's prometheus package) checks /metrics and deploy/prometheus; node and npm
# install kubernetes-models to validate deploy/k8s. KVTIER_DEPS_TEST_TOOLS=0 leaves them out (the image
# build in deploy/docker). nodejs from NodeSource ships npm itself and conflicts with Debian's npm.
if [[ ${KVTIER_DEPS_TEST_TOOLS:-1} != 0 ]]; then
  PACKAGES+=(prometheus)
  PACKAGES+=(dnsmasq-base)  # tests/integration/dns_membership_test.cc: a DNS server on a high loopback port
  if ! command -v npm >/dev/null 2>&1; then PACKAGES+=(nodejs npm); fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
