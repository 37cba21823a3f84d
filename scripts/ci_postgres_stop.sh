#!/usr/bin/env bash
# Stop the throwaway PostgreSQL server scripts/ci_postgres.sh started ($WF_PG_DATA, as that
# script exported it) and delete its cluster, so a second local `.ci/run` finds the port free.
# Does nothing when no such server was started.
set -uo pipefail
DATA="${WF_PG_DATA:-}"
[ -n "$DATA" ] && [ -d "$DATA" ] || exit 0
PG_CTL=$(command -v pg_ctl 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/pg_ctl 2>/dev/null | sort -V | tail -1)
[ -n "$PG_CTL" ] || exit 0
if [ "$(id -u)" -eq 0 ]; then
  su postgres -s /bin/bash -c "'$PG_CTL' -D '$DATA' stop -m fast" >/dev/null 2>&1
else
  "$PG_CTL" -D "$DATA" stop -m fast >/dev/null 2>&1
fi
case "$(dirname "$DATA")" in  # only a cluster dir ci_postgres.sh made (mktemp)
  /tmp/wf-magic-pg.*) rm -rf "$(dirname "$DATA")" ;;
esac
exit 0
