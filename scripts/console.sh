#!/usr/bin/env bash
# Vendors the web console's JavaScript libraries (xterm.js and its fit addon, noVNC's client)
# from npm at the versions pinned by console/vendor/package-lock.json, and copies the files a
# browser loads to target/space/console-vendor/, which the space-control crate embeds when it
# is built (crates/space-control/build.rs). Nothing is fetched when the console runs.
# Idempotent: a warm run that finds the same pins does nothing.
set -euo pipefail

log() { printf '[console] %s\n' "$*" >&2; }

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src="$root/console/vendor"
work="$root/target/space/console-npm"
out="$root/target/space/console-vendor"
want=$(cat "$src/package.json" "$src/package-lock.json" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-64)
if [[ "$(cat "$out/.space-stamp" 2>/dev/null)" == "$want" ]]; then
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    log "no npm found: install Node.js 20 and npm (Debian: apt-get install nodejs npm)"
    exit 1
fi
log "installing xterm.js and noVNC (pinned, npm ci) into target/space/console-npm"
rm -rf "$work"
mkdir -p "$work"
cp "$src/package.json" "$src/package-lock.json" "$work/"
(cd "$work" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)

nm="$work/node_modules"
tmp="$out.tmp"
rm -rf "$tmp"
mkdir -p "$tmp/xterm" "$tmp/novnc" "$tmp/licenses"
# xterm.js: the ES module builds and the stylesheet.
cp "$nm/@xterm/xterm/lib/xterm.mjs" "$nm/@xterm/xterm/css/xterm.css" "$tmp/xterm/"
cp "$nm/@xterm/addon-fit/lib/addon-fit.mjs" "$tmp/xterm/"
# noVNC: its client is ES modules (core/, with the inflate code it imports from vendor/).
cp -r "$nm/@novnc/novnc/core" "$tmp/novnc/core"
cp -r "$nm/@novnc/novnc/vendor" "$tmp/novnc/vendor"
# The source maps are not served; their references would only make browsers ask.
find "$tmp" -name '*.map' -delete
sed -i '/^\/\/# sourceMappingURL=/d' "$tmp/xterm/"*.mjs
for pkg in @xterm/xterm @xterm/addon-fit @novnc/novnc; do
    name=${pkg//\//-}
    name=${name#@}
    cp "$nm/$pkg/LICENSE"* "$tmp/licenses/$name.txt"
done
rm -rf "$out"
mv "$tmp" "$out"
printf '%s\n' "$want" >"$out/.space-stamp"
log "vendored $(find "$out" -type f ! -name .space-stamp | wc -l) files, $(du -sk "$out" | cut -f1) KiB, into target/space/console-vendor"
