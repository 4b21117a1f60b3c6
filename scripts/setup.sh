#!/usr/bin/env bash
# Installs what building and testing gitcanary needs and a fresh machine may
# lack (Debian packages; run as root or with sudo). Rust and Go come with the
# machine; the Go toolchain named by Kubernetes' go.mod is fetched by Go itself.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have git || need+=(git)
have curl || need+=(curl)
have openssl || need+=(openssl)
have python3 || need+=(python3)
have flock || need+=(util-linux)
# Knative's autoscaler runs in a network namespace of its own (tests/testenv/knative-up.sh).
have ip || need+=(iproute2)
# kube-proxy in the test gateway's network namespace (tests/testenv/gateway-up.sh).
have iptables-restore || need+=(iptables)
have pkg-config || need+=(pkg-config)
# Signed status commits (ssh-keygen -Y sign/verify) and their tests.
have ssh-keygen || need+=(openssh-client)
have cc || need+=(gcc)
have make || need+=(make)
# libFuzzer (built by libfuzzer-sys for the fuzz targets) is C++.
have c++ || need+=(g++)
[ -x /usr/lib/git-core/git-http-backend ] || need+=(git)
# A real Prometheus for the analysis tests (started by the tests themselves).
have prometheus || need+=(prometheus)
# A real browser for the release page's tests (tests/dashboard.rs).
have chromium || need+=(chromium)
have chromedriver || need+=(chromium-driver)
# git2's HTTPS transport links the system OpenSSL.
pkg-config --exists openssl 2>/dev/null || need+=(libssl-dev)

if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

have cargo || { echo "setup: cargo is missing: install Rust (rustup) first" >&2; exit 1; }
have go || { echo "setup: go is missing: install Go 1.21 or newer (the test control plane is built from Go modules)" >&2; exit 1; }
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
