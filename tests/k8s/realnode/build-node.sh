#!/usr/bin/env bash
# Makes what a real (CPU-only) Kubernetes node needs beside the test control plane: containerd, runc, CNI
# plugins, mmdebstrap and buildah from Debian, and a kubelet built from the same k8s.io/kubernetes module
# version as the control plane (tests/k8s/controlplane/go.mod), cached outside the repo by version.
# Idempotent: a rerun with everything present does nothing. Prints the bin folder on its last line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/../controlplane"
K8S_VERSION="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$mod/go.mod")"
cache="${TANDEM_CACHE:-$HOME/.cache/tandem}"
bin="$cache/realnode/${K8S_VERSION}/bin"
mkdir -p "$bin"

# Debian packages (the node's runtime and the image tools); apt-get update only when something is missing.
need=()
for pair in containerd:containerd runc:runc ctr:containerd mmdebstrap:mmdebstrap buildah:buildah \
            newuidmap:uidmap iptables:iptables nsenter:util-linux; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
[[ -x /usr/lib/cni/bridge ]] || need+=(containernetworking-plugins)
if ((${#need[@]})); then
  if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "build-node: missing ${need[*]} and cannot apt-get install them" >&2
    exit 2
  fi
  echo "build-node: apt-get install ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build-node: go is not installed" >&2
  exit 2
fi
export GOMAXPROCS="${GOMAXPROCS:-2}"
export CGO_ENABLED=0

if [[ ! -x "$bin/kubelet" ]]; then
  echo "build-node: building kubelet ($K8S_VERSION)" >&2
  # A copy of the control plane's module, so the kubelet's extra requirements never touch the tracked go.mod.
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  cp "$mod/go.mod" "$mod/go.sum" "$work/"
  (cd "$work" && GOFLAGS="-mod=mod -p=${TANDEM_BUILD_JOBS:-2}" \
     go build -trimpath -o "$bin/kubelet.tmp" \
       -ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION" \
       k8s.io/kubernetes/cmd/kubelet)
  mv "$bin/kubelet.tmp" "$bin/kubelet"
fi

# The pod sandbox ("pause") process: holds the pod's namespaces and reaps zombies. Built from Go source here,
# since no registry can serve registry.k8s.io/pause.
if [[ ! -x "$bin/pause" ]]; then
  echo "build-node: building pause" >&2
  work2="$(mktemp -d)"
  cp "$here/pause/main.go" "$work2/"
  (cd "$work2" && printf 'module pause\n\ngo 1.22\n' > go.mod && GOFLAGS="-p=${TANDEM_BUILD_JOBS:-2}" \
     go build -trimpath -ldflags="-s -w" -o "$bin/pause.tmp" .)
  mv "$bin/pause.tmp" "$bin/pause"
  rm -rf "$work2"
fi

echo "$bin"
