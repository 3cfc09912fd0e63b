#!/usr/bin/env bash
# Test services: a real PostgreSQL server and a real headless Chromium (Debian packages).
#   scripts/test_services.sh install        apt-get installs postgresql and chromium when missing
#   scripts/test_services.sh run CMD...     starts PostgreSQL on 127.0.0.1 in a scratch directory,
#                                           exports TKCC_TEST_PG_URL and TKCC_CHROMIUM, runs CMD,
#                                           stops the server, exits with CMD's status
set -euo pipefail
mode=${1:?usage: test_services.sh install|run CMD...}; shift

pg_bin() {
    local d
    for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && { echo "$d"; return; }; done
    command -v initdb >/dev/null && dirname "$(command -v initdb)"
}

if [ "$mode" = install ]; then
    need=()
    [ -n "$(pg_bin)" ] || need+=(postgresql)
    command -v chromium >/dev/null || need+=(chromium)
    if [ ${#need[@]} -gt 0 ]; then
        echo "[services] apt-get install ${need[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    fi
    exit 0
fi

bin=$(pg_bin)
[ -n "$bin" ] || { echo "[services] PostgreSQL not installed: run 'scripts/test_services.sh install'"; exit 2; }
run_as=()
if [ "$(id -u)" = 0 ]; then
    id -u postgres >/dev/null 2>&1 || useradd -r -M postgres
    run_as=(runuser -u postgres --)
fi
dir=$(mktemp -d /tmp/tkcc-pg.XXXXXX)
chmod 755 "$dir"; [ "$(id -u)" = 0 ] && chown postgres "$dir"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"${run_as[@]}" "$bin/initdb" -D "$dir/data" -U tkcc --auth=trust -E UTF8 >/dev/null
"${run_as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=off" start >/dev/null
cleanup() { "${run_as[@]}" "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true; rm -rf "$dir"; }
trap cleanup EXIT
"${run_as[@]}" "$bin/createdb" -h 127.0.0.1 -p "$port" -U tkcc tkcc_test
export TKCC_TEST_PG_URL="postgresql+psycopg://tkcc@127.0.0.1:$port/tkcc_test"
command -v chromium >/dev/null && export TKCC_CHROMIUM=$(command -v chromium)
echo "[services] PostgreSQL on 127.0.0.1:$port; chromium: ${TKCC_CHROMIUM:-none}"
set +e
"$@"
rc=$?
# pytest exits 5 when it collected no test: that is a failure of the suite, not a pass
exit $rc
