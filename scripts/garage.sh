#!/usr/bin/env bash
# Installs Garage, the S3 server the object-store tests run against, into the cache:
# `cargo install --locked garage` once into $SPACE_CACHE/tools (a long build: tens of minutes on
# two cores), then nothing. Prints the binary's path on its last line.
set -euo pipefail

log() { printf '[garage] %s\n' "$*" >&2; }

version=2.5.0
cache=${SPACE_CACHE:-$HOME/.cache/space}
root="$cache/tools/garage-$version"
bin="$root/bin/garage"

if [[ -x $bin ]] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

log "building garage $version from crates.io into $root (once; this takes a while)"
mkdir -p "$root"
# The build directory is kept until the binary is in place, so an interrupted build resumes.
tmp="$root.build"
rm -rf "$tmp/root"
start=$(date +%s)
# cargo prints one line per compiled crate; show a count so the wait has a pulse.
n=0
CARGO_TARGET_DIR="$tmp/target" cargo install --locked --root "$tmp/root" \
    --version "$version" garage 2>&1 | while IFS= read -r line; do
    case $line in
    *Compiling*)
        n=$((n + 1))
        if ((n % 25 == 0)); then log "compiled $n crates ($(($(date +%s) - start)) s)"; fi
        ;;
    error* | warning:*failed*) printf '%s\n' "$line" >&2 ;;
    esac
done
if [[ ! -x $tmp/root/bin/garage ]]; then
    log "cargo install garage failed"
    exit 1
fi
mkdir -p "$root/bin"
mv "$tmp/root/bin/garage" "$bin"
rm -rf "$tmp"
log "built in $(($(date +%s) - start)) s"
echo "$bin"
