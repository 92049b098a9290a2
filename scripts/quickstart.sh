#!/usr/bin/env bash
# The README's first command: installs what longhaul needs, builds and installs `haul`, and runs
# the demo (two TLS sites on loopback, a climate-like dataset uploaded, copied site to site,
# downloaded and verified). Extra arguments go to `haul demo` (e.g. no --exit keeps the sites up).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cc >/dev/null || need_apt+=(build-essential)
command -v ip >/dev/null || need_apt+=(iproute2)
command -v pkg-config >/dev/null || need_apt+=(pkg-config)
if [ ${#need_apt[@]} -gt 0 ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "quickstart: installing ${need_apt[*]}"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "quickstart: cargo not found; install Rust from https://rustup.rs and run this again" >&2
  exit 1
fi

echo "quickstart: building haul (release)"
cargo build --release --locked -p haul
# Where cargo put it (CARGO_TARGET_DIR moves it), into a directory created when missing.
mkdir -p "${HAUL_INSTALL_DIR:-$HOME/.cargo/bin}"
install -m 0755 "${CARGO_TARGET_DIR:-target}/release/haul" "${HAUL_INSTALL_DIR:-$HOME/.cargo/bin}/haul"
echo "quickstart: installed $(command -v haul || echo "${HAUL_INSTALL_DIR:-$HOME/.cargo/bin}/haul")"
echo
if [ $# -eq 0 ]; then set -- --exit; fi
exec "${CARGO_TARGET_DIR:-target}/release/haul" demo "$@"
