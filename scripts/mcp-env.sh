#!/usr/bin/env bash
# Makes what the MCP tests and the MCP bench drive space with: the official MCP Python SDK,
# unmodified, at the version pinned in compat/mcp/python/requirements.txt, in a venv at
# target/space/venv-mcp. Idempotent: the venv keeps a hash of the pins and this script, and a
# warm run that finds the same hash does nothing.
set -euo pipefail

log() { printf '[mcp-env] %s\n' "$*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/target/space/venv-mcp"
python=${PYTHON:-python3}

want=$(cat "$root/compat/mcp/python/requirements.txt" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
if [[ -x "$venv/bin/python" && "$(cat "$venv/.space-stamp" 2>/dev/null)" == "$want" ]] &&
    "$venv/bin/python" -c 'import mcp, httpx, pytest, anyio' 2>/dev/null; then
    exit 0
fi
log "installing the MCP Python SDK (pinned) into target/space/venv-mcp"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
"$python" -m venv "$venv" >&2 || { log "python3 -m venv failed (Debian: apt-get install python3-venv)"; exit 1; }
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$root/compat/mcp/python/requirements.txt" >&2
printf '%s\n' "$want" >"$venv/.space-stamp"
log "ready"
