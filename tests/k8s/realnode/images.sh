#!/usr/bin/env bash
# Builds the real node's images without a registry or Docker, cached outside the repo by the hash of their
# inputs: a Debian bookworm base with Python 3.11 (mmdebstrap, then buildah), the pod sandbox ("pause")
# image, and (with `all`) the operator and worker images from images/*.Dockerfile. Each is written as an
# OCI archive (uncompressed) that the node imports into containerd. Idempotent.
# Usage: images.sh PAUSE_BIN [operator] [worker]   (the base and pause images are always made)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
pause_bin="$1"
shift
cache="${TANDEM_CACHE:-$HOME/.cache/tandem}/realnode/images"
mkdir -p "$cache"
# buildah's own storage lives in the cache too, so nothing is left in the system's /var/lib/containers.
store=(--root "$cache/buildah-root" --runroot "$cache/buildah-run" --storage-driver overlay)
B() { buildah "${store[@]}" "$@"; }
# buildah leaves /etc/cni/net.d/cni.lock behind even with --network host: remove it if this run made it
cleanup_cni() {
  if [[ -f /etc/cni/net.d/cni.lock && "$(find /etc/cni | wc -l)" == 3 ]]; then rm -rf /etc/cni; fi
}
[[ -e /etc/cni ]] || trap cleanup_cni EXIT

sha() { sha256sum | cut -c1-16; }

# --- base: Debian bookworm + python3.11 in a venv on PATH (what the Dockerfiles' python:3.11-slim gives) ---
# Debian's pip (in the venv) trusts the system CA bundle; the builds below mount the build host's bundle over
# it, so a TLS-intercepting proxy on the build host works, and nothing of the host is baked into an image.
base_key="$( { sed -n '/^# --- base/,/^# --- end base/p' "$0"; } | sha)"
BASE="localhost/tandem/base:$base_key"
if [[ ! -f "$cache/base-$base_key.oci.tar" ]]; then
  echo "images: building $BASE (mmdebstrap)" >&2
  tmp="$(mktemp -d)"
  mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python3-pip,ca-certificates,passwd,procps \
    --customize-hook='chroot "$1" python3 -m venv /usr/local/python' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$tmp/rootfs.tar" < /dev/null
  c="$(B from scratch)"
  B add "$c" "$tmp/rootfs.tar" / >/dev/null
  B config --env PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$c"
  B commit --quiet "$c" "$BASE" >/dev/null
  B rm "$c" >/dev/null
  # the Dockerfiles name python:3.11-slim; this base stands in for it (and for the CUDA base on CPU)
  B tag "$BASE" docker.io/library/python:3.11-slim
  B push --quiet --disable-compression "$BASE" "oci-archive:$cache/base-$base_key.oci.tar.tmp:$BASE"
  mv "$cache/base-$base_key.oci.tar.tmp" "$cache/base-$base_key.oci.tar"
  rm -rf "$tmp"
fi
# --- end base

# --- pause: one static binary ---
pause_key="$(sha < "$pause_bin")"
PAUSE="localhost/tandem/pause:$pause_key"
if [[ ! -f "$cache/pause-$pause_key.oci.tar" ]]; then
  echo "images: building $PAUSE" >&2
  c="$(B from scratch)"
  B copy "$c" "$pause_bin" /pause
  B config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  B commit --quiet "$c" "$PAUSE" >/dev/null
  B rm "$c" >/dev/null
  B push --quiet --disable-compression "$PAUSE" "oci-archive:$cache/pause-$pause_key.oci.tar.tmp:$PAUSE"
  mv "$cache/pause-$pause_key.oci.tar.tmp" "$cache/pause-$pause_key.oci.tar"
fi

echo "BASE=$BASE $cache/base-$base_key.oci.tar"
echo "PAUSE=$PAUSE $cache/pause-$pause_key.oci.tar"

# --- the project's images from its own Dockerfiles, keyed by the Dockerfile, the base and every file the
# Dockerfiles COPY (tracked or not). Layers are cached in buildah's store, so a source change rebuilds from
# the COPY on, never the torch layer. TANDEM_REALNODE_REUSE_IMAGES=1 takes the newest cached build of an
# image when the exact one is missing (for iterating by hand; the image then lags the working tree).
src_key() {
  (cd "$root" && { cat "$1"; echo "$base_key";
    find pyproject.toml README.md tandem operator worker protos -type f ! -name '*.pyc' ! -path '*/__pycache__/*' \
      -print0 | sort -z | xargs -0 sha256sum; } | sha)
}
# pip's own index (whatever this machine's pip is configured with), for the worker's torch on CPU
index="${PIP_INDEX_URL:-$(python3 -m pip config get global.index-url 2>/dev/null || true)}"
index="${index:-$(python3 -c 'from pip._internal.models.index import PyPI; print(PyPI.simple_url)')}"
for name in "$@"; do
  df="images/$name.Dockerfile"
  key="$(src_key "$df")"
  ref="localhost/tandem/$name:$key"
  archive="$cache/$name-$key.oci.tar"
  if [[ ! -f "$archive" && "${TANDEM_REALNODE_REUSE_IMAGES:-0}" == 1 ]]; then
    newest="$(ls -t "$cache/$name"-*.oci.tar 2>/dev/null | head -1 || true)"
    if [[ -n "$newest" ]]; then
      key="$(basename "$newest" .oci.tar)"; key="${key#"$name"-}"
      ref="localhost/tandem/$name:$key"; archive="$newest"
      echo "images: reusing $ref (built from an older tree)" >&2
    fi
  fi
  if [[ ! -f "$archive" ]]; then
    echo "images: building $ref from $df" >&2
    args=(--build-arg "CUDA_IMAGE=$BASE")
    [[ $name == worker ]] && args+=(--build-arg "TORCH_INDEX=$index")
    (cd "$root" && B bud --quiet -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro \
       --isolation chroot --network host --pull-never --layers=true "${args[@]}" -f "$df" -t "$ref" . >/dev/null)
    B push --quiet --disable-compression "$ref" "oci-archive:$archive.tmp:$ref"
    mv "$archive.tmp" "$archive"
  fi
  echo "${name^^}=$ref $archive"
done
