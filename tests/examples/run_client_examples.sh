#!/usr/bin/env bash
# Runs examples/cpp_client and examples/c_client (built in this tree) against a kvtier-server started on
# port 0. scripts/package-check.sh runs the same programs built against an installed prefix.
# Usage: run_client_examples.sh KVTIER_SERVER CPP_CLIENT C_CLIENT
set -euo pipefail
server=$1
shift
work=$(mktemp -d /tmp/kvtier-examples.XXXXXX)
pid=""
cleanup() {
  if [[ -n $pid ]]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
"$server" --node_id=examples-1 --listen_address=127.0.0.1:0 --metrics_address=none --port_file="$work/port" \
  --host_cache_bytes=64MiB >"$work/server.log" 2>&1 &
pid=$!
for _ in $(seq 200); do [[ -s $work/port ]] && break; sleep 0.05; done
[[ -s $work/port ]] || { echo "no port file from $server" >&2; cat "$work/server.log" >&2; exit 1; }
address=127.0.0.1:$(awk '{print $1; exit}' "$work/port")
for example in "$@"; do
  "$example" "$address"
done
