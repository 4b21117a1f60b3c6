#!/usr/bin/env bash
# Fuzzes the inputs that come from outside (webhook payloads and signatures,
# manifests, pull-request comments and analysis conditions) with cargo-fuzz
# (libFuzzer), each target for SECONDS (default 60). Not part of CI.
#   ./scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gitcanary/fuzz-target}"
for target in webhook_payload manifest_loader pr_command; do
  echo "== $target for ${seconds}s"
  mkdir -p "fuzz/corpus/$target"
  # No sanitizer: gitcanary has no unsafe code; what fuzzing finds here are
  # panics, hangs and memory blow-ups, which libFuzzer reports by itself.
  cargo +nightly fuzz run --dev --sanitizer none "$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=4096 -max_len=65536
done
