#!/usr/bin/env bash
# Builds the test control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kube-proxy, kwok) from pinned Go modules with the machine's Go, and
# collects the Gateway API standard CRDs. Everything lands in
# ~/.cache/gitcanary/testenv/<versions>/ (CRDs beside it, by Gateway API
# version) and is rebuilt only when versions.env changes. Prints the cache
# directory on its last line; its crds/gateway-api links to the CRDs.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

root="${GITCANARY_TESTENV_CACHE:-$HOME/.cache/gitcanary/testenv}"
cache="$root/k8s-${KUBE_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"
crds="$root/gateway-api-${GATEWAY_API_VERSION}"
bin="$cache/bin"
say() { echo "testenv: $*" >&2; }
# A cache from before kube-proxy was built is completed, not reused.
complete() { [ -f "$cache/.complete" ] && [ -x "$bin/kubectl" ] && [ -x "$bin/kube-proxy" ] && [ -d "$cache/kwok" ] && [ -d "$crds" ]; }

if complete; then
  echo "$cache"
  exit 0
fi

# One builder at a time; a second caller waits and then finds the cache filled.
mkdir -p "$cache"
exec 9>"$cache.lock"
flock 9
if complete; then
  echo "$cache"
  exit 0
fi

command -v go >/dev/null || { say "Go is required to build the control plane (apt-get install golang, or the machine's Go)"; exit 1; }
mkdir -p "$bin" "$cache/src"
export GOFLAGS="${GOFLAGS:--buildvcs=false} -trimpath"
export CGO_ENABLED=0

staging_version="v0${KUBE_VERSION#v1}"

build_kubernetes() {
  local dir="$cache/src/kubernetes"
  mkdir -p "$dir"
  say "building kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubectl $KUBE_VERSION (several minutes the first time)"
  (
    cd "$dir"
    go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" >/dev/null
    local kdir
    kdir=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    {
      echo "module gitcanary.test/controlplane"
      echo
      grep -E '^go [0-9]' "$kdir/go.mod"
      echo
      echo "require k8s.io/kubernetes $KUBE_VERSION"
      echo
      echo "replace ("
      # The staging modules are published as v0.x releases of the same tree.
      sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\1#p' "$kdir/go.mod" |
        while read -r m; do echo "	$m => $m $staging_version"; done
      echo ")"
    } > go.mod
    cat > tools.go <<'EOF'
//go:build tools

package controlplane

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
EOF
    go mod tidy >/dev/null
    for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl kube-proxy; do
      [ -x "$bin/$cmd" ] && continue
      say "  go build $cmd"
      go build -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBE_VERSION" | cut -d. -f2)" \
        -o "$bin/$cmd" "k8s.io/kubernetes/cmd/$cmd"
    done
  )
}

build_etcd() {
  local dir="$cache/src/etcd"
  mkdir -p "$dir"
  say "building etcd $ETCD_VERSION"
  (
    cd "$dir"
    cat > go.mod <<EOF
module gitcanary.test/etcd

go 1.24

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
    cat > main.go <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
    go mod tidy >/dev/null
    go build -ldflags "-s -w" -o "$bin/etcd" .
  )
}

build_kwok() {
  say "building kwok $KWOK_VERSION"
  GOBIN="$bin" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
}

kwok_node_stages() {
  # Node stages as kwokctl uses them: initialise, then heartbeat through a Lease.
  local kdir
  kdir=$(cd "$cache/src" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  mkdir -p "$cache/kwok"
  { cat "$kdir/kustomize/stage/node/fast/node-initialize.yaml"; echo "---"
    cat "$kdir/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml"; } >"$cache/kwok/node-stages.yaml"
}

gateway_crds() {
  say "collecting Gateway API $GATEWAY_API_VERSION standard CRDs"
  local gdir
  gdir=$(cd "$cache/src" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  mkdir -p "$crds"
  cp "$gdir"/config/crd/standard/*.yaml "$crds/"
  chmod -R u+w "$crds"
}

[ -x "$bin/etcd" ] || build_etcd
[ -x "$bin/kube-apiserver" ] && [ -x "$bin/kube-controller-manager" ] && [ -x "$bin/kube-scheduler" ] && [ -x "$bin/kubectl" ] && [ -x "$bin/kube-proxy" ] || build_kubernetes
[ -x "$bin/kwok" ] || build_kwok
[ -d "$cache/kwok" ] || kwok_node_stages
[ -d "$crds" ] || gateway_crds
mkdir -p "$cache/crds"
ln -sfn "$crds" "$cache/crds/gateway-api"
touch "$cache/.complete"
say "control plane ready in $cache"
echo "$cache"
