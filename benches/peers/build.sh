#!/usr/bin/env bash
# Builds the tools users pick instead of gitcanary, from their Go modules at
# the versions below, with the machine's Go: Flux's source-controller and
# kustomize-controller, Argo Rollouts' controller and Flagger, each with the
# CRDs of the same module. Lands in ~/.cache/gitcanary/peers/<name>-<version>/
# (bin/, crds/); rebuilt only when a version changes. For the benchmarks
# only (benches/peers.rs); not part of CI. Prints the cache root last.
#
#   benches/peers/build.sh            # all four
#   benches/peers/build.sh flux       # one: flux, argo-rollouts or flagger
set -euo pipefail

# Pinned: the newest that this machine's Go (1.26) builds from what the
# module proxy serves. source- and kustomize-controller v1.10 need Go 1.27;
# source-controller v1.9.1 to v1.9.6 need github.com/fluxcd/pkg/artifact
# v0.18.1 to v0.18.3, which the proxy refuses (v1.9.0 takes v0.18.0); Argo
# Rollouts v1.10.2 needs Go 1.26.10; Flagger's newest version served is v1.36.1.
SOURCE_CONTROLLER_VERSION=v1.9.0
KUSTOMIZE_CONTROLLER_VERSION=v1.9.6
ARGO_ROLLOUTS_VERSION=v1.10.1
FLAGGER_VERSION=v1.36.1

root="${GITCANARY_TESTENV_CACHE:-$HOME/.cache/gitcanary}/peers"
say() { echo "peers: $*" >&2; }
command -v go >/dev/null || { say "Go is required"; exit 1; }
export GOFLAGS="-buildvcs=false -trimpath"
export CGO_ENABLED=0
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

# Out of cluster, controller-runtime finds no namespace for its leader
# election Lease (it reads the service account's namespace file) and the
# Flux controllers give it none: this names the one their install runs them
# in, RUNTIME_NAMESPACE, which they already read. Nothing else is changed.
flux_lease_namespace() {
  sed -i 's/^\(\s*\)LeaderElectionID:\(\s*\)leaderElectionId,$/&\n\1LeaderElectionNamespace: os.Getenv("RUNTIME_NAMESPACE"),/' main.go
  grep -q 'LeaderElectionNamespace: os.Getenv("RUNTIME_NAMESPACE")' main.go
}

# build NAME MODULE VERSION PACKAGE CRD_GLOB [EDIT]: one binary and its CRDs;
# EDIT, a function run in the module's source before the build, is recorded
# in the cache so that a change of it rebuilds.
build() {
  local name=$1 module=$2 version=$3 package=$4 crds=$5 edit=${6:-}
  local cache="$root/$name-$version" recipe=""
  [ -z "$edit" ] || recipe="$edit $(declare -f "$edit" | sha256sum | cut -c1-16)"
  built() { [ -f "$cache/.complete" ] && [ "$(cat "$cache/.complete")" = "$recipe" ]; }
  built && return 0
  mkdir -p "$cache"
  exec 9>"$cache.lock"
  flock 9
  built && return 0
  say "building $name $version (several minutes the first time)"
  local started=$SECONDS dir
  dir=$(module_dir "$module@$version")
  rm -rf "$cache/src"
  cp -r "$dir" "$cache/src"
  chmod -R u+w "$cache/src"
  (
    cd "$cache/src"
    # A module's nested api module is not in its zip: take the version its go.mod requires.
    for local_replace in $(go mod edit -json | python3 -c 'import json,sys; print(" ".join(r["Old"]["Path"] for r in json.load(sys.stdin).get("Replace") or [] if r["New"]["Path"].startswith(".")))'); do
      go mod edit -dropreplace "$local_replace"
    done
    [ -z "$edit" ] || "$edit"
    go build -mod=mod -o "$cache/bin/$name" "$package"
  )
  mkdir -p "$cache/crds"
  # shellcheck disable=SC2086 # the glob is the point
  cp "$cache"/src/$crds "$cache/crds/"
  rm -rf "$cache/src"
  printf '%s' "$recipe" > "$cache/.complete"
  say "built $name in $((SECONDS - started)) s"
}

want="${1:-all}"
if [ "$want" = all ] || [ "$want" = flux ]; then
  build source-controller github.com/fluxcd/source-controller "$SOURCE_CONTROLLER_VERSION" . "config/crd/bases/*.yaml" flux_lease_namespace
  build kustomize-controller github.com/fluxcd/kustomize-controller "$KUSTOMIZE_CONTROLLER_VERSION" . "config/crd/bases/*.yaml" flux_lease_namespace
fi
if [ "$want" = all ] || [ "$want" = argo-rollouts ]; then
  build argo-rollouts github.com/argoproj/argo-rollouts "$ARGO_ROLLOUTS_VERSION" ./cmd/rollouts-controller "manifests/crds/*-crd.yaml"
fi
if [ "$want" = all ] || [ "$want" = flagger ]; then
  build flagger github.com/fluxcd/flagger "$FLAGGER_VERSION" ./cmd/flagger artifacts/flagger/crd.yaml
fi
echo "$root"
