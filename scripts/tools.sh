#!/usr/bin/env bash
# Installs the real servers the tests run against (built or downloaded once into the cache)
# and records where they are in target/space/tools.sh, which the Makefile sources for tests:
#   - Garage, an S3 server (scripts/garage.sh)
set -euo pipefail

cd "$(dirname "$0")/.."
log() { printf '[tools] %s\n' "$*" >&2; }

garage=$(scripts/garage.sh | tail -n1)
mkdir -p target/space
out=target/space/tools.sh
{
    echo "export SPACE_GARAGE='$garage'"
} >"$out.tmp"
mv "$out.tmp" "$out"
log "ready: garage $garage"
