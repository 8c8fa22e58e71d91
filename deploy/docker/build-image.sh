#!/usr/bin/env bash
# Builds the kvtier-server image from deploy/docker/Dockerfile with buildah (no Docker engine needed),
# tags it kvtier/kvtier-server:<project version> and prints its size (docs/deploy.md).
# Base images: debian:12 and debian:12-slim from the registry when it answers; otherwise Debian 12 root
# file systems made by mmdebstrap from Debian's archive, imported as localhost/kvtier-base/debian:12 and
# localhost/kvtier-base/debian:12-slim (reused by later runs; --refresh-base makes them again).
# Usage: deploy/docker/build-image.sh [--refresh-base] [--tag NAME:TAG]
# Environment: KVTIER_JOBS (compile jobs in the build stage; default: the number of CPUs),
#   KVTIER_DEBIAN_MIRROR (default http://deb.debian.org/debian) and KVTIER_DEBIAN_SECURITY_MIRROR
#   (default http://deb.debian.org/debian-security) for mmdebstrap,
#   KVTIER_REGISTRY_TIMEOUT (seconds to wait for the registry; default 60).
# Prints "image: NAME size: BYTES" last. Exits non-zero if any step fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD

refresh_base=0
tag=""
while (($# > 0)); do
  case $1 in
    --refresh-base) refresh_base=1 ;;
    --tag) tag=$2; shift ;;
    --tag=*) tag=${1#--tag=} ;;
    *) echo "build-image: unknown argument \"$1\" (usage: build-image.sh [--refresh-base] [--tag NAME:TAG])" >&2; exit 2 ;;
  esac
  shift
done

version=$(sed -nE 's/^project\(kvtier VERSION ([0-9][0-9.]*).*/\1/p' CMakeLists.txt)
[[ -n $version ]] || { echo "build-image: no 'project(kvtier VERSION x.y.z' in CMakeLists.txt" >&2; exit 1; }
tag=${tag:-kvtier/kvtier-server:$version}
jobs=${KVTIER_JOBS:-$(nproc)}
mirror=${KVTIER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${KVTIER_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

scripts/install-deps.sh image  # buildah, mmdebstrap; python3 reads buildah's JSON

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step_start=$(date +%s)
step() { echo "build-image: $* ($(($(date +%s) - step_start)) s so far)"; }

have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }
# Bumped whenever make_debian_bases changes what it makes: older base images are then made again.
BASE_RECIPE=2
base_recipe() { buildah inspect --type image --format '{{index .OCIv1.Config.Labels "kvtier.base-recipe"}}' "$1"; }

# Makes localhost/kvtier-base/debian:12 (mmdebstrap minbase of bookworm with its updates and security
# suites, like the registry's debian:12) and localhost/kvtier-base/debian:12-slim (the same file system
# without documentation, man pages and locales, and a dpkg config that keeps them out of later
# installs, like debian:12-slim).
make_debian_bases() {
  mmdebstrap --variant=minbase --quiet --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr bookworm - \
    "deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security_mirror bookworm-security main" \
    | mmtarfilter --path-exclude='/dev/*' > "$work/debian12.tar"
  local slim_rules=(
    '/usr/share/doc/*' '+/usr/share/doc/*/copyright'
    '/usr/share/man/*' '/usr/share/info/*' '/usr/share/groff/*' '/usr/share/lintian/*' '/usr/share/linda/*'
    '/usr/share/locale/*' '+/usr/share/locale/locale.alias'
  )
  local filter=() dpkg_cfg="" rule
  for rule in "${slim_rules[@]}"; do
    if [[ $rule == +* ]]; then
      filter+=("--path-include=${rule#+}"); dpkg_cfg+="path-include ${rule#+}"$'\n'
    else
      filter+=("--path-exclude=$rule"); dpkg_cfg+="path-exclude $rule"$'\n'
    fi
  done
  mmtarfilter "${filter[@]}" < "$work/debian12.tar" > "$work/debian12-slim.tar"
  mkdir -p "$work/slim/etc/dpkg/dpkg.cfg.d" "$work/both/etc/apt/apt.conf.d"
  printf '# Keep documentation out of this image (as debian:12-slim).\n%s' "$dpkg_cfg" \
    > "$work/slim/etc/dpkg/dpkg.cfg.d/slim"
  # As Debian's registry images do: apt leaves no package caches or downloaded .debs in a layer.
  cat > "$work/both/etc/apt/apt.conf.d/container-clean" <<'APT'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
APT

  local name tar ctr
  for name in debian:12 debian:12-slim; do
    tar=$work/${name/:/}.tar
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$tar" / >/dev/null
    buildah copy --quiet "$ctr" "$work/both/" / >/dev/null
    if [[ $name == debian:12-slim ]]; then buildah copy --quiet "$ctr" "$work/slim/" / >/dev/null; fi
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd bash \
      --label "org.opencontainers.image.description=Debian 12 made by mmdebstrap from $mirror" \
      --label "kvtier.base-recipe=$BASE_RECIPE" "$ctr"
    buildah commit --quiet --rm "$ctr" "localhost/kvtier-base/$name" >/dev/null
  done
}

# The base images: the registry's, or ours from Debian's archive.
base=registry
for name in debian:12 debian:12-slim; do
  if ! have_image "docker.io/library/$name" \
      && ! timeout "${KVTIER_REGISTRY_TIMEOUT:-60}" buildah pull --quiet "docker.io/library/$name" >/dev/null 2>&1; then
    base=mmdebstrap
    break
  fi
done
if [[ $base == registry ]]; then
  debian_image=docker.io/library/debian:12
  debian_slim_image=docker.io/library/debian:12-slim
  echo "build-image: base images debian:12 and debian:12-slim from the registry"
else
  debian_image=localhost/kvtier-base/debian:12
  debian_slim_image=localhost/kvtier-base/debian:12-slim
  if ((refresh_base)) || ! have_image "$debian_image" || ! have_image "$debian_slim_image" \
      || [[ $(base_recipe "$debian_image") != "$BASE_RECIPE" || $(base_recipe "$debian_slim_image") != "$BASE_RECIPE" ]]; then
    echo "build-image: no registry reachable: making Debian 12 base images with mmdebstrap from $mirror"
    make_debian_bases
    step "made $debian_image and $debian_slim_image"
  else
    echo "build-image: no registry reachable: reusing $debian_image and $debian_slim_image" \
      "(made by mmdebstrap on $(buildah inspect --type image --format '{{.Docker.Created}}' "$debian_image" | cut -c1-10);" \
      "--refresh-base makes them again)"
  fi
fi

echo "build-image: building $tag from deploy/docker/Dockerfile (KVTIER_JOBS=$jobs)"
buildah bud --isolation=chroot --layers --pull=never \
  -f deploy/docker/Dockerfile --ignorefile deploy/docker/Dockerfile.dockerignore \
  --build-arg "DEBIAN_IMAGE=$debian_image" --build-arg "DEBIAN_SLIM_IMAGE=$debian_slim_image" \
  --build-arg "KVTIER_JOBS=$jobs" \
  --label "org.opencontainers.image.title=kvtier-server" --label "org.opencontainers.image.version=$version" \
  -t "$tag" "$SRC" 2>&1 \
  | while IFS= read -r line; do
      # Each Dockerfile step with the seconds since this script started, so a slow step shows in the log.
      if [[ $line == *"] STEP "* ]]; then line="[$(($(date +%s) - step_start)) s] $line"; fi
      printf '%s\n' "$line"
    done
step "built $tag"

# The size: the sum of its layers (uncompressed, as `docker images` shows it), and gzip-compressed as a
# registry would store it.
size=$(buildah inspect --type image "$tag" | python3 -c '
import json, sys
print(sum(layer["size"] for layer in json.loads(json.load(sys.stdin)["Manifest"])["layers"]))')
buildah push --quiet --compression-format gzip "$tag" "oci:$work/oci:$tag" >/dev/null
compressed=$(python3 - "$work/oci" <<'PY'
import json, os, sys
blobs = os.path.join(sys.argv[1], "blobs", "sha256")
index = json.load(open(os.path.join(sys.argv[1], "index.json")))
manifest = json.load(open(os.path.join(blobs, index["manifests"][0]["digest"].split(":")[1])))
print(sum(layer["size"] for layer in manifest["layers"]))
PY
)
iec() { numfmt --to=iec-i --suffix=B --format=%.1f "$1"; }
echo "image: $tag size: $size bytes ($(iec "$size")), $compressed bytes compressed ($(iec "$compressed")), base: $base"
