#!/usr/bin/env bash
# Makes what the E2B compatibility tests drive space with: the official SDKs, unmodified, at the
# versions pinned in compat/: for each suite (compat/e2b: the E2B SDKs; compat/e2b-desktop: the
# e2b-desktop SDKs) a venv at target/space/venv-<suite> from python/requirements.txt, and
# js/node_modules from js/package-lock.json. Idempotent: each keeps a hash of its pins and this
# script, and a warm run that finds the same hash does nothing.
set -euo pipefail

log() { printf '[e2b-env] %s\n' "$*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}

# suite name, and the modules its venv must import
suites=(
    "e2b:e2b, pytest, pytest_asyncio"
    "e2b-desktop:e2b_desktop, PIL, playwright, mcp, pytest"
)

for entry in "${suites[@]}"; do
    suite=${entry%%:*}
    modules=${entry#*:}
    venv="$root/target/space/venv-$suite"
    reqs="$root/compat/$suite/python/requirements.txt"
    want=$(cat "$reqs" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
    if [[ -x "$venv/bin/python" && "$(cat "$venv/.space-stamp" 2>/dev/null)" == "$want" ]] &&
        "$venv/bin/python" -c "import $modules" 2>/dev/null; then
        :
    else
        log "installing compat/$suite's Python SDKs (pinned) into target/space/venv-$suite"
        rm -rf "$venv"
        mkdir -p "$(dirname "$venv")"
        "$python" -m venv "$venv" >&2 || { log "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs" >&2
        printf '%s\n' "$want" >"$venv/.space-stamp"
    fi

    js="$root/compat/$suite/js"
    if [[ -f "$js/package-lock.json" ]]; then
        if ! command -v npm >/dev/null 2>&1; then
            log "no npm found: install Node.js 20 and npm (Debian: apt-get install nodejs npm)"
            exit 1
        fi
        want=$(cat "$js/package-lock.json" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
        if [[ "$(cat "$js/node_modules/.space-stamp" 2>/dev/null)" != "$want" ]]; then
            log "installing compat/$suite's JavaScript SDKs (pinned, npm ci) into compat/$suite/js/node_modules"
            (cd "$js" && npm ci --no-audit --no-fund --loglevel=error >&2)
            printf '%s\n' "$want" >"$js/node_modules/.space-stamp"
        fi
    fi
done
