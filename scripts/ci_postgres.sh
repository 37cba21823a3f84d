#!/usr/bin/env bash
# Start a throwaway PostgreSQL server for the suite's PostgreSQL leg (tests marked `backends`,
# the lease and fault tests): Debian's postgresql package (installed here if missing), a new
# cluster in a temp dir owned by the `postgres` user (initdb and pg_ctl refuse to run as root),
# its socket in that dir, TCP on 127.0.0.1 only, trust auth, fsync off (a test server).
# Prints the lines to eval: `export WF_MAGIC_TEST_PG=postgresql://postgres@127.0.0.1:PORT/postgres`
# and `export WF_PG_DATA=…` (the cluster, for scripts/ci_postgres_stop.sh).
# Usage: eval "$(bash scripts/ci_postgres.sh)"   (PORT: $WF_PG_PORT, default 55432)
set -euo pipefail
PORT="${WF_PG_PORT:-55432}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

find_bin() {
  local name=$1
  command -v "$name" 2>/dev/null && return 0
  ls -d /usr/lib/postgresql/*/bin/"$name" 2>/dev/null | sort -V | tail -1
}

if [ -z "$(find_bin initdb)" ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >&2
  $SUDO apt-get install -y -q --no-install-recommends postgresql >&2
fi
INITDB=$(find_bin initdb)
PG_CTL=$(find_bin pg_ctl)
[ -n "$INITDB" ] && [ -n "$PG_CTL" ] || { echo "ci_postgres: no initdb/pg_ctl after install" >&2; exit 1; }

DIR=$(mktemp -d /tmp/wf-magic-pg.XXXXXX)
chmod 755 "$DIR"
AS=()
if [ "$(id -u)" -eq 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  chown postgres "$DIR"
  AS=(su postgres -s /bin/bash -c)
else
  AS=(bash -c)
fi
"${AS[@]}" "'$INITDB' -D '$DIR/data' -A trust -U postgres --no-sync >'$DIR/initdb.log' 2>&1" \
  || { cat "$DIR/initdb.log" >&2; exit 1; }
"${AS[@]}" "'$PG_CTL' -D '$DIR/data' -l '$DIR/server.log' -w -t 60 -o \"-k '$DIR' -p $PORT -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=400\" start" >&2 \
  || { cat "$DIR/server.log" >&2; exit 1; }
echo "ci_postgres: server $("$PG_CTL" --version) on 127.0.0.1:$PORT, data in $DIR" >&2
echo "export WF_MAGIC_TEST_PG=postgresql://postgres@127.0.0.1:$PORT/postgres"
echo "export WF_PG_DATA=$DIR/data"
