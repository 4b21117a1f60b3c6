#!/usr/bin/env bash
# Builds kustomize and helm from their Go modules, at the versions pinned in
# renderers.env, into ~/.cache/gitcanary/renderers/<versions>/bin (about two
# minutes the first time; rebuilt only when a version changes). Prints that
# bin directory on its last line: put it on PATH, or pass --kustomize/--helm.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=renderers.env
source "$here/renderers.env"

root="${GITCANARY_RENDERERS_CACHE:-$HOME/.cache/gitcanary/renderers}"
cache="$root/kustomize-${KUSTOMIZE_VERSION}_helm-${HELM_VERSION}"
bin="$cache/bin"
say() { echo "renderers: $*" >&2; }

complete() { [ -f "$cache/.complete" ] && [ -x "$bin/kustomize" ] && [ -x "$bin/helm" ]; }
if complete; then
  echo "$bin"
  exit 0
fi

mkdir -p "$bin"
exec 9>"$cache.lock"
flock 9
if complete; then
  echo "$bin"
  exit 0
fi

command -v go >/dev/null || { say "Go is required to build kustomize and helm (apt-get install golang, or the machine's Go)"; exit 1; }
export GOFLAGS="-buildvcs=false -trimpath" CGO_ENABLED=0 GOBIN="$bin"
say "building kustomize $KUSTOMIZE_VERSION"
go install -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
say "building helm $HELM_VERSION"
go install -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
"$bin/kustomize" version >/dev/null
"$bin/helm" version --short >/dev/null
touch "$cache/.complete"
echo "$bin"
