#!/usr/bin/env bash
# Fuzzes the inputs that come from outside (webhook payloads and signatures,
# manifests, pull-request comments and analysis conditions, whole
# repositories through load, validate and plan) with libFuzzer, each target
# for SECONDS (default 60). Runs on the stable toolchain: the targets are
# built with the coverage instrumentation libFuzzer reads (what cargo-fuzz
# passes, with no sanitizer), so neither nightly nor cargo-fuzz is needed.
# CI runs it briefly (scripts/test.sh); a finding fails it and leaves the
# input in fuzz/artifacts/TARGET/.
#   ./scripts/fuzz.sh [SECONDS [TARGET...]]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("${@:-webhook_payload manifest_loader pr_command pipeline}")
host=$(rustc -vV | sed -n 's/^host: //p')
if [ -n "${GITCANARY_FUZZ_TARGET_DIR:-}" ]; then
  # A directory the user chose is theirs: never trimmed.
  export CARGO_TARGET_DIR="$GITCANARY_FUZZ_TARGET_DIR"
  scripts/trim-cache.sh "$CARGO_TARGET_DIR" keep 4
else
  export CARGO_TARGET_DIR="$HOME/.cache/gitcanary/fuzz-target"
  scripts/trim-cache.sh "$CARGO_TARGET_DIR" "${GITCANARY_FUZZ_CACHE_BUDGET_GB:-10}" 4
  # Held while this builds and runs the targets: no trim empties the cache then.
  exec 9>>"$CARGO_TARGET_DIR.lock"
  flock -s 9
fi
# --target: the flags reach the targets and gitcanary, not build scripts.
RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares" \
  cargo build --locked --manifest-path fuzz/Cargo.toml --target "$host" --bins
# The pipeline target starts from real repositories: the quickstart example
# and each bad-input case, files joined by NUL bytes.
mkdir -p fuzz/corpus/pipeline
find examples/quickstart -name '*.yaml' -print0 | sort -z | xargs -0 -I{} sh -c 'cat "{}"; printf "\0"' > fuzz/corpus/pipeline/quickstart
for case in tests/corpus/*.yaml; do
  { cat examples/quickstart/echoserver/*.yaml; printf '\0'; cat "$case"; } > "fuzz/corpus/pipeline/$(basename "$case" .yaml)"
done
for target in ${targets[*]}; do
  echo "== $target for ${seconds}s"
  mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
  # What fuzzing finds here are panics, hangs and memory blow-ups (gitcanary
  # has no unsafe code), which libFuzzer reports by itself. A hang is a unit
  # over 60 s: the pipeline's YAML-bomb seed takes 5 s in this unoptimised,
  # instrumented build on a quiet machine and 11 s beside two other builds.
  log="fuzz/artifacts/$target/last-run.log"
  if ! "$CARGO_TARGET_DIR/$host/debug/$target" "fuzz/corpus/$target" \
    -artifact_prefix="fuzz/artifacts/$target/" -max_total_time="$seconds" \
    -rss_limit_mb=4096 -max_len=65536 -timeout=60 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz target $target found a problem: the input is in fuzz/artifacts/$target/" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units' "$log" || true
done
