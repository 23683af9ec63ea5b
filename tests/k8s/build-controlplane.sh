#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
# etcd, kwok, optionally helm) from Go modules into a cache folder keyed by versions. Idempotent:
# a rerun with every binary present does nothing. Prints the bin folder on its last line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mod="$here/controlplane"

K8S_VERSION="$(awk '$1=="k8s.io/kubernetes"{print $2; exit}' "$mod/go.mod")"
ETCD_VERSION="$(awk '$1=="go.etcd.io/etcd/server/v3"{print $2; exit}' "$mod/go.mod")"
KWOK_VERSION="${KWOK_VERSION:-v0.7.0}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
BUILD_HELM="${TANDEM_BUILD_HELM:-0}"

cache="${TANDEM_CACHE:-$HOME/.cache/tandem}"
bin="$cache/controlplane/${K8S_VERSION}-${ETCD_VERSION}-${KWOK_VERSION}/bin"
mkdir -p "$bin"
# One build at a time: a second caller (the test session while CI's own build runs) waits, then finds the
# binaries and does nothing.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$bin/../.build.lock"
  flock 9
fi

if ! command -v go >/dev/null 2>&1; then
  echo "build-controlplane: go is not installed" >&2
  exit 2
fi

# 2-core machines are shared: keep the compiler frugal unless told otherwise.
export GOMAXPROCS="${GOMAXPROCS:-2}"
export GOFLAGS="${GOFLAGS:-} -mod=mod -p=${TANDEM_BUILD_JOBS:-2}"
export CGO_ENABLED=0
ldflags="-s -w"

build_k8s() {
  local name="$1" pkg="$2" version="$3"
  if [[ -x "$bin/$name" ]]; then return 0; fi
  echo "build-controlplane: building $name ($version)" >&2
  (cd "$mod" && go build -trimpath -ldflags="$ldflags" -o "$bin/$name.tmp" "$pkg")
  mv "$bin/$name.tmp" "$bin/$name"
}

install_mod() {
  local name="$1" pkg="$2" version="$3"
  if [[ -x "$bin/$name" ]]; then return 0; fi
  echo "build-controlplane: building $name ($version)" >&2
  local tmp
  tmp="$(mktemp -d)"
  # go install pkg@version uses that module's own go.mod (no replace directives needed).
  (cd "$tmp" && GOBIN="$tmp" GOFLAGS="-p=${TANDEM_BUILD_JOBS:-2}" \
     go install -trimpath -ldflags="$ldflags" "$pkg@$version")
  mv "$tmp/$name" "$bin/$name"
  rm -rf "$tmp"
}

# helm first: the chart's unit tests (helm lint and template) look for it while the rest still builds
if [[ "$BUILD_HELM" == "1" ]]; then
  install_mod helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION"
fi
build_k8s etcd ./cmd/etcd "$ETCD_VERSION"
build_k8s kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$K8S_VERSION"
build_k8s kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$K8S_VERSION"
build_k8s kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$K8S_VERSION"
build_k8s kubectl k8s.io/kubernetes/cmd/kubectl "$K8S_VERSION"
install_mod kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"

echo "$bin"
