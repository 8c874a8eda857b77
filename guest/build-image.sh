#!/usr/bin/env bash
# Build a sandbox root filesystem image (ext4, raw, sparse) without mounting anything.
#
# Usage: guest/build-image.sh <minimal|base> <path-to-static-space-guestd>
#
#   minimal  busybox (from the busybox-static package) and nothing else; builds in seconds.
#   base     Debian bookworm (debootstrap --variant=minbase) with bash, coreutils, python3,
#            pip/venv, git, curl, ca-certificates, procps, iproute2, sudo, and the account
#            `user` (uid 1000, passwordless sudo). The debootstrap tree is cached, so only
#            the first build pays for it. Needs root.
#
# The given binary becomes /sbin/init (mode 0755) and /usr/bin/space-guestd. The image path
# is printed as the last line of stdout; progress goes to stderr.
#
# Cache (root: ${SPACE_CACHE:-$HOME/.cache/space}):
#   images/<kind>-<key>.ext4   key = sha256(init binary, this script, kind, base tree key)
#   rootfs/base-<key>/tree/    key = sha256(package list, suite, the tree recipe function)
# Only the newest $SPACE_IMAGE_KEEP (default 3) images per kind and the newest 2 base trees
# are kept.
#
# Environment: SPACE_CACHE, SPACE_DEBIAN_MIRROR (default http://deb.debian.org/debian),
#              SPACE_IMAGE_KEEP.
set -euo pipefail

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }
usage() { printf 'usage: %s <minimal|base> <path-to-static-space-guestd>\n' "$0" >&2; exit 2; }

(($# == 2)) || usage
kind=$1
init_src=$2
case "$kind" in minimal | base) ;; *) usage ;; esac
[[ -f "$init_src" ]] || die "init binary not found or not a regular file: $init_src"
init_src=$(readlink -f "$init_src")

script_path=$(readlink -f "${BASH_SOURCE[0]}")
cache_root="${SPACE_CACHE:-$HOME/.cache/space}"
images_dir="$cache_root/images"
rootfs_dir="$cache_root/rootfs"
mirror="${SPACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
keep="${SPACE_IMAGE_KEEP:-3}"
suite=bookworm
base_packages=(bash coreutils python3 python3-pip python3-venv git curl ca-certificates procps iproute2 sudo)

for tool in mkfs.ext4 e2fsck sha256sum flock truncate; do
    command -v "$tool" >/dev/null 2>&1 || die "missing tool '$tool' (apt-get install e2fsprogs coreutils util-linux)"
done

sha256() { sha256sum | cut -c1-64; }

# A dynamically linked init cannot start in the minimal image (it has no libc). Scripts are
# accepted (handy for tests); only warn, since the interpreter may exist in the image.
check_init() {
    if command -v readelf >/dev/null 2>&1 && head -c4 "$init_src" | grep -q 'ELF'; then
        if readelf -l "$init_src" 2>/dev/null | grep -q 'Requesting program interpreter'; then
            log "warning: $init_src is dynamically linked; PID 1 should be a static binary"
        fi
    fi
}

# Drop everything but the newest $2 entries matching glob $1 (newest by mtime).
# Keeps the newest n entries; older ones go only once unused for two hours (a cache hit
# touches its entry), so a test run or a VM that still uses an older image keeps it.
prune() {
    local pattern=$1 n=$2 old
    # shellcheck disable=SC2086
    mapfile -t old < <(ls -1td $pattern 2>/dev/null | tail -n +$((n + 1)))
    for f in "${old[@]}"; do
        [[ -n $(find "$f" -maxdepth 0 -mmin +120 2>/dev/null) ]] || continue
        log "pruning old cache entry $f"
        rm -rf "$f"
    done
}

# ---------------------------------------------------------------------------------------
# Tree recipes. make_base_tree's own text is part of the base tree key, so editing it
# (and only it, or the package list) rebuilds the debootstrap tree.

make_minimal_tree() {
    local root=$1 applet name dir
    [[ -x /bin/busybox ]] || die "/bin/busybox not found (apt-get install busybox-static)"
    if readelf -l /bin/busybox 2>/dev/null | grep -q 'Requesting program interpreter'; then
        die "/bin/busybox is dynamically linked; install busybox-static"
    fi
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,run,root,home,var/tmp,mnt}
    chmod 1777 "$root/tmp" "$root/var/tmp"
    chmod 0700 "$root/root"
    cp /bin/busybox "$root/bin/busybox"
    chmod 0755 "$root/bin/busybox"
    # Every applet in /bin, plus at its usual location (/usr/bin/env, /sbin/ip, ...) so
    # scripts with absolute paths work too. init and linuxrc belong to the guest daemon.
    while IFS= read -r applet; do
        name=${applet##*/}
        dir=${applet%/*}
        case "$name" in init | linuxrc | busybox) continue ;; esac
        [[ -e "$root/bin/$name" ]] || ln -s busybox "$root/bin/$name"
        if [[ "$dir" != "$applet" && "$dir" != bin && ! -e "$root/$applet" ]]; then
            ln -s /bin/busybox "$root/$applet"
        fi
    done < <(/bin/busybox --list-full)
    cat >"$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat >"$root/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
nogroup:x:65534:
EOF
    chmod 0644 "$root/etc/passwd" "$root/etc/group"
}

make_base_tree() {
    local root=$1 suite=$2 mirror=$3
    shift 3
    local packages
    packages=$(IFS=,; echo "$*")
    debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror" >&2
    chroot "$root" apt-get clean >&2
    # Keep the tree small: package caches, indexes, docs (but not licences), man pages,
    # translations, logs. Python bytecode stays: compiling it at first import is slow under TCG.
    rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old \
        "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
        "$root"/usr/share/lintian "$root"/usr/share/linda "$root"/var/log/*.log \
        "$root"/var/log/apt/* "$root"/var/cache/ldconfig/*
    find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
    # Nothing from the build host: hostname, hosts and resolver are the sandbox's own.
    printf 'space\n' >"$root/etc/hostname"
    printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
    : >"$root/etc/resolv.conf"
    rm -f "$root/etc/machine-id" "$root/var/lib/dbus/machine-id"
    mkdir -p "$root/proc" "$root/sys" "$root/dev" "$root/tmp" "$root/run" "$root/home"
    chmod 1777 "$root/tmp"
}

# ---------------------------------------------------------------------------------------

check_init
mkdir -p "$images_dir"

base_key=""
base_tree=""
if [[ "$kind" == base ]]; then
    base_key=$( { printf 'suite %s\npackages %s\n' "$suite" "${base_packages[*]}"; declare -f make_base_tree; } | sha256)
    base_tree="$rootfs_dir/base-$base_key/tree"
fi

key=$( { printf 'kind %s\nbase %s\n' "$kind" "$base_key"; sha256sum <"$init_src"; sha256sum <"$script_path"; } | sha256)
image="$images_dir/$kind-$key.ext4"

if [[ -f "$image" ]]; then
    touch "$image"
    printf '%s\n' "$image"
    exit 0
fi

if [[ "$kind" == base && $EUID -ne 0 ]]; then
    die "building the base image needs root (debootstrap, file ownership)"
fi

exec 9>"$images_dir/.lock-$kind-$key"
if ! flock -n 9; then
    log "another build of $kind-$key is running; waiting for it"
    flock 9
fi
if [[ -f "$image" ]]; then
    touch "$image"
    printf '%s\n' "$image"
    exit 0
fi

stage=""
tmp_tree=""
tmp_image=""
db_pid=""
# Remove a half-made debootstrap tree: unmount whatever debootstrap left mounted in it (an
# interrupted run can leave /proc or /sys mounted) and never cross into another filesystem.
remove_tree() {
    local dir=$1 mnt
    [[ -d "$dir" ]] || return 0
    while IFS= read -r mnt; do
        umount -l "$mnt" 2>/dev/null || true
    done < <(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r)
    rm -rf --one-file-system "$dir"
}
cleanup() {
    local rc=$?
    if [[ -n "$db_pid" ]] && kill -0 "$db_pid" 2>/dev/null; then
        kill -- "-$db_pid" 2>/dev/null || kill "$db_pid" 2>/dev/null || true
        wait "$db_pid" 2>/dev/null || true
    fi
    [[ -z "$stage" ]] || rm -rf "$stage"
    [[ -z "$tmp_tree" ]] || remove_tree "$tmp_tree"
    [[ -z "$tmp_image" ]] || rm -f "$tmp_image"
    if [[ $rc -ne 0 ]]; then log "failed (exit $rc)"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the cached debootstrap tree (base only) ---
if [[ "$kind" == base && ! -d "$base_tree" ]]; then
    command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found (apt-get install debootstrap)"
    mkdir -p "$rootfs_dir"
    exec 8>"$rootfs_dir/.lock-base-$base_key"
    flock 8
    if [[ ! -d "$base_tree" ]]; then
        for stale in "$rootfs_dir/.tmp-base-$base_key".*; do remove_tree "$stale"; done
        tmp_tree=$(mktemp -d "$rootfs_dir/.tmp-base-$base_key.XXXXXX")
        t0=$(date +%s)
        log "debootstrap $suite (minbase + ${base_packages[*]}) from $mirror (first build only; about a minute with a fast mirror)"
        debootstrap_log="$tmp_tree/debootstrap.log"
        # In its own process group, so an interrupted build stops debootstrap and dpkg too.
        export -f make_base_tree log die
        setsid bash -c 'set -euo pipefail; make_base_tree "$@"' make_base_tree \
            "$tmp_tree/tree" "$suite" "$mirror" "${base_packages[@]}" 2>"$debootstrap_log" &
        db_pid=$!
        ticks=0
        while kill -0 "$db_pid" 2>/dev/null; do
            sleep 1
            ticks=$((ticks + 1))
            if ((ticks % 20 == 0)) && kill -0 "$db_pid" 2>/dev/null; then
                log "debootstrap: $(grep -E '^I: ' "$debootstrap_log" | tail -n1 | cut -c4-) ($(($(date +%s) - t0)) s)"
            fi
        done
        if ! wait "$db_pid"; then
            db_pid=""
            tail -n 30 "$debootstrap_log" >&2
            die "debootstrap failed (log above)"
        fi
        db_pid=""
        rm -f "$debootstrap_log"
        mkdir -p "$rootfs_dir/base-$base_key"
        mv -T "$tmp_tree/tree" "$base_tree"
        rm -rf "$tmp_tree"
        tmp_tree=""
        log "base tree ready in $(($(date +%s) - t0)) s: $base_tree ($(du -sh "$base_tree" | cut -f1))"
        touch "$rootfs_dir/base-$base_key"
        prune "$rootfs_dir/base-*" 2
    fi
    exec 8>&-
fi

# A sandbox has no network device: the only way out is space-guestd's HTTP proxy on
# 127.0.0.1:3128 (docs/egress.md). Point the usual tools at it. Execs and PTYs get the
# variables from the daemon as well; these cover login shells and tools that read only their
# own configuration. The CA variables apply once the host installed the deployment CA.
# The account E2B's SDKs run commands as by default: `user`, uid 1000, home /home/user,
# bash, passwordless sudo.
add_user_account() {
    local root=$1
    log "adding the account user (uid 1000, passwordless sudo)"
    if ! chroot "$root" getent passwd user >/dev/null; then
        chroot "$root" useradd --create-home --uid 1000 --user-group --shell /bin/bash \
            --groups sudo user >&2
    fi
    printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\n' >"$root/etc/sudoers.d/90-user"
    chmod 0440 "$root/etc/sudoers.d/90-user"
}

configure_egress_proxy() {
    local root=$1 proxy=http://127.0.0.1:3128 no_proxy=localhost,127.0.0.1,::1
    local ca=/usr/local/share/ca-certificates/space-ca.crt bundle=/etc/ssl/certs/ca-certificates.crt
    log "configuring the egress proxy ($proxy) for apt, pip, npm, git and shells"
    mkdir -p "$root/etc/apt/apt.conf.d" "$root/etc/profile.d"
    printf 'Acquire::http::Proxy "%s";\nAcquire::https::Proxy "%s";\n' "$proxy" "$proxy" \
        >"$root/etc/apt/apt.conf.d/90space-proxy"
    printf '[global]\nproxy = %s\n' "$proxy" >"$root/etc/pip.conf"
    printf 'proxy=%s\nhttps-proxy=%s\nnoproxy=%s\n' "$proxy" "$proxy" "$no_proxy" >"$root/etc/npmrc"
    printf '[http]\n\tproxy = %s\n' "$proxy" >>"$root/etc/gitconfig"
    {
        echo '# The egress proxy of space (docs/egress.md); values already set are kept.'
        for v in HTTP_PROXY HTTPS_PROXY http_proxy https_proxy; do
            printf ': "${%s:=%s}"; export %s\n' "$v" "$proxy" "$v"
        done
        for v in NO_PROXY no_proxy; do
            printf ': "${%s:=%s}"; export %s\n' "$v" "$no_proxy" "$v"
        done
        printf 'if [ -f %s ]; then\n' "$ca"
        for v in SSL_CERT_FILE CURL_CA_BUNDLE REQUESTS_CA_BUNDLE GIT_SSL_CAINFO; do
            printf '    : "${%s:=%s}"; export %s\n' "$v" "$bundle" "$v"
        done
        printf '    : "${NODE_EXTRA_CA_CERTS:=%s}"; export NODE_EXTRA_CA_CERTS\nfi\n' "$ca"
    } >"$root/etc/profile.d/space-proxy.sh"
    chmod 0644 "$root/etc/profile.d/space-proxy.sh"
    for v in HTTP_PROXY HTTPS_PROXY http_proxy https_proxy; do
        printf '%s="%s"\n' "$v" "$proxy"
    done >>"$root/etc/environment"
    printf 'NO_PROXY="%s"\nno_proxy="%s"\n' "$no_proxy" "$no_proxy" >>"$root/etc/environment"
}

# --- staging tree ---
t0=$(date +%s)
stage=$(mktemp -d "$images_dir/.stage-$kind.XXXXXX")
chmod 0755 "$stage"
case "$kind" in
minimal)
    log "assembling minimal tree (busybox)"
    make_minimal_tree "$stage"
    ;;
base)
    log "copying base tree"
    touch "$rootfs_dir/base-$base_key"
    cp -a --reflink=auto "$base_tree/." "$stage/"
    configure_egress_proxy "$stage"
    add_user_account "$stage"
    ;;
esac
# /sbin may be a symlink to usr/sbin (merged /usr); install through it.
install -D -m 0755 "$init_src" "$stage/usr/bin/space-guestd"
rm -f "$stage/sbin/init"
install -m 0755 "$init_src" "$stage/sbin/init"

# --- the image ---
tree_mib=$(du -sm --apparent-size "$stage" | cut -f1)
case "$kind" in
minimal) size_mib=256 ;;
base) size_mib=$((tree_mib + tree_mib / 10 + 512)) ;;
esac
tmp_image=$(mktemp "$images_dir/.tmp-$kind-$key.XXXXXX")
log "making ext4 image: ${size_mib} MiB sparse, tree ${tree_mib} MiB"
truncate -s "${size_mib}M" "$tmp_image"
mkfs_args=(-F -q -t ext4 -b 4096 -L space-root -m 0 -E root_owner=0:0 -d "$stage" "$tmp_image")
if [[ $EUID -eq 0 ]]; then
    mkfs.ext4 "${mkfs_args[@]}" >&2
elif command -v unshare >/dev/null 2>&1 && unshare -r true 2>/dev/null; then
    # As a mapped root in a user namespace the caller's files read as owned by 0:0, so the
    # image gets root-owned files without real root.
    unshare -r mkfs.ext4 "${mkfs_args[@]}" >&2
else
    log "warning: not root and no user namespaces; files in the image belong to uid $EUID"
    mkfs.ext4 "${mkfs_args[@]}" >&2
fi
e2fsck -fn "$tmp_image" >/dev/null 2>&1 || die "e2fsck found problems in the new image"
chmod 0644 "$tmp_image"
mv -T "$tmp_image" "$image"
tmp_image=""
rm -rf "$stage"
stage=""
rm -f "$images_dir/.lock-$kind-$key"
log "image ready in $(($(date +%s) - t0)) s: $image"
prune "$images_dir/$kind-*.ext4" "$keep"
printf '%s\n' "$image"
