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
    bookworm "$tmp/rootfs.tar" http://deb.debian.org/debian
  c="$(B from scratch)"
  B add "$c" "$tmp/rootfs.tar" /
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

# --- the project's images from its own Dockerfiles, keyed by the Dockerfile, the sources and the base ---
src_key() {
  (cd "$root" && { cat "$1"; echo "$base_key"; git ls-files -s pyproject.toml README.md tandem operator worker protos;
                   git diff HEAD -- pyproject.toml README.md tandem operator worker protos; } | sha)
}
for name in "$@"; do
  df="images/$name.Dockerfile"
  key="$(src_key "$df")"
  ref="localhost/tandem/$name:$key"
  if [[ ! -f "$cache/$name-$key.oci.tar" ]]; then
    echo "images: building $ref from $df" >&2
    args=(--build-arg "CUDA_IMAGE=$BASE")
    # the worker on CPU: torch from PyPI (no other index is reachable here)
    [[ $name == worker ]] && args+=(--build-arg "TORCH_INDEX=https://pypi.org/simple")
    (cd "$root" && B bud --quiet -v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro --isolation chroot --network host --pull-never --layers=false \
       "${args[@]}" -f "$df" -t "$ref" . >/dev/null)
    B push --quiet --disable-compression "$ref" "oci-archive:$cache/$name-$key.oci.tar.tmp:$ref"
    mv "$cache/$name-$key.oci.tar.tmp" "$cache/$name-$key.oci.tar"
  fi
  echo "${name^^}=$ref $cache/$name-$key.oci.tar"
done
