#!/usr/bin/env bash
# Runs every test: formatting, lints, unit tests, and the integration tests
# against a real local control plane (built and cached on first use).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo "==> $*" >&2; }

# Build artefacts are shared by every clone on this machine (CI clones afresh),
# so a run after the first compiles only what changed. A target directory
# the user chose is theirs: never trimmed, and no lock file is put beside it.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
  cache_budget=keep
  with_cache() { "$@"; }
else
  export CARGO_TARGET_DIR="$HOME/.cache/gitcanary/target"
  cache_budget="${GITCANARY_CACHE_BUDGET_GB:-20}"
  # Held while cargo builds and runs from the cache: no trim empties it then.
  with_cache() { flock -s "$CARGO_TARGET_DIR.lock" "$@"; }
fi

step "checking the tools this needs"
scripts/setup.sh

step "building the test control plane (first run: about 15-20 minutes on 2 cores; cached in ~/.cache/gitcanary/testenv)"
tests/testenv/build.sh >/dev/null

step "building kustomize and helm (first run: about 3 minutes; cached in ~/.cache/gitcanary/renderers)"
renderers=$(scripts/renderers.sh | tail -n 1)
export PATH="$renderers:$PATH"

step "building Knative Serving (first run: about 5 minutes; cached in ~/.cache/gitcanary/knative)"
tests/testenv/knative.sh >/dev/null

step "building the test gateway, Traefik (first run: about 10 minutes; cached in ~/.cache/gitcanary/gateway)"
tests/testenv/gateway.sh >/dev/null

step "keeping the build caches within their budget"
scripts/trim-cache.sh "$CARGO_TARGET_DIR" "$cache_budget" 8

step "cargo fmt --check"
cargo fmt --all --check

step "the shape of src/ and crates/core/src/: no import cycle, no file over 700 lines, no function over 100, a pure planning core"
scripts/shape.py

step "cargo clippy"
with_cache cargo clippy --locked --workspace --all-targets -- -D warnings

step "starting the test control plane, with Knative Serving and the test gateway"
state=$(mktemp -d "${TMPDIR:-/tmp}/gitcanary-test.XXXXXX")
trap 'tests/testenv/down.sh "$state"' EXIT
kubeconfig=$(GITCANARY_TESTENV_PARENT=$$ GITCANARY_TESTENV_KNATIVE=1 GITCANARY_TESTENV_GATEWAY=1 tests/testenv/up.sh "$state" | sed -n 's/^KUBECONFIG=//p')
export GITCANARY_TEST_KUBECONFIG="$kubeconfig"

step "cargo test"
with_cache cargo test --locked --workspace --no-fail-fast

step "fuzzing each target for 10 s (first run: about 8 minutes to build them; cached in ~/.cache/gitcanary/fuzz-target)"
scripts/fuzz.sh 10
