#!/usr/bin/env bash
# Keeps a build cache that every clone on this machine shares within its
# budget, before a build: when the dependencies or the toolchain change, each
# of gitcanary's test binaries is built under a new name and the old one
# stays, so the cache only grows, and a link on a full disk dies of SIGBUS
# with no word about space. Over the budget, the incremental state goes
# first (only gitcanary's own crates recompile); if that is not enough,
# everything in the cache (the next build is a first build). Then it warns
# when the disk has less free space than a build from nothing needs.
#
# BUDGET_GB "keep" only warns: a directory the user chose (their own
# CARGO_TARGET_DIR, perhaps shared by other projects) is never emptied.
# A build holds DIR.lock shared while it uses the cache (`with_cache`
# below); the trim takes it exclusive, and skips when another build holds it.
#   scripts/trim-cache.sh DIR BUDGET_GB|keep NEEDED_GB
set -euo pipefail
dir="$1"
budget_gb="$2"
needed_gb="$3"

# A build beside this one may remove files as du reads: it still totals
# the rest. -D: a cache moved to another disk by a symlink is measured there.
size_gb() {
  local total
  total=$({ du -sD --block-size=1G "$1" 2>/dev/null || true; } | cut -f1)
  echo "${total:-0}"
}
free_gb() { df --output=avail --block-size=1G "$1/" | tail -n 1 | tr -d ' '; }

trim() {
  local size
  size=$(size_gb "$dir")
  [ "$size" -gt "$budget_gb" ] || return 0
  echo "build cache $dir holds ${size} GB, over its budget of ${budget_gb} GB: removing its incremental state" >&2
  find "$dir/" -maxdepth 3 -type d -name incremental -prune -exec rm -rf {} + || true
  size=$(size_gb "$dir")
  [ "$size" -gt "$budget_gb" ] || return 0
  echo "build cache $dir still holds ${size} GB: emptying it, so this build starts from nothing" >&2
  find "$dir/" -mindepth 1 -maxdepth 1 -exec rm -rf {} + || true
}

mkdir -p "$dir"
if [ "$budget_gb" != keep ]; then
  exec 9>>"$dir.lock"
  if flock -n -x 9; then
    trim
    flock -u 9
  else
    echo "build cache $dir is in use by another build: not trimmed this time" >&2
  fi
  exec 9>&-
fi

free=$(free_gb "$dir" 2>/dev/null || echo "$needed_gb")
if [ "$free" -lt "$needed_gb" ]; then
  echo "warning: ${free} GB free where $dir lives; a build from nothing needs about ${needed_gb} GB, and a link on a full disk fails with SIGBUS" >&2
fi
