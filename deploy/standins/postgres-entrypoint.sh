#!/usr/bin/env bash
# First start: a cluster owned by $POSTGRES_USER with $POSTGRES_PASSWORD, and $POSTGRES_DB.
set -euo pipefail
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
    user=${POSTGRES_USER:-postgres}
    initdb -D "$PGDATA" --username="$user" --encoding=UTF8 --locale=C.UTF-8 --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
    if [ "${POSTGRES_DB:-$user}" != postgres ]; then
        createdb --username="$user" "${POSTGRES_DB:-$user}"
    fi
    pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
fi
if [ "$1" = postgres ]; then
    exec postgres -D "$PGDATA" -c listen_addresses='*' "${@:2}"
fi
exec "$@"
