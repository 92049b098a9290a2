#!/usr/bin/env bash
# Starts a private PostgreSQL cluster for the test suite (installing PostgreSQL from Debian if
# needed) and prints its URL on stdout. `pg-test.sh stop` stops it. Nothing of the host's own
# PostgreSQL is touched: the cluster lives in /tmp and listens on 127.0.0.1:${HAUL_PG_PORT:-55432}.
set -euo pipefail
PORT="${HAUL_PG_PORT:-55432}"
DATA="/tmp/haul-pg-$PORT"
bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$d" ] && echo "$d"
}
if [ "${1:-start}" = stop ]; then
  [ -d "$DATA" ] && su postgres -c "$(bin)/pg_ctl -D $DATA -m fast stop" >/dev/null 2>&1 || true
  exit 0
fi
if [ -z "$(bin)" ]; then
  echo "pg-test: installing postgresql" >&2
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
fi
B="$(bin)"
id postgres >/dev/null 2>&1 || useradd -r -m postgres
if ! su postgres -c "$B/pg_ctl -D $DATA status" >/dev/null 2>&1; then
  rm -rf "$DATA"
  mkdir -p "$DATA" && chown postgres "$DATA"
  su postgres -c "$B/initdb -D $DATA -A trust -U haul --no-instructions" >/dev/null
  su postgres -c "$B/pg_ctl -D $DATA -l $DATA/log -o '-p $PORT -k /tmp -c listen_addresses=127.0.0.1 -c fsync=${HAUL_PG_FSYNC:-off} -c max_connections=200' -w start" >/dev/null
fi
echo "postgres://haul@127.0.0.1:$PORT/postgres"
