#!/usr/bin/env bash
# Builds the test gateway, Traefik, from its pinned Go module with the
# machine's Go into ~/.cache/gitcanary/gateway/traefik-<version>/bin/traefik;
# rebuilt only when TRAEFIK_VERSION changes. Prints the binary's path on its
# last line. Its go.mod has replace directives, so `go install …@version`
# refuses it: it is built inside a writable copy of the module.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

root="${GITCANARY_TESTENV_CACHE:-$HOME/.cache/gitcanary}/gateway"
cache="$root/traefik-${TRAEFIK_VERSION}"
say() { echo "gateway: $*" >&2; }

if [ -f "$cache/.complete" ]; then
  echo "$cache/bin/traefik"
  exit 0
fi
mkdir -p "$cache"
exec 9>"$cache.lock"
flock 9
if [ -f "$cache/.complete" ]; then
  echo "$cache/bin/traefik"
  exit 0
fi

command -v go >/dev/null || { say "Go is required to build Traefik"; exit 1; }
export GOFLAGS="-buildvcs=false -trimpath"
export CGO_ENABLED=0
say "building Traefik $TRAEFIK_VERSION (about 10 minutes the first time)"
module=$(go mod download -json "github.com/traefik/traefik/v3@$TRAEFIK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
rm -rf "$cache/src"
cp -r "$module" "$cache/src"
chmod -R u+w "$cache/src"
(cd "$cache/src" && go build -ldflags="-s -w" -o "$cache/bin/traefik" ./cmd/traefik)
rm -rf "$cache/src"
touch "$cache/.complete"
say "built into $cache"
echo "$cache/bin/traefik"
