#!/usr/bin/env bash
# Makes the Python environment the SDK's tests run in: a venv at target/space/venv with
# sdk/python installed (editable) with its test extras from PyPI. Idempotent: the venv keeps a
# hash of sdk/python/pyproject.toml and this script, and a warm run that finds the same hash
# does nothing. The Rust test crates/space/tests/sdk_python.rs uses target/space/venv/bin/python
# (or $SPACE_PYTHON).
set -euo pipefail

log() { printf '[python-env] %s\n' "$*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/target/space/venv"
stamp="$venv/.space-sdk-stamp"
python=${PYTHON:-python3}

if ! command -v "$python" >/dev/null 2>&1; then
    log "no $python found: install Python 3.11 or newer (Debian: apt-get install python3 python3-venv)"
    exit 1
fi

want=$(cat "$root/sdk/python/pyproject.toml" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
    "$venv/bin/python" -c 'import space_sdk, pytest, pytest_asyncio, schemathesis' 2>/dev/null; then
    exit 0
fi

log "installing the Python SDK and its test tools into target/space/venv"
rm -rf "$venv"
mkdir -p "$(dirname "$venv")"
if ! "$python" -m venv "$venv" >&2; then
    log "python3 -m venv failed (Debian: apt-get install python3-venv)"
    rm -rf "$venv"
    exit 1
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -e "$root/sdk/python[test]" >&2
printf '%s\n' "$want" >"$stamp"
