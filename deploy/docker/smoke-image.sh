#!/usr/bin/env bash
# Smoke run of the kvtier-server image (deploy/docker/build-image.sh builds it) without a container engine:
#   1. its config: user 10001:10001, entrypoint kvtier-server, ports 7400 7401 9400 (deploy/k8s/base);
#   2. its contents: the two binaries and the runtime packages of their shared libraries, no compiler,
#      no headers, no -dev package (the list is printed);
#   3. `kvtier-server --version` and `kvtierctl --help` in it (buildah run);
#   4. a one-node server started from the image's root file system as the DaemonSet runs it: the init
#      container's command as root on the disk-tier directory, then the server as uid/gid 10001 with no
#      capabilities, no_new_privs, a read-only root file system, the dev-cpu overlay's config mounted
#      read-only at /etc/kvtier and the disk tier on /var/lib/kvtier; checked from outside with
#      `kvtierctl status` (the image's, and the host's build/cli/kvtierctl when there is one) and
#      /metrics, then stopped with SIGTERM, which must end it with status 0.
# Usage: deploy/docker/smoke-image.sh [IMAGE]   (default kvtier/kvtier-server:<project version>; as root)
# Exits non-zero, saying what, when any check fails.
set -euo pipefail
self=$(realpath "$0")

# --in-image ROOT CONFIG CAPS AS DATA_DIR CMD... (the in_image command below): runs CMD from the root file
# system ROOT, read-only, in a private mount namespace with /proc, /sys, /dev, a 64 MiB tmpfs on /tmp
# (the DaemonSet's emptyDir), CONFIG read-only on /etc/kvtier and DATA_DIR on /var/lib/kvtier; as
# uid/gid AS (0, or 10001 with supplementary groups dropped), with no_new_privs, only the capabilities
# CAPS (setpriv's syntax; SYS_CHROOT, SETUID and SETGID are added for the chroot itself) and only the
# image's PATH in the environment. Every step execs, so CMD keeps this process's id.
if [[ ${1:-} == --in-image ]]; then
  root=$2 config=$3 caps=$4 as=$5 data=$6
  shift 6
  user=()
  [[ $as == 0 ]] || user=(--setgid="$as" --setuid="$as")
  exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    setpriv --no-new-privs unshare --mount --propagation=private -- bash -c '
      set -e
      r=$1 config=$2 data=$3 caps=$4; shift 4
      mount --bind "$r" "$r" && mount -o remount,bind,ro "$r"
      mount -t proc proc "$r/proc"
      mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$r/sys"
      mount --rbind /dev "$r/dev"
      mount -t tmpfs -o size=64m,mode=1777 tmpfs "$r/tmp"
      mount --bind "$config" "$r/etc/kvtier" && mount -o remount,bind,ro "$r/etc/kvtier"
      mount --bind "$data" "$r/var/lib/kvtier"
      exec env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/var/lib/kvtier \
        UCX_NET_DEVICES=lo setpriv --inh-caps=-all --bounding-set="$caps,+sys_chroot,+setuid,+setgid" \
        unshare --root="$r" --wd=/var/lib/kvtier "$@"' \
      in-image "$root" "$config" "$data" "$caps" "${user[@]}" -- "$@"
fi

cd "$(dirname "$0")/../.."

version=$(sed -nE 's/^project\(kvtier VERSION ([0-9][0-9.]*).*/\1/p' CMakeLists.txt)
image=${1:-kvtier/kvtier-server:$version}
uid=10001  # deploy/k8s/base/daemonset.yaml: runAsUser, runAsGroup
WAIT_S=60  # for the server to bind its ports, and to stop

fail() { echo "smoke-image: FAILED: $*" >&2; exit 1; }
say() { echo "smoke-image: $*"; }

work=$(mktemp -d)
chmod 0755 "$work"
ctr=""
pid=""
cleanup() {
  if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  if [[ -n $ctr ]]; then buildah umount "$ctr" >/dev/null 2>&1 || true; buildah rm "$ctr" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

buildah inspect --type image "$image" >/dev/null 2>&1 || fail "no image $image (deploy/docker/build-image.sh builds it)"
ctr=$(buildah from --pull=never --quiet "$image")
root=$(buildah mount "$ctr")

# 1. The image's config against what deploy/k8s expects of it.
ports=$(sed -nE 's/.*containerPort: ([0-9]+).*/\1/p' deploy/k8s/base/daemonset.yaml | tr '\n' ' ')
python3 - "$uid" "$ports" "$(buildah inspect --type image "$image")" <<'PY'
import json, sys
uid, ports, c = sys.argv[1], sys.argv[2].split(), json.loads(sys.argv[3])["OCIv1"]["config"]
user, entrypoint, exposed = c.get("User"), c.get("Entrypoint"), sorted(c.get("ExposedPorts", {}))
problems = []
if user != f"{uid}:{uid}": problems.append(f"user is {user!r}, not {uid}:{uid}")
if entrypoint != ["/usr/local/bin/kvtier-server"]: problems.append(f"entrypoint is {entrypoint}")
if exposed != sorted(f"{p}/tcp" for p in ports): problems.append(f"exposes {exposed}, the DaemonSet uses {ports}")
if problems: sys.exit("smoke-image: FAILED: image config: " + "; ".join(problems))
print(f"smoke-image: config: user {user}, entrypoint {entrypoint}, cmd {c.get('Cmd')}, ports {exposed},",
      f"working directory {c.get('WorkingDir')}")
PY

# 2. What is in it: the binaries, the packages (read from the image's dpkg database), no build tools.
say "binaries:"
ls -l "$root/usr/local/bin"
[[ -x $root/usr/local/bin/kvtier-server && -x $root/usr/local/bin/kvtierctl ]] || fail "kvtier-server or kvtierctl missing"
mapfile -t packages < <(dpkg-query --admindir="$root/var/lib/dpkg" -W -f='${db:Status-Abbrev} ${Package}\n' | awk '$1 == "ii" {print $2}')
say "${#packages[@]} packages: ${packages[*]}"
for p in "${packages[@]}"; do
  case $p in
    *-dev | gcc | gcc-12 | g++ | g++-12 | cpp | cpp-12 | clang* | binutils* | make | cmake | ninja-build | build-essential)
      fail "build package $p is in the runtime image" ;;
  esac
done
tools=$(find "$root/usr/bin" "$root/usr/local/bin" \( -name 'cc' -o -name 'c++' -o -name 'gcc*' -o -name 'g++*' \
  -o -name 'cpp*' -o -name 'clang*' -o -name 'ld' -o -name 'ld.bfd' -o -name 'ld.gold' -o -name 'as' \
  -o -name 'x86_64-linux-gnu-*' -o -name 'cmake' -o -name 'make' -o -name 'ninja' \) -print)
[[ -z $tools ]] || fail "compilers or build tools in the image: $tools"
headers=$(find "$root/usr/include" "$root/usr/local/include" -type f 2>/dev/null | head -5)
[[ -z $headers ]] || fail "headers in the image, e.g. $headers"
libs=$(chroot "$root" /usr/bin/ldd /usr/local/bin/kvtier-server /usr/local/bin/kvtierctl 2>&1) || fail "ldd in the image: $libs"
! grep 'not found' <<< "$libs" || fail "shared libraries missing in the image"
say "no compiler, no headers, no -dev package; every shared library of both binaries resolves in the image"

# 3. The binaries answer in the image (buildah run: the image's user, environment and working directory).
out=$(timeout "$WAIT_S" buildah run --isolation=chroot "$ctr" -- kvtier-server --version) \
  || fail "kvtier-server --version exited with status $?"
[[ $out == "kvtier-server $version" ]] || fail "kvtier-server --version printed \"$out\", not \"kvtier-server $version\""
say "kvtier-server --version: $out"
out=$(timeout "$WAIT_S" buildah run --isolation=chroot "$ctr" -- kvtierctl --help) || fail "kvtierctl --help exited with status $?"
grep -q 'status' <<< "$out" || fail "kvtierctl --help does not list the status command: $out"
say "kvtierctl --help: $(head -1 <<< "$out")"

# 4. One server as the DaemonSet runs it, from the image's root file system (--in-image, above).
config=$work/config
data=$work/data
mkdir -p "$config" "$data" "$work/empty" "$root/etc/kvtier"  # mount points: the kubelet's runtime makes them too
cp deploy/k8s/overlays/dev-cpu/config/kvtier.yaml deploy/k8s/overlays/dev-cpu/config/namespaces.json "$config/"
chmod 0755 "$config" && chmod 0644 "$config"/*
in_image=("$self" --in-image "$root" "$config")  # a command, so that timeout and & can run it

# The init container (deploy/k8s/base/daemonset.yaml, prepare-disk): root with CAP_CHOWN only.
init_cmd=$(sed -nE 's/^ *command: \["\/bin\/sh", "-c", "(.*)"\]$/\1/p' deploy/k8s/base/daemonset.yaml)
[[ $init_cmd == *chown* ]] || fail "cannot find the prepare-disk init container's command in deploy/k8s/base/daemonset.yaml"
prepare_disk() {
  "${in_image[@]}" -all,+chown 0 "$data" /bin/sh -c "$init_cmd" || fail "the init container's command failed in the image: $init_cmd"
  [[ $(stat -c %u:%g "$data" "$data/db" | sort -u) == "$uid:$uid" ]] || fail "init command left $(stat -c '%n %u:%g' "$data" "$data/db")"
  foreign=$(find "$data" ! -uid "$uid" -print | head -5)
  [[ -z $foreign ]] || fail "files in the disk-tier directory not owned by $uid: $foreign"
}

# The server on any free ports (the config's 7400/7401/9400 may be taken on a shared machine); it
# writes the port file into the disk-tier directory.
node=smoke-node
start_server() {
  rm -f "$data/ports"
  "${in_image[@]}" -all "$uid" "$data" /usr/local/bin/kvtier-server --config=/etc/kvtier/kvtier.yaml --node_id="$node" \
    --listen_address=127.0.0.1:0 --metrics_address=127.0.0.1:0 --ucx_listen_address=127.0.0.1:0 \
    --port_file=/var/lib/kvtier/ports 2> "$work/server.log" &
  pid=$!
  local i rc
  for ((i = 0; i < WAIT_S * 10; i++)); do
    [[ -s $data/ports ]] && break
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid" && rc=0 || rc=$?
      pid=""
      cat "$work/server.log" >&2
      fail "server exited with status $rc before binding its ports"
    fi
    sleep 0.1
  done
  [[ -s $data/ports ]] || { cat "$work/server.log" >&2; fail "server did not write its port file within $WAIT_S s"; }
  read -r grpc_port metrics_port ucx_port < "$data/ports"
  say "server up (pid $pid): gRPC $grpc_port, /metrics $metrics_port, UCX $ucx_port; $(head -1 "$work/server.log")"

  # It runs as the DaemonSet says: uid/gid 10001, no supplementary groups, no capabilities,
  # no_new_privs, the image's root file system, read-only.
  local status=/proc/$pid/status
  [[ $(awk '/^Uid:/ {print $2, $3, $4, $5}' "$status") == "$uid $uid $uid $uid" ]] || fail "server uids: $(grep ^Uid: "$status")"
  [[ $(awk '/^Gid:/ {print $2, $3, $4, $5}' "$status") == "$uid $uid $uid $uid" ]] || fail "server gids: $(grep ^Gid: "$status")"
  [[ -z $(awk '/^Groups:/ {print $2}' "$status") ]] || fail "server has supplementary groups: $(grep ^Groups: "$status")"
  [[ $(awk '/^CapPrm:/ {print $2}' "$status") == 0000000000000000 ]] || fail "server has capabilities: $(grep ^CapPrm: "$status")"
  [[ $(awk '/^NoNewPrivs:/ {print $2}' "$status") == 1 ]] || fail "server lacks no_new_privs"
  [[ -e /proc/$pid/root/usr/local/bin/kvtier-server ]] || fail "server's root is not the image's"
  # The last mount on / as the server sees it (mountinfo field 5: mount point, 6: options).
  [[ $(awk '$5 == "/" {opts = $6} END {print opts}' "/proc/$pid/mountinfo") == ro,* ]] || fail "server's root file system is writable"
}

# kvtierctl status from outside: the image's kvtierctl in another process, and the host's build.
check_status() {
  local who=$1 json
  shift
  json=$(timeout "$WAIT_S" "$@" --members="127.0.0.1:$grpc_port" --timeout-ms=5000 status --json) \
    || fail "$who kvtierctl status exited with status $?: $json"
  python3 - "$json" "$node" "$version" "$who" <<'PY' || fail "$who kvtierctl status: unexpected report: $json"
import json, sys
report, node, version, who = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
(m,) = report["members"]
tiers = {t["tier"]: t["capacity_bytes"] for t in m["tiers"]}
assert m["up"] and m["health"] == "SERVING" and m["node_id"] == node and m["version"] == version, m
assert tiers.get("disk") == 2 << 30 and tiers.get("host") == 512 << 20, tiers  # the dev-cpu overlay's sizes
print(f"smoke-image: {who} kvtierctl status: {m['node_id']} {m['health']} version {m['version']}, tiers {tiers}")
PY
}

# Stop as the kubelet does (SIGTERM): the server must exit 0 within the wait and leave its disk tier
# (RocksDB) in the directory.
stop_server() {
  kill -TERM "$pid"
  local i rc
  for ((i = 0; i < WAIT_S * 10; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "server still running $WAIT_S s after SIGTERM"
  wait "$pid" && rc=0 || rc=$?
  pid=""
  ((rc == 0)) || { cat "$work/server.log" >&2; fail "server exited with status $rc after SIGTERM"; }
  [[ -f $data/db/CURRENT ]] || fail "no RocksDB database in the disk-tier directory"
  say "server stopped on SIGTERM with status 0; disk tier $(du -sh "$data/db" | cut -f1) in db/"
}

chown 0:0 "$data" && chmod 0755 "$data"  # what hostPath DirectoryOrCreate makes
prepare_disk
say "init container's command in the image: the disk-tier directory and db/ now belong to $uid:$uid"
start_server
check_status "image's" "${in_image[@]}" -all "$uid" "$work/empty" /usr/local/bin/kvtierctl
if [[ -x build/cli/kvtierctl ]]; then check_status "host's" build/cli/kvtierctl; fi
metrics=$(timeout "$WAIT_S" curl -fsS "http://127.0.0.1:$metrics_port/metrics") || fail "GET /metrics failed"
grep -q "^kvtier_build_info{.*version=\"$version\"" <<< "$metrics" || fail "/metrics has no kvtier_build_info for $version"
say "/metrics: $(grep '^kvtier_build_info' <<< "$metrics")"
stop_server

# A pod restart: the init container on the directory the server filled, then the server reopening it.
prepare_disk
start_server
check_status "image's" "${in_image[@]}" -all "$uid" "$work/empty" /usr/local/bin/kvtierctl
stop_server
say "restart: the init container and the server reopened the disk tier"
say "all checks passed for $image"
