#!/usr/bin/env bash
# The README's second command: the whole test suite. Installs what the tests need (tools for
# the emulated-network tests, a private PostgreSQL for the catalog's conformance suite), then
# runs every step to the end even when one fails: formatting, unit and integration tests of
# every crate (`--no-fail-fast`) built through clippy's driver, so that the same build gives
# the lints (any warning fails them), and a short run of every fuzz target. It ends with a
# summary: tests passed, failed (named) and skipped (named, with the reason).
#
# A test that cannot run here (not root, no TUN device, no PostgreSQL, no account `nobody`)
# says so through the `testkit` crate and is listed as skipped, never counted as passed. With
# HAUL_REQUIRE_ALL=1 (set by .ci/run: CI runs as root with TUN and PostgreSQL) such a test
# fails instead.
#
# Environment: FUZZ_SECONDS (per fuzz target, default 10; two run at a time), FUZZ_ONLY=1
# (only the fuzz step), HAUL_TEST_BUDGET_S (skip the fuzz step, reported as skipped, when the
# suite's time so far leaves less than 12 minutes of this budget),
# HAUL_TEST_POSTGRES_URL (use this PostgreSQL instead of starting one), HAUL_REQUIRE_ALL.
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
logs=$(mktemp -d /tmp/haul-test.XXXXXX)
export HAUL_SKIP_LOG="$logs/skipped.tsv"
: >"$HAUL_SKIP_LOG"
failed_steps=()

if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  need=()
  command -v ip >/dev/null || need+=(iproute2)
  command -v iperf3 >/dev/null || need+=(iperf3)
  command -v ping >/dev/null || need+=(iputils-ping)
  command -v sha256sum >/dev/null || need+=(coreutils)
  command -v mount >/dev/null || need+=(mount)
  command -v c++ >/dev/null || need+=(g++)
  # The metrics tests check every /metrics page with promtool, Prometheus's own parser.
  command -v promtool >/dev/null || need+=(prometheus)
  # The dashboard's test drives a real browser (headless).
  command -v chromium >/dev/null || need+=(chromium)
  # The OCI image's test builds one with umoci.
  command -v umoci >/dev/null || need+=(umoci)
  # `haul trace plot` draws its text with DejaVu Sans.
  [ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
  # `haul mount`'s tests run real programs on a mount; fuse3 brings fusermount3.
  command -v fusermount3 >/dev/null || need+=(fuse3)
  command -v rsync >/dev/null || need+=(rsync)
  command -v pip3 >/dev/null || command -v pip >/dev/null || need+=(python3-pip)
  if [ ${#need[@]} -gt 0 ]; then
    echo "test: installing ${need[*]}"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
  fi
fi

# The mount's tests read a netCDF file with Python's netCDF4 (from PyPI), as a climate
# scientist's script would.
if ! python3 -c "import netCDF4" 2>/dev/null; then
  echo "test: installing netCDF4 (PyPI)"
  python3 -m pip install -q netCDF4 >/dev/null 2>&1 ||
    python3 -m pip install -q --break-system-packages netCDF4 >/dev/null 2>&1 ||
    echo "test: could not install netCDF4; the mount's netCDF test will say so"
fi

# The mount's POSIX test runs fsx, the File System eXerciser (crates.io), built once into
# target/tools.
if ! command -v fsx >/dev/null && [ ! -x target/tools/bin/fsx ]; then
  echo "test: installing fsx (cargo install fsx into target/tools)"
  cargo install -q --locked fsx --version 0.3.2 --root target/tools >/dev/null 2>&1 ||
    echo "test: could not install fsx; the mount's fsx test will say so"
fi

if [ "$(id -u)" = 0 ] && [ -z "${HAUL_TEST_POSTGRES_URL:-}" ]; then
  # The catalog's conformance suite also runs against PostgreSQL.
  if url=$(bash scripts/pg-test.sh); then
    export HAUL_TEST_POSTGRES_URL="$url"
    trap 'bash scripts/pg-test.sh stop' EXIT
    echo "test: PostgreSQL for the catalog tests at $HAUL_TEST_POSTGRES_URL"
  else
    echo "test: could not start PostgreSQL (scripts/pg-test.sh); its tests will say so"
  fi
fi

# The build (lints, tests, fuzz targets) takes about 4 GiB under target/ and fuzz/target/; a
# disk that fills up fails it in the linker with "No space left on device". Say so first.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((6 * 1024 * 1024)) ]; then
  echo "test: warning: only $((free_kib / 1024)) MiB free on this disk; the build needs about 4 GiB (cargo clean elsewhere?)"
fi

step() {
  local name=$1
  shift
  echo "== $name"
  if ! "$@"; then
    failed_steps+=("$name")
    echo "== $name: FAILED"
  fi
}

# Lints and tests share one build: clippy's driver compiles the workspace's crates (as
# `cargo clippy` does, but producing the test binaries too), so the dependencies are compiled
# once, not once for `cargo clippy` and again for `cargo test` (on a slow 2-core VM the cold
# `cargo clippy` alone had run over 25 minutes, and the combined build took 52; see the
# dependency profiles in Cargo.toml for what keeps it shorter). Its warnings (clippy's and
# rustc's) do not stop the build, so that the tests
# still run: each crate that has any prints "generated N warnings", and the lints step fails.
# `cargo test` builds what `clippy --all-targets` checks (libraries, binaries, tests and
# examples, each with and without cfg(test)); the workspace has no bench targets.
tests() {
  local driver
  driver=$(rustup which clippy-driver 2>/dev/null || command -v clippy-driver) || {
    echo "test: clippy-driver not found (rustup component add clippy): tests built without lints"
    driver=""
  }
  RUSTC_WORKSPACE_WRAPPER="$driver" cargo test --locked --workspace --features haul/fault-injection \
    --no-fail-fast 2>&1 | tee "$logs/tests.log"
  local rc=${PIPESTATUS[0]}
  lint_warnings=$(grep -E '^warning: .* generated [0-9]+ warnings?' "$logs/tests.log" || true)
  [ -n "$driver" ] || lint_warnings="clippy-driver missing: the lints did not run"
  return "$rc"
}

lints() {
  if [ -n "$lint_warnings" ]; then
    echo "$lint_warnings"
    echo "(the warnings themselves are in $logs/tests.log; \`cargo clippy --workspace --all-targets --features haul/fault-injection\` shows them alone)"
    return 1
  fi
  echo "no warnings from clippy or rustc in the workspace's crates"
}

# The fuzz targets are built the way cargo-fuzz builds them (libFuzzer with the compiler's
# coverage instrumentation) but on the stable toolchain and without AddressSanitizer, which
# needs nightly: the decoders are safe Rust, so what the fuzzer finds is a panic, which
# libFuzzer reports as a crash either way. `cargo +nightly fuzz run TARGET` still works for
# longer runs with ASan.
fuzz() {
  local triple flags bin t ok=0
  triple=$(rustc -vV | sed -n 's/^host: //p')
  flags="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
  flags="$flags -Cllvm-args=-sanitizer-coverage-inline-8bit-counters"
  flags="$flags -Cllvm-args=-sanitizer-coverage-pc-table"
  flags="$flags -Cllvm-args=-sanitizer-coverage-trace-compares"
  flags="$flags --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
  local t0=$SECONDS
  (cd fuzz && RUSTFLAGS="$flags" cargo build --release --locked --bins --target "$triple") || return 1
  echo $((SECONDS - t0)) >"$logs/fuzz-build.time"
  bin=fuzz/target/$triple/release
  # Two targets at a time (the machine's two cores), each for FUZZ_SECONDS.
  local running=()
  for t in $(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^haul-fuzz$'); do
    mkdir -p "fuzz/corpus/$t"
    (
      "$bin/$t" "fuzz/corpus/$t" -max_total_time="${FUZZ_SECONDS:-10}" -rss_limit_mb=2048 \
        -artifact_prefix="$logs/fuzz-$t-" >"$logs/fuzz-$t.log" 2>&1
      echo $? >"$logs/fuzz-$t.rc"
    ) &
    running+=($!)
    if [ ${#running[@]} -ge 2 ]; then
      wait "${running[0]}"
      running=("${running[@]:1}")
    fi
  done
  wait
  for rc in "$logs"/fuzz-*.rc; do
    t=$(basename "$rc" .rc)
    t=${t#fuzz-}
    if [ "$(cat "$rc")" = 0 ]; then
      echo "fuzz $t: $(grep -o 'Done [0-9]* runs' "$logs/fuzz-$t.log")"
    else
      echo "fuzz target $t FAILED (log $logs/fuzz-$t.log):"
      tail -30 "$logs/fuzz-$t.log"
      ok=1
    fi
  done
  return $ok
}

lint_warnings=""
if [ "${FUZZ_ONLY:-}" != 1 ]; then
  step format cargo fmt --all -- --check
  step tests tests
  step lints lints
fi
# A time budget (HAUL_TEST_BUDGET_S, which `.ci/run` sets below its limit): the fuzz step
# builds its own instrumented copy of the decoders and their dependencies (7 min 20 s, then
# 45 s of fuzzing, on a slow 2-core VM whose cold test build took 52 min; 12 minutes leave a
# margin for a slower one). When what is left of the budget could not hold it,
# the step is reported as skipped (never as passed) rather than cut off with everything else.
skipped_steps=()
fuzz_needs=$((12 * 60))
elapsed=$(($(date +%s) - start))
if [ -n "${HAUL_TEST_BUDGET_S:-}" ] && [ $((elapsed + fuzz_needs)) -gt "$HAUL_TEST_BUDGET_S" ]; then
  echo "== fuzz: SKIPPED: the suite has run ${elapsed} s of its ${HAUL_TEST_BUDGET_S} s budget and the fuzz step may take ${fuzz_needs} s (run it alone, without a budget: FUZZ_ONLY=1 bash scripts/test.sh)"
  skipped_steps+=("fuzz (time budget: ${elapsed} s of ${HAUL_TEST_BUDGET_S} s used before it)")
else
  step fuzz fuzz
fi

# Summary. libtest prints one `test NAME ... ok|FAILED|ignored` line per test; a test that
# skipped itself printed `ok` and is in $HAUL_SKIP_LOG.
echo
echo "== summary ($(($(date +%s) - start)) s; logs in $logs)"
[ -f "$logs/tests.log" ] || : >"$logs/tests.log"
# How long the build took (cargo's own line), apart from the tests' run time: on a slow
# machine the cold build is most of the suite's time.
grep -m1 -E '^ *Finished `test` profile' "$logs/tests.log" | sed -E 's/^ *Finished /build: /'
for f in "$logs"/fuzz-build.time; do [ -f "$f" ] && echo "fuzz build: $(cat "$f") s"; done
ok=$(grep -cE '^test .* \.\.\. ok$' "$logs/tests.log")
failed=$(grep -E '^test .* \.\.\. FAILED$' "$logs/tests.log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/')
ignored=$(grep -cE '^test .* \.\.\. ignored' "$logs/tests.log")
skipped=$(sort -u "$HAUL_SKIP_LOG" | grep -c . || true)
echo "passed:  $((ok - skipped))"
if [ -n "$failed" ]; then
  echo "failed:  $(echo "$failed" | grep -c .)"
  echo "$failed" | sed 's/^/  - /'
else
  echo "failed:  0"
fi
# A test binary that crashed or could not be built names no test: say which one.
grep -E '^error: (test failed|could not compile)' "$logs/tests.log" | sed 's/^/  /'
echo "skipped: $skipped"
sort -u "$HAUL_SKIP_LOG" | awk -F '\t' '{ printf "  - %s (%s): %s\n", $2, $1, $3 }'
[ "$ignored" -gt 0 ] && echo "ignored: $ignored (#[ignore])"
if [ ${#skipped_steps[@]} -gt 0 ]; then
  echo "steps skipped: ${#skipped_steps[@]}"
  printf '  - %s\n' "${skipped_steps[@]}"
fi
if [ ${#failed_steps[@]} -gt 0 ]; then
  echo "steps failed: ${failed_steps[*]}"
  exit 1
fi
echo "== all steps passed"
