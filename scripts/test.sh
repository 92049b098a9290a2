#!/usr/bin/env bash
# The README's second command: the whole test suite. Installs what the tests need (tools for
# the emulated-network tests, the nightly fuzzer), then: formatting, lints, unit and
# integration tests of every crate (emulated-WAN tests run when root and /dev/net/tun allow,
# and say so when they skip), and a short run of every fuzz target.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  need=()
  command -v ip >/dev/null || need+=(iproute2)
  command -v iperf3 >/dev/null || need+=(iperf3)
  command -v ping >/dev/null || need+=(iputils-ping)
  command -v sha256sum >/dev/null || need+=(coreutils)
  command -v mount >/dev/null || need+=(mount)
  if [ ${#need[@]} -gt 0 ]; then
    echo "test: installing ${need[*]}"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
  fi
fi

if [ "$(id -u)" = 0 ] && [ -z "${HAUL_TEST_POSTGRES_URL:-}" ]; then
  # The catalog's conformance suite also runs against PostgreSQL.
  export HAUL_TEST_POSTGRES_URL="$(bash scripts/pg-test.sh)"
  trap 'bash scripts/pg-test.sh stop' EXIT
  echo "test: PostgreSQL for the catalog tests at $HAUL_TEST_POSTGRES_URL"
fi

echo "== format"
cargo fmt --all -- --check
echo "== lints"
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "== tests"
cargo test --locked --workspace
echo "== fuzz (short runs of every target)"
if cargo +nightly --version >/dev/null 2>&1; then
  command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
  (cd fuzz && cargo +nightly fuzz build)
  for t in $(cd fuzz && cargo +nightly fuzz list); do
    (cd fuzz && cargo +nightly fuzz run "$t" -- -max_total_time="${FUZZ_SECONDS:-15}" -rss_limit_mb=2048 >/tmp/fuzz-$t.log 2>&1) \
      || { echo "fuzz target $t failed:"; tail -30 /tmp/fuzz-$t.log; exit 1; }
    echo "fuzz $t: $(grep -o 'Done [0-9]* runs' /tmp/fuzz-$t.log)"
  done
else
  echo "fuzz: SKIPPED (no nightly toolchain: install it with rustup toolchain install nightly)"
fi
echo "== all tests passed in $(( $(date +%s) - start )) s"
