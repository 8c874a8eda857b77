#!/usr/bin/env bash
# Builds what a sandbox boots from and records where it is:
#   - space-guestd, linked statically (it is /sbin/init in every image)
#   - the guest kernel (cached by guest/build-kernel.sh)
#   - the root filesystem images of the stock templates (cached by guest/build-image.sh), and
#     on request the desktop image (Xfce, Chromium, Firefox, noVNC: ~360 MB of downloads and
#     a few minutes the first time, so `all` leaves it out)
# The paths land in target/space/env.sh, which the Makefile sources for tests, and in
# $SPACE_CACHE/artifacts.json (default ~/.cache/space), where an installed `space up` finds
# them without any environment (the guestd binary is copied into the cache for that).
# Usage: scripts/artifacts.sh [minimal|base|desktop|all]   (default: all = minimal and base)
set -euo pipefail

cd "$(dirname "$0")/.."
which_images=${1:-all}
case $which_images in minimal | base | desktop | all) ;; *)
    printf 'usage: %s [minimal|base|desktop|all]\n' "$0" >&2
    exit 2
    ;;
esac
log() { printf '[artifacts] %s\n' "$*" >&2; }

target=x86_64-unknown-linux-gnu
log "building space-guestd (static, release)"
RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --quiet --release -p space-guestd --target "$target"
guestd="$PWD/target/$target/release/space-guestd"
if readelf -l "$guestd" | grep -q 'program interpreter'; then
    log "space-guestd needs a dynamic loader; the guest needs a static binary"
    exit 1
fi

log "guest kernel"
kernel=$(guest/build-kernel.sh | tail -n1)

log "image: minimal"
minimal=$(guest/build-image.sh minimal "$guestd" | tail -n1)
# A run that does not build an image keeps the one recorded by an earlier run.
recorded() { sed -n "s/^export $1='\(.*\)'$/\1/p" target/space/env.sh 2>/dev/null || true; }
base=$(recorded SPACE_ROOTFS_BASE)
[[ -f $base ]] || base=""
desktop=$(recorded SPACE_ROOTFS_DESKTOP)
[[ -f $desktop ]] || desktop=""
if [[ $which_images == all || $which_images == base ]]; then
    log "image: base (the first build runs debootstrap: a few minutes)"
    base=$(guest/build-image.sh base "$guestd" | tail -n1)
fi
if [[ $which_images == desktop ]]; then
    log "image: desktop (the first build runs debootstrap and apt-get: several minutes)"
    desktop=$(guest/build-image.sh desktop "$guestd" | tail -n1)
fi

mkdir -p target/space
env_file=target/space/env.sh
{
    echo "export SPACE_GUESTD='$guestd'"
    echo "export SPACE_KERNEL='$kernel'"
    echo "export SPACE_ROOTFS_MINIMAL='$minimal'"
    [[ -n $base ]] && echo "export SPACE_ROOTFS_BASE='$base'"
    [[ -n $desktop ]] && echo "export SPACE_ROOTFS_DESKTOP='$desktop'"
} >"$env_file.tmp"
mv "$env_file.tmp" "$env_file"

cache=${SPACE_CACHE:-$HOME/.cache/space}
sum=$(sha256sum "$guestd" | cut -c1-16)
mkdir -p "$cache/guestd/$sum"
[[ -x $cache/guestd/$sum/space-guestd ]] || install -m 0755 "$guestd" "$cache/guestd/$sum/space-guestd"
# The recipe is recorded too: `space up` makes the desktop image with it, in the background,
# when no desktop image was built (docs/guest.md).
python3 - "$cache/artifacts.json" "$kernel" "$cache/guestd/$sum/space-guestd" "$minimal" "$base" "$desktop" "$PWD/guest/build-image.sh" <<'PY'
import json, os, sys
path, kernel, guestd, minimal, base, desktop, recipe = sys.argv[1:]
images = {"minimal": minimal}
if base:
    images["base"] = base
if desktop:
    images["desktop"] = desktop
doc = {"kernel": kernel, "guestd": guestd, "images": images, "recipe": recipe}
with open(path + ".tmp", "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.replace(path + ".tmp", path)
PY
log "recorded in $cache/artifacts.json"
log "ready: kernel $kernel"
log "ready: minimal $minimal"
[[ -n $base ]] && log "ready: base $base"
[[ -n $desktop ]] && log "ready: desktop $desktop"
exit 0
