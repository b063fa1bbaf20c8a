#!/usr/bin/env bash
# Create the base OS image of the CPU candidate image without pulling anything from a registry:
# debootstrap a Debian 12 (bookworm) minbase with Python 3.11 and a compiler, tar it, and import
# it as localhost/qualify-bookworm-py-base into qualify's container store.
#
# Cached twice, so CI pays once per machine:
#   - the image: if it already exists in the store, nothing is done;
#   - the rootfs tarball ($QUALIFY_CACHE_DIR/containers/base/*.tar): a fresh store re-imports it (~13 s)
#     instead of running debootstrap again (~65 s).
#
# Environment:
#   QUALIFY_CACHE_DIR   qualify's cache (default ~/.cache/qualify); the store is <cache>/containers/{root,runroot}
#   DEBIAN_MIRROR       mirror for debootstrap (default: the first Debian mirror apt uses here)
#   BASE_IMAGE          image name (default localhost/qualify-bookworm-py-base)
#   FORCE=1             rebuild the tarball and re-import even if cached
# Needs root, debootstrap and podman (runc). Prints the image name on success.
set -euo pipefail

CACHE="${QUALIFY_CACHE_DIR:-$HOME/.cache/qualify}"
STORE="$CACHE/containers"
ROOT="$STORE/root"
RUNROOT="$STORE/runroot"
CONF="$STORE/containers.conf"
BASE_DIR="$STORE/base"
IMAGE="${BASE_IMAGE:-localhost/qualify-bookworm-py-base}"
SUITE=bookworm
PACKAGES="python3,python3-venv,python3-pip,ca-certificates,gcc,g++,python3-dev"
# The tarball name carries the package list: changing it builds a new tarball.
TARBALL="$BASE_DIR/$SUITE-minbase-$(printf '%s' "$PACKAGES" | sha256sum | cut -c1-12).tar"

log() { printf 'base-image: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for tool in podman debootstrap tar; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (apt-get install -y --no-install-recommends buildah podman skopeo runc debootstrap)"
done
[ "$(id -u)" = 0 ] || die "debootstrap and the container store need root"

mkdir -p "$ROOT" "$RUNROOT" "$BASE_DIR" "$RUNROOT/libpod"
# The same containers.conf qualify.build.containers writes (runc: crun fails on hybrid cgroups here).
if [ ! -f "$CONF" ]; then
  cat >"$CONF.tmp" <<EOF
# Written by qualify (qualify.build.containers / scripts/base-image.sh); rewritten when it differs.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$RUNROOT/libpod"
EOF
  mv "$CONF.tmp" "$CONF"
fi
export CONTAINERS_CONF="$CONF"
PODMAN=(podman --root "$ROOT" --runroot "$RUNROOT" --runtime runc --cgroup-manager cgroupfs
        --events-backend file --tmpdir "$RUNROOT/libpod")

# One creator at a time (parallel test sessions, a CI job next to a developer).
exec 9>"$STORE/base.lock"
flock 9

if [ "${FORCE:-0}" != 1 ] && "${PODMAN[@]}" image exists "$IMAGE"; then
  log "$IMAGE already in $ROOT"
  echo "$IMAGE"
  exit 0
fi

mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local uri
  uri="$(grep -hE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' \
         | grep -v -- '-security' | head -n1 || true)"
  if [ -z "$uri" ]; then
    uri="$(grep -hE '^\s*deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
           | grep -v -- '-security' | awk '{for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' | head -n1 || true)"
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

if [ "${FORCE:-0}" = 1 ] || [ ! -s "$TARBALL" ]; then
  MIRROR="$(mirror)"
  WORK="$(mktemp -d "$BASE_DIR/rootfs.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  log "debootstrap --variant=minbase $SUITE from $MIRROR (about 65 s)"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$WORK/rootfs" "$MIRROR" \
    >"$BASE_DIR/debootstrap.log" 2>&1 || { tail -n 30 "$BASE_DIR/debootstrap.log" >&2; die "debootstrap failed (log: $BASE_DIR/debootstrap.log)"; }
  # No package caches or lists in the image; an image is rebuilt, not apt-upgraded.
  rm -rf "$WORK/rootfs/var/cache/apt/archives/"*.deb "$WORK/rootfs/var/lib/apt/lists/"* \
         "$WORK/rootfs/var/log/"*.log "$WORK/rootfs/tmp/"* 2>/dev/null || true
  # The host's resolver and hostname must not end up in the image.
  : >"$WORK/rootfs/etc/resolv.conf"; rm -f "$WORK/rootfs/etc/hostname"
  tar --numeric-owner -C "$WORK/rootfs" -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
  rm -rf "$WORK"; trap - EXIT
  log "rootfs tarball $TARBALL ($(du -h "$TARBALL" | cut -f1))"
else
  log "reusing $TARBALL"
fi

log "importing $IMAGE"
"${PODMAN[@]}" import \
  --change 'ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV=LANG=C.UTF-8' \
  --change 'CMD=["/bin/bash"]' \
  --message "debootstrap --variant=minbase --include=$PACKAGES $SUITE" \
  --quiet "$TARBALL" "$IMAGE" >/dev/null
echo "$IMAGE"
