#!/usr/bin/env bash
# Renders every kustomization of deploy/k8s with `kubectl kustomize` and validates each object against
# the Kubernetes and Prometheus-operator schemas for its apiVersion and kind (npm's kubernetes-models,
# offline once installed), plus what DESIGN.md §8 asks of kvtier's objects (validate_k8s.js); starts
# kvtier-server on each overlay's config to prove it parses; lints the Dockerfile's essentials.
# Without kubectl (a fresh Debian CI) the raw objects are validated instead of the rendered ones.
# Usage: check_k8s.sh SOURCE_DIR CACHE_DIR [KVTIER_SERVER_BINARY]
#   CACHE_DIR holds node_modules (npm ci from tests/deploy/package-lock.json; needs the npm registry once).
set -euo pipefail
SRC=$(cd "$1" && pwd)
CACHE=$2
SERVER=${3:-}
HERE="$SRC/tests/deploy"

command -v node >/dev/null || { echo "node is required (scripts/install-deps.sh installs nodejs and npm)" >&2; exit 1; }
mkdir -p "$CACHE"
if ! cmp -s "$HERE/package-lock.json" "$CACHE/package-lock.json" || [[ ! -d "$CACHE/node_modules/kubernetes-models" ]]; then
  command -v npm >/dev/null || { echo "npm is required to install kubernetes-models into $CACHE" >&2; exit 1; }
  cp "$HERE/package.json" "$HERE/package-lock.json" "$CACHE/"
  (cd "$CACHE" && npm ci --no-audit --no-fund --loglevel=error)
fi
export NODE_PATH="$CACHE/node_modules"
VALIDATE=(node "$HERE/validate_k8s.js")

fail=0
if command -v kubectl >/dev/null; then
  for dir in base overlays/dev-cpu overlays/gpu; do
    name=$(basename "$dir")
    kubectl kustomize "$SRC/deploy/k8s/$dir" > "$CACHE/$name.yaml"
    "${VALIDATE[@]}" --rendered "$name" "$CACHE/$name.yaml" --source "$SRC" --write-config "$CACHE/$name-kvtier.yaml" || fail=1
  done
else
  echo "kubectl not found: validating the raw objects (patches and overlays are not rendered)"
  "${VALIDATE[@]}" --raw "$SRC" || fail=1
  for dir in base overlays/dev-cpu overlays/gpu; do
    name=$(basename "$dir")
    [[ -f "$SRC/deploy/k8s/$dir/config/kvtier.yaml" ]] && cp "$SRC/deploy/k8s/$dir/config/kvtier.yaml" "$CACHE/$name-kvtier.yaml"
  done
fi

# Each config must parse and validate in the real server. Addresses, sizes and the disk path are
# overridden to fit this machine; every key still goes through the parser.
if [[ -n "$SERVER" && -x "$SERVER" ]]; then
  for name in base dev-cpu gpu; do
    config="$CACHE/$name-kvtier.yaml"
    [[ -f "$config" ]] || continue
    work=$(mktemp -d)
    "$SERVER" --config="$config" --node_id=config-check --listen_address=127.0.0.1:0 --metrics_address=127.0.0.1:0 \
      --ucx_listen_address=none --port_file="$work/port" --host_cache_bytes=16MiB --slab_bytes=16MiB \
      --max_block_bytes=16MiB --disk_path="$work/db" --disk_capacity_bytes=16MiB 2> "$work/log" &
    pid=$!
    for _ in $(seq 100); do [[ -s "$work/port" ]] && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    if [[ -s "$work/port" ]]; then
      echo "$name: kvtier-server accepts the config"
      kill -TERM $pid; wait $pid || true
    else
      echo "PROBLEM: $name: kvtier-server rejects the config:" >&2; cat "$work/log" >&2; fail=1
      kill -KILL $pid 2>/dev/null || true; wait $pid 2>/dev/null || true
    fi
    rm -rf "$work"
  done
fi

# The Dockerfile: multi-stage on Debian 12, built with scripts/build.sh, a non-root runtime user.
df="$SRC/deploy/docker/Dockerfile"
grep -q '^FROM debian:12 AS build' "$df" || { echo "PROBLEM: Dockerfile: no Debian 12 build stage" >&2; fail=1; }
grep -q '^FROM debian:12-slim AS runtime' "$df" || { echo "PROBLEM: Dockerfile: no Debian 12 runtime stage" >&2; fail=1; }
grep -q 'scripts/build.sh' "$df" || { echo "PROBLEM: Dockerfile: does not build with scripts/build.sh" >&2; fail=1; }
grep -Eq '^USER [1-9][0-9]*' "$df" || { echo "PROBLEM: Dockerfile: runtime user is not a non-root uid" >&2; fail=1; }
exit $fail
