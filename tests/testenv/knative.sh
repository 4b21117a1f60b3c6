#!/usr/bin/env bash
# Builds Knative Serving's controller, autoscaler and webhook from the pinned Go
# module with the machine's Go, and collects the CRDs and ConfigMaps they
# need from the same modules. Everything lands in
# ~/.cache/gitcanary/knative/serving-<version>/ and is rebuilt only when
# KNATIVE_SERVING_VERSION changes. Prints the cache directory on its last line.
#
# knative-up.sh starts them; scripts/test.sh builds them before the tests.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

root="${GITCANARY_TESTENV_CACHE:-$HOME/.cache/gitcanary}/knative"
cache="$root/serving-${KNATIVE_SERVING_VERSION}"
say() { echo "knative: $*" >&2; }

# A cache from before the webhook was built is completed, not reused.
complete() { [ -f "$cache/.complete" ] && [ -x "$cache/bin/webhook" ]; }
if complete; then
  echo "$cache"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$cache.lock"
flock 9
if complete; then
  echo "$cache"
  exit 0
fi

command -v go >/dev/null || { say "Go is required to build Knative Serving"; exit 1; }
export GOFLAGS="-buildvcs=false -trimpath"
export CGO_ENABLED=0
module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

say "building Knative Serving $KNATIVE_SERVING_VERSION controller, autoscaler and webhook (about 6 minutes the first time)"
serving=$(module_dir "knative.dev/serving@$KNATIVE_SERVING_VERSION")
# The module ships a stub vendor/modules.txt, so it is built from a writable
# copy with -mod=mod (every dependency from the module proxy).
rm -rf "$cache/src"
cp -r "$serving" "$cache/src"
chmod -R u+w "$cache/src"
(cd "$cache/src" && go build -mod=mod -o "$cache/bin/" ./cmd/controller ./cmd/autoscaler ./cmd/webhook)

# CRDs and ConfigMaps, from the modules the build used.
dep_dir() {
  local version
  version=$(cd "$cache/src" && go list -mod=mod -m -f '{{.Version}}' "$1")
  module_dir "$1@$version"
}
networking=$(dep_dir knative.dev/networking)
caching=$(dep_dir knative.dev/caching)
mkdir -p "$cache/crds" "$cache/config" "$cache/webhooks"
cp "$cache/src"/config/core/webhooks/*.yaml "$cache/webhooks/"
cp "$cache/src"/config/core/300-resources/*.yaml "$cache/crds/"
cp "$networking"/config/{certificate,ingress,serverlessservice,domain-claim}.yaml "$cache/crds/"
cp "$caching/config/image.yaml" "$cache/crds/"
cp "$cache/src"/config/core/configmaps/*.yaml "$networking/config/config-network.yaml" "$cache/config/"
chmod -R u+w "$cache/crds" "$cache/config" "$cache/webhooks"
rm -rf "$cache/src"
touch "$cache/.complete"
say "built into $cache"
echo "$cache"
