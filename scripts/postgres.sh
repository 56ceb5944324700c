#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server for the tests and prints its URL on stdout:
#   postgresql+psycopg://postgres@127.0.0.1:PORT/spectune_test
# Installs the Debian `postgresql` package when it is missing. The server listens on
# 127.0.0.1 only (trust authentication), keeps its data and socket under $SPECTUNE_PG_DIR
# (default /tmp/spectune-pg), and runs as the `postgres` user when started by root
# (PostgreSQL refuses to run as root). Running the script again reuses a live server.
# Everything but the URL goes to stderr.
set -euo pipefail
exec 3>&1 1>&2

state=${SPECTUNE_PG_DIR:-/tmp/spectune-pg}
database=spectune_test

find_bindir() {
    ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

bindir=$(find_bindir)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
    echo "postgres.sh: installing the Debian postgresql package" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends postgresql >/dev/null
    bindir=$(find_bindir)
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
    echo "postgres.sh: no PostgreSQL server binaries after installing" >&2
    exit 1
fi

if [ "$(id -u)" = 0 ]; then
    owner=postgres
    as_owner() { runuser -u postgres -- "$@"; }
else
    owner=$(id -un)
    as_owner() { "$@"; }
fi

url() { echo "postgresql+psycopg://postgres@127.0.0.1:$1/$database"; }

ready() {  # ready PORT: the server answers and the test database exists
    "$bindir/pg_isready" -q -h 127.0.0.1 -p "$1" &&
        "$bindir/psql" -h 127.0.0.1 -p "$1" -U postgres -d "$database" -Atqc 'SELECT 1' \
            >/dev/null 2>&1
}

# A server from an earlier run that still answers: reuse it.
if [ -f "$state/port" ] && ready "$(cat "$state/port")"; then
    echo "postgres.sh: reusing the server on port $(cat "$state/port")" >&2
    url "$(cat "$state/port")" >&3
    exit 0
fi

# Otherwise start afresh: stop a leftover server, wipe its state.
if [ -f "$state/data/postmaster.pid" ]; then
    as_owner "$bindir/pg_ctl" -D "$state/data" -m immediate stop >/dev/null 2>&1 || true
fi
rm -rf "$state"
mkdir -p "$state/socket"
chown -R "$owner" "$state"
chmod 700 "$state"

as_owner "$bindir/initdb" -D "$state/data" -U postgres --auth=trust -E UTF8 --no-locale \
    >"$state/initdb.log" 2>&1 || { cat "$state/initdb.log" >&2; exit 1; }

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

for attempt in 1 2 3; do
    port=$(free_port)
    # fsync off: a throwaway test server trades durability for speed. 3>&-: the server
    # must not inherit the descriptor of our stdout, or $(bash postgres.sh) never ends.
    if as_owner "$bindir/pg_ctl" -D "$state/data" -l "$state/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$state/socket -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=100" \
        start >/dev/null 3>&-; then
        break
    fi
    echo "postgres.sh: start on port $port failed (attempt $attempt)" >&2
    tail -n 5 "$state/server.log" >&2 || true
    port=""
done
if [ -z "$port" ]; then
    echo "postgres.sh: could not start PostgreSQL" >&2
    exit 1
fi

"$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres "$database"
echo "$port" >"$state/port"
echo "postgres.sh: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port" >&2
url "$port" >&3
