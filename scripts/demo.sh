#!/usr/bin/env bash
# The main job: starts a local 3-node kvtier cluster (three kvtier-server processes on 127.0.0.1),
# replays a workload through the client library, prints the report and stops the cluster.
#
# Usage: scripts/demo.sh [--trace FILE] [--capacity-blocks N] [--json] [--limit N] [--block-bytes B]
#   --trace FILE          a Mooncake-format trace (default: the built-in synthetic workload)
#   --capacity-blocks N   total capacity of the cluster in blocks, split evenly (default 6000)
#   --json                print the report as one JSON object (fields: bench/README.md)
#   --limit N             replay only the first N requests
#   --block-bytes B       payload bytes per block (default 32768)
#   --policy NAME         the servers' eviction policy: lru (default here, as the report's reference),
#                         adaptive (kvtier-server's own default), weighted or prefix_lrfu
#   --disk-blocks N       add a RocksDB disk tier of N blocks to the cluster (split evenly); host
#                         evictions then demote to disk, and capacity for the report is host + disk
#   --transport T         block bytes over auto (default: UCX, which the servers offer on 127.0.0.1),
#                         ucx (UCX only) or grpc (gRPC bytes; the servers then start without UCX)
#   --replication-factor R  copies of each block (default 1; docs/architecture.md "Replication")
#   --hot-read-replicas H   extra owners of the first 4 blocks of each prompt, reads spread over them
#                         (default 0); the report then shows each server's load (bench/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."

TRACE=""
CAPACITY_BLOCKS=6000
JSON=0
LIMIT=0
BLOCK_BYTES=32768
DISK_BLOCKS=0
POLICY=lru
TRANSPORT=auto
NODES=3
REPLICATION_FACTOR=1
HOT_READ_REPLICAS=0
need_value() {  # the option $1 takes a value: $2 is it
  [[ $# -ge 2 && -n "$2" ]] || { echo "demo.sh: $1 needs a value (see --help)" >&2; exit 2; }
}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --trace|--capacity-blocks|--limit|--block-bytes|--disk-blocks|--policy|--transport|--replication-factor|\
    --hot-read-replicas) need_value "$@" ;;
  esac
  case "$1" in
    --trace) TRACE=$(realpath -e "$2") || { echo "demo.sh: --trace: no file $2" >&2; exit 2; }; shift 2 ;;
    --capacity-blocks) CAPACITY_BLOCKS=$2; shift 2 ;;
    --json) JSON=1; shift ;;
    --limit) LIMIT=$2; shift 2 ;;
    --block-bytes) BLOCK_BYTES=$2; shift 2 ;;
    --disk-blocks) DISK_BLOCKS=$2; shift 2 ;;
    --policy) POLICY=$2; shift 2 ;;
    --transport) TRANSPORT=$2; shift 2 ;;
    --replication-factor) REPLICATION_FACTOR=$2; shift 2 ;;
    --hot-read-replicas) HOT_READ_REPLICAS=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "demo.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "demo.sh: $*" >&2; }

# Numbers are checked before anything starts (bash arithmetic would read a word as a variable name).
whole() {  # $1: option, $2: value, $3: smallest allowed
  [[ "$2" =~ ^[0-9]+$ && "$2" -ge "$3" ]] || { echo "demo.sh: $1 must be a whole number >= $3, got \"$2\"" >&2; exit 2; }
}
whole --capacity-blocks "$CAPACITY_BLOCKS" 1
whole --limit "$LIMIT" 0
whole --block-bytes "$BLOCK_BYTES" 1
whole --disk-blocks "$DISK_BLOCKS" 0
whole --replication-factor "$REPLICATION_FACTOR" 1
whole --hot-read-replicas "$HOT_READ_REPLICAS" 0

if [[ -z "${KVTIER_SKIP_BUILD:-}" ]]; then  # set it to reuse an existing build/ as it is
  scripts/install-deps.sh >&2
  scripts/build.sh >&2
fi
BUILD=${KVTIER_BUILD_DIR:-build}

# Each server holds an equal share of the capacity (its slots are exactly block-sized).
PER_NODE_BLOCKS=$(( (CAPACITY_BLOCKS + NODES - 1) / NODES ))
HOST_BYTES=$(( PER_NODE_BLOCKS * BLOCK_BYTES ))
# Slabs of about 4 MiB, a whole number of blocks: a block of another size (a client trying the cluster
# with its own blocks) then takes one slab, not the whole tier (docs/architecture.md "Size classes").
SLAB_BYTES=$(( BLOCK_BYTES * ( (4 << 20) / BLOCK_BYTES > 1 ? (4 << 20) / BLOCK_BYTES : 1 ) ))
WORK=$(mktemp -d /tmp/kvtier-demo-XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

case "$TRANSPORT" in
  auto|ucx) UCX_ARGS=(--ucx_listen_address=127.0.0.1:0) ;;
  grpc) UCX_ARGS=() ;;
  *) echo "demo.sh: --transport must be auto, ucx or grpc" >&2; exit 2 ;;
esac
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}  # UCX stays on 127.0.0.1 (TOOLCHAIN.md)

DISK_ARGS=()
if (( DISK_BLOCKS > 0 )); then
  DISK_BYTES=$(( (DISK_BLOCKS + NODES - 1) / NODES * BLOCK_BYTES ))
fi
MEMBERS=()
for i in $(seq 1 "$NODES"); do
  if (( DISK_BLOCKS > 0 )); then
    DISK_ARGS=(--disk_path="$WORK/node-$i.db" --disk_capacity_bytes="$DISK_BYTES")
  fi
  "$BUILD/cache_server/kvtier-server" --node_id="node-$i" --listen_address=127.0.0.1:0 \
    --metrics_address=127.0.0.1:0 --port_file="$WORK/node-$i.port" \
    --host_cache_bytes="$HOST_BYTES" --slab_bytes="$SLAB_BYTES" --max_block_bytes="$SLAB_BYTES" --eviction_policy="$POLICY" "${DISK_ARGS[@]}" "${UCX_ARGS[@]}" 2>"$WORK/node-$i.log" &
  PIDS+=($!)
done
for i in $(seq 1 "$NODES"); do
  for _ in $(seq 1 200); do [[ -s "$WORK/node-$i.port" ]] && break; sleep 0.05; done
  [[ -s "$WORK/node-$i.port" ]] || { log "node-$i did not start:"; cat "$WORK/node-$i.log" >&2; exit 1; }
  read -r GRPC_PORT METRICS_PORT UCX_PORT < "$WORK/node-$i.port"
  MEMBERS+=("127.0.0.1:$GRPC_PORT")
  log "node-$i: gRPC 127.0.0.1:$GRPC_PORT, /metrics 127.0.0.1:$METRICS_PORT, UCX port ${UCX_PORT:-0}, $PER_NODE_BLOCKS blocks ($HOST_BYTES bytes)"
done
MEMBER_LIST=$(IFS=,; echo "${MEMBERS[*]}")

ARGS=(--members="$MEMBER_LIST" --capacity_blocks="$(( CAPACITY_BLOCKS + DISK_BLOCKS ))" --block_bytes="$BLOCK_BYTES" --limit="$LIMIT"
      --transport="$TRANSPORT" --replication_factor="$REPLICATION_FACTOR" --hot_read_replicas="$HOT_READ_REPLICAS")
[[ -n "$TRACE" ]] && ARGS+=(--trace="$TRACE")
[[ $JSON -eq 1 ]] && ARGS+=(--json)
log "replaying ${TRACE:-the built-in workload} against $MEMBER_LIST"
status=0
"$BUILD/bench/trace_replay/trace_replay" "${ARGS[@]}" || status=$?
if [[ $JSON -eq 0 && -x "$BUILD/cli/kvtierctl" ]]; then
  echo
  "$BUILD/cli/kvtierctl" --members="$MEMBER_LIST" status || true
fi
exit $status
