#!/usr/bin/env bash
# Build the sandbox guest kernel (an uncompressed, PVH-bootable vmlinux) from Debian's
# linux-source package and guest/kernel.config.
#
# Usage: guest/build-kernel.sh
#
# Prints the absolute path of the cached vmlinux as the last line of stdout; all progress
# goes to stderr. The result is cached under $SPACE_CACHE/kernel/<key>/ where <key> is the
# sha256 of the config fragment, the linux-source package version and this script, so a
# second run with nothing changed returns immediately.
#
# Environment:
#   SPACE_CACHE              cache root (default: $HOME/.cache/space)
#   SPACE_LINUX_SOURCE_PKG   Debian source package to build (default: linux-source-6.12)
#   SPACE_KERNEL_JOBS        parallel make jobs (default: nproc)
set -euo pipefail

log() { printf '[kernel] %s\n' "$*" >&2; }
die() { printf '[kernel] error: %s\n' "$*" >&2; exit 1; }

script_path=$(readlink -f "${BASH_SOURCE[0]}")
guest_dir=$(dirname "$script_path")
fragment="$guest_dir/kernel.config"
cache_root="${SPACE_CACHE:-$HOME/.cache/space}"
src_pkg="${SPACE_LINUX_SOURCE_PKG:-linux-source-6.12}"
jobs="${SPACE_KERNEL_JOBS:-$(nproc)}"

[[ -f "$fragment" ]] || die "config fragment not found: $fragment"
for tool in dpkg-query sha256sum tar make gcc flex bison bc readelf flock; do
    command -v "$tool" >/dev/null 2>&1 || die "missing tool '$tool' (apt-get install build-essential flex bison bc libelf-dev libssl-dev)"
done

pkg_version=$(dpkg-query -W -f='${Version}' "$src_pkg" 2>/dev/null) ||
    die "package $src_pkg is not installed (apt-get install $src_pkg)"
[[ -n "$pkg_version" ]] || die "package $src_pkg is not installed (apt-get install $src_pkg)"
tarball="/usr/src/$src_pkg.tar.xz"
[[ -f "$tarball" ]] || die "kernel source tarball not found: $tarball"

key=$( { printf 'fragment\n'; cat "$fragment"; printf '\npackage %s %s\nscript\n' "$src_pkg" "$pkg_version"; cat "$script_path"; } |
    sha256sum | cut -c1-64)
kernel_root="$cache_root/kernel"
out_dir="$kernel_root/$key"

if [[ -f "$out_dir/vmlinux" ]]; then
    printf '%s\n' "$out_dir/vmlinux"
    exit 0
fi

mkdir -p "$kernel_root"
# One builder per key; a second caller waits and then finds the finished artifact.
exec 9>"$kernel_root/.lock-$key"
if ! flock -n 9; then
    log "another build of $key is running; waiting for it"
    flock 9
fi
if [[ -f "$out_dir/vmlinux" ]]; then
    printf '%s\n' "$out_dir/vmlinux"
    exit 0
fi

# Anything left from an interrupted build of this key is stale now that we hold the lock.
rm -rf "$kernel_root/.build-$key".* "$kernel_root/.out-$key".*

work=$(mktemp -d "$kernel_root/.build-$key.XXXXXX")
stage=$(mktemp -d "$kernel_root/.out-$key.XXXXXX")
heartbeat_pid=""
make_pid=""
cleanup() {
    local rc=$?
    if [[ -n "$heartbeat_pid" ]]; then kill "$heartbeat_pid" 2>/dev/null || true; fi
    if [[ -n "$make_pid" ]] && kill -0 "$make_pid" 2>/dev/null; then
        kill -- "-$make_pid" 2>/dev/null || kill -- "$make_pid" 2>/dev/null || true
        wait "$make_pid" 2>/dev/null || true
    fi
    rm -rf "$work" "$stage"
    if [[ $rc -ne 0 ]]; then log "failed (exit $rc)"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start=$(date +%s)
log "building $src_pkg $pkg_version with $(basename "$fragment") (key ${key:0:12})"
log "extracting $tarball"
tar -C "$work" -xf "$tarball"
src="$work/$src_pkg"
[[ -d "$src" ]] || die "tarball did not contain $src_pkg/"
# The log lives outside the work dir so that it survives a failed build.
build_log="$kernel_root/build-${key:0:12}.log"
: >"$build_log"

log "configuring (tinyconfig + fragment + olddefconfig)"
{
    make -C "$src" ARCH=x86_64 tinyconfig
    (cd "$src" && ARCH=x86_64 scripts/kconfig/merge_config.sh -m .config "$fragment")
    make -C "$src" ARCH=x86_64 olddefconfig
} >"$build_log" 2>&1 || { tail -n 40 "$build_log" >&2; die "kernel configuration failed (log above)"; }

# Every assignment in the fragment (=y, numbers, strings) must be in the final config
# verbatim, and every option it turns off must be off: olddefconfig silently drops what it
# cannot satisfy (a typo, a missing dependency, an option hidden by another choice).
missing=()
while IFS= read -r line; do
    grep -qxF "$line" "$src/.config" ||
        missing+=("$line (got: $(grep -E "^(# )?${line%%=*}[= ]" "$src/.config" || echo 'absent'))")
done < <(grep -E '^CONFIG_[A-Za-z0-9_]+=' "$fragment")
while IFS= read -r line; do
    opt=${line#\# }
    opt=${opt%% *}
    if grep -qE "^$opt=" "$src/.config"; then
        missing+=("$line (got: $(grep -E "^$opt=" "$src/.config"))")
    fi
done < <(grep -E '^# CONFIG_[A-Za-z0-9_]+ is not set$' "$fragment")
if ((${#missing[@]})); then
    log "these options from $(basename "$fragment") did not stick (typo or unmet dependency):"
    printf '  %s\n' "${missing[@]}" >&2
    exit 1
fi
log "config verified: every option of the fragment is in effect"

log "compiling vmlinux with $jobs jobs, nice'd (cold build: ~6 min on 2 idle cores; log: $build_log)"
# In its own process group, so an interrupted build takes all compiler processes with it.
setsid nice -n 19 make -C "$src" ARCH=x86_64 -j"$jobs" vmlinux >>"$build_log" 2>&1 &
make_pid=$!
(
    while sleep 30; do
        n=$(grep -cE '^\s+(CC|AS|AR|LD)\s' "$build_log" || true)
        log "still compiling: $n objects so far, $(($(date +%s) - start)) s elapsed"
    done
) &
heartbeat_pid=$!
if ! wait "$make_pid"; then
    kill "$heartbeat_pid" 2>/dev/null || true
    heartbeat_pid=""
    grep -E 'error|Error' "$build_log" | tail -n 20 >&2 || true
    tail -n 20 "$build_log" >&2
    die "kernel build failed (log above)"
fi
make_pid=""
kill "$heartbeat_pid" 2>/dev/null || true
wait "$heartbeat_pid" 2>/dev/null || true
heartbeat_pid=""

# QEMU boots an ELF vmlinux only through the PVH entry note (Xen note type 0x12).
readelf -n "$src/vmlinux" | grep -qE 'Xen.*(0x00000012|PHYS32_ENTRY)' ||
    die "built vmlinux has no PVH entry note; QEMU -kernel cannot boot it"

cp "$src/vmlinux" "$stage/vmlinux"
cp "$src/.config" "$stage/config"
printf '%s %s\n' "$src_pkg" "$pkg_version" >"$stage/source"
rm -rf "$out_dir"
chmod 755 "$stage"
mv -T "$stage" "$out_dir"
rm -f "$kernel_root/.lock-$key" "$build_log"
# Keep the newest few kernels; templates keep their own copy of the vmlinux they booted.
mapfile -t old_kernels < <(find "$kernel_root" -mindepth 1 -maxdepth 1 -type d ! -name '.*' -printf '%T@ %p\n' |
    sort -rn | tail -n +4 | cut -d' ' -f2-)
for old in "${old_kernels[@]}"; do
    log "pruning old kernel $old"
    rm -rf "$old"
done
elapsed=$(($(date +%s) - start))
log "done in $((elapsed / 60)) min $((elapsed % 60)) s: $out_dir/vmlinux ($(du -h "$out_dir/vmlinux" | cut -f1))"
printf '%s\n' "$out_dir/vmlinux"
