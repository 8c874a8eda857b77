#!/usr/bin/env bash
# Installs the real servers the tests run against (built or downloaded once into the cache)
# and records where they are in target/space/tools.sh, which the Makefile sources for tests:
#   - Garage, an S3 server (scripts/garage.sh)
#   - moto's server, for the AWS KMS API (the only KMS reachable here), in a venv
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
mkdir -p target/space
out=target/space/tools.sh
{
    echo "export SPACE_GARAGE='$garage'"
    echo "export SPACE_MOTO='$moto'"
} >"$out.tmp"
mv "$out.tmp" "$out"
log "ready: garage $garage"
log "ready: moto $moto"
