#!/usr/bin/env bash
# Makes what the E2B compatibility tests drive space with: the official E2B SDKs, unmodified,
# at the versions pinned in compat/e2b: a venv at target/space/venv-e2b (Python SDK, pytest)
# and compat/e2b/js/node_modules (JavaScript SDK, from package-lock.json). Idempotent: each
# keeps a hash of its pins and this script, and a warm run that finds the same hash does
# nothing.
set -euo pipefail

log() { printf '[e2b-env] %s\n' "$*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/target/space/venv-e2b"
python=${PYTHON:-python3}

want=$(cat "$root/compat/e2b/python/requirements.txt" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
if [[ -x "$venv/bin/python" && "$(cat "$venv/.space-stamp" 2>/dev/null)" == "$want" ]] &&
    "$venv/bin/python" -c 'import e2b, pytest, pytest_asyncio' 2>/dev/null; then
    :
else
    log "installing the E2B Python SDK (pinned) into target/space/venv-e2b"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv" >&2 || { log "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$root/compat/e2b/python/requirements.txt" >&2
    printf '%s\n' "$want" >"$venv/.space-stamp"
fi

js="$root/compat/e2b/js"
if [[ -f "$js/package-lock.json" ]]; then
    if ! command -v npm >/dev/null 2>&1; then
        log "no npm found: install Node.js 20 and npm (Debian: apt-get install nodejs npm)"
        exit 1
    fi
    want=$(cat "$js/package-lock.json" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
    if [[ "$(cat "$js/node_modules/.space-stamp" 2>/dev/null)" != "$want" ]]; then
        log "installing the E2B JavaScript SDK (pinned, npm ci) into compat/e2b/js/node_modules"
        (cd "$js" && npm ci --no-audit --no-fund --loglevel=error >&2)
        printf '%s\n' "$want" >"$js/node_modules/.space-stamp"
    fi
fi
