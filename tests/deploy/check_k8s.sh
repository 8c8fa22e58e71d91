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

# The Dockerfile: multi-stage on Debian 12, built with scripts/build.sh, a non-root runtime user, and
# what deploy/k8s expects of the image: the uid, the ports, the binaries' paths, the tag. (Building and
# running the image: deploy/docker/build-image.sh and smoke-image.sh, a CI stage.)
df="$SRC/deploy/docker/Dockerfile"
grep -q '^ARG DEBIAN_IMAGE=debian:12$' "$df" && grep -q '^FROM ${DEBIAN_IMAGE} AS build' "$df" \
  || { echo "PROBLEM: Dockerfile: no Debian 12 build stage" >&2; fail=1; }
grep -q '^ARG DEBIAN_SLIM_IMAGE=debian:12-slim$' "$df" && grep -q '^FROM ${DEBIAN_SLIM_IMAGE} AS runtime' "$df" \
  || { echo "PROBLEM: Dockerfile: no Debian 12 runtime stage" >&2; fail=1; }
grep -q 'scripts/build.sh' "$df" || { echo "PROBLEM: Dockerfile: does not build with scripts/build.sh" >&2; fail=1; }
grep -Eq '^USER [1-9][0-9]*' "$df" || { echo "PROBLEM: Dockerfile: runtime user is not a non-root uid" >&2; fail=1; }
ds="$SRC/deploy/k8s/base/daemonset.yaml"
run_as=$(sed -nE 's/^ *runAsUser: ([1-9][0-9]*)$/\1/p' "$ds" | head -1)
grep -q "^USER $run_as:$run_as\$" "$df" || { echo "PROBLEM: Dockerfile: USER is not the DaemonSet's runAsUser $run_as" >&2; fail=1; }
grep -q "chown -R $run_as:$run_as /var/lib/kvtier" "$ds" && grep -q "chown $run_as:$run_as /var/lib/kvtier" "$df" \
  || { echo "PROBLEM: the image and the init container do not both give /var/lib/kvtier to $run_as" >&2; fail=1; }
ports=$(sed -nE 's/.*containerPort: ([0-9]+).*/\1/p' "$ds" | sort -n | xargs)
[[ "$(sed -nE 's/^EXPOSE (.*)/\1/p' "$df" | tr ' ' '\n' | sort -n | xargs)" == "$ports" ]] \
  || { echo "PROBLEM: Dockerfile: EXPOSE is not the DaemonSet's container ports ($ports)" >&2; fail=1; }
for bin in kvtier-server kvtierctl; do
  grep -q "/out/usr/local/bin/$bin\$\|/out/usr/local/bin/$bin " "$df" \
    || { echo "PROBLEM: Dockerfile: does not install /usr/local/bin/$bin" >&2; fail=1; }
done
grep -q '^ENTRYPOINT \["/usr/local/bin/kvtier-server"\]' "$df" || { echo "PROBLEM: Dockerfile: entrypoint is not kvtier-server" >&2; fail=1; }
grep -q -- '- /usr/local/bin/kvtierctl$' "$ds" || { echo "PROBLEM: the preStop hook does not run /usr/local/bin/kvtierctl" >&2; fail=1; }
version=$(sed -nE 's/^project\(kvtier VERSION ([0-9.]+).*/\1/p' "$SRC/CMakeLists.txt")
grep -q "newTag: $version\$" "$SRC/deploy/k8s/base/kustomization.yaml" \
  || { echo "PROBLEM: deploy/k8s/base deploys another tag than the project version $version (build-image.sh's tag)" >&2; fail=1; }
exit $fail
