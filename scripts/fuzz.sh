#!/usr/bin/env bash
# Fuzzes the inputs that come from outside (webhook payloads and signatures,
# manifests, pull-request comments and analysis conditions) with cargo-fuzz
# (libFuzzer), each target for SECONDS (default 60). Not part of CI.
#   ./scripts/fuzz.sh [SECONDS [TARGET...]]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("${@:-webhook_payload manifest_loader pr_command pipeline}")
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gitcanary/fuzz-target}"
# The pipeline target starts from real repositories: the quickstart example
# and each bad-input case, files joined by NUL bytes.
mkdir -p fuzz/corpus/pipeline
find examples/quickstart -name '*.yaml' -print0 | sort -z | xargs -0 -I{} sh -c 'cat "{}"; printf "\0"' > fuzz/corpus/pipeline/quickstart
for case in tests/corpus/*.yaml; do
  { cat examples/quickstart/echoserver/*.yaml; printf '\0'; cat "$case"; } > "fuzz/corpus/pipeline/$(basename "$case" .yaml)"
done
for target in ${targets[*]}; do
  echo "== $target for ${seconds}s"
  mkdir -p "fuzz/corpus/$target"
  # No sanitizer: gitcanary has no unsafe code; what fuzzing finds here are
  # panics, hangs and memory blow-ups, which libFuzzer reports by itself.
  cargo +nightly fuzz run --dev --sanitizer none "$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536
done
