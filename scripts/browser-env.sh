#!/usr/bin/env bash
# Makes what the browser tests drive a sandbox's Chromium with: Playwright for Python (its
# `connect_over_cdp` needs no browser of its own), pytest and pyotp, at the versions pinned in
# compat/browser/requirements.txt and compat/logins/requirements.txt, in a venv at
# target/space/venv-browser; and Puppeteer (puppeteer-core, no browser download either) from
# compat/browser/js/package-lock.json into compat/browser/js/node_modules. Idempotent: each
# keeps a hash of its pins and this script, and a warm run that finds the same hash does
# nothing.
set -euo pipefail

log() { printf '[browser-env] %s\n' "$*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/target/space/venv-browser"
python=${PYTHON:-python3}

reqs=("$root/compat/browser/requirements.txt" "$root/compat/logins/requirements.txt")
want=$(cat "${reqs[@]}" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
if [[ -x "$venv/bin/python" && "$(cat "$venv/.space-stamp" 2>/dev/null)" == "$want" ]] &&
    "$venv/bin/python" -c 'import playwright, pytest, pyotp' 2>/dev/null; then
    :
else
    log "installing Playwright for Python and pyotp (pinned) into target/space/venv-browser"
    rm -rf "$venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv" >&2 || { log "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "${reqs[0]}" -r "${reqs[1]}" >&2
    printf '%s\n' "$want" >"$venv/.space-stamp"
    log "ready"
fi

js="$root/compat/browser/js"
want=$(cat "$js/package-lock.json" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
if [[ "$(cat "$js/node_modules/.space-stamp" 2>/dev/null)" != "$want" ]]; then
    command -v npm >/dev/null 2>&1 || { log "no npm found: install Node.js 20 and npm (Debian: apt-get install nodejs npm)"; exit 1; }
    log "installing Puppeteer (puppeteer-core, pinned, npm ci) into compat/browser/js/node_modules"
    (cd "$js" && npm ci --no-audit --no-fund --loglevel=error >&2)
    printf '%s\n' "$want" >"$js/node_modules/.space-stamp"
    log "Puppeteer ready"
fi
