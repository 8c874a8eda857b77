#!/usr/bin/env bash
# Installs the real servers the tests run against (built or downloaded once into the cache)
# and records where they are in target/space/tools.sh, which the Makefile sources for tests:
#   - Garage, an S3 server (scripts/garage.sh)
#   - moto's server, for the AWS KMS API (the only KMS reachable here), in a venv
#   - PostgreSQL 15 from Debian, for the control plane's second store (the tests make a
#     throwaway server of their own with initdb; the package's default cluster is not used)
set -euo pipefail

cd "$(dirname "$0")/.."
log() { printf '[tools] %s\n' "$*" >&2; }

garage=$(scripts/garage.sh | tail -n1)

moto_version=5.2.5
cache=${SPACE_CACHE:-$HOME/.cache/space}
moto_venv="$cache/tools/moto-$moto_version"
moto="$moto_venv/bin/moto_server"
if ! [[ -x $moto ]] || ! "$moto_venv/bin/python" -c 'import moto.server' 2>/dev/null; then
    log "installing moto[server] $moto_version from PyPI into $moto_venv"
    rm -rf "$moto_venv"
    python3 -m venv "$moto_venv"
    "$moto_venv/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$moto_version" >&2
    log "moto installed"
fi
pg_bin=/usr/lib/postgresql/15/bin
if ! [[ -x $pg_bin/postgres && -x $pg_bin/initdb ]]; then
    log "installing postgresql-15 from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    # The package's own cluster is made but never needed; a policy-rc.d that refuses keeps
    # apt from starting it.
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod +x /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
    fi
    apt-get install -y -qq --no-install-recommends postgresql-15 >&2
    log "postgresql-15 installed"
fi
if ! id postgres >/dev/null 2>&1; then
    log "error: postgresql-15 is installed but there is no postgres user"
    exit 1
fi

mkdir -p target/space
out=target/space/tools.sh
{
    echo "export SPACE_GARAGE='$garage'"
    echo "export SPACE_MOTO='$moto'"
    echo "export SPACE_PG_BIN='$pg_bin'"
} >"$out.tmp"
mv "$out.tmp" "$out"
log "ready: garage $garage"
log "ready: moto $moto"
log "ready: postgres $pg_bin"
