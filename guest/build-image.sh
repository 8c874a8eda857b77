#!/usr/bin/env bash
# Build a sandbox root filesystem image (ext4, raw, sparse) without mounting anything.
#
# Usage: guest/build-image.sh <minimal|base|desktop> <path-to-static-space-guestd>
#
#   minimal  busybox (from the busybox-static package) and nothing else; builds in seconds.
#   base     Debian bookworm (debootstrap --variant=minbase) with bash, coreutils, python3 (also as `python`),
#            pip/venv, git, curl, ca-certificates, procps, iproute2, sudo, and the account
#            `user` (uid 1000, passwordless sudo). The debootstrap tree is cached, so only
#            the first build pays for it. Needs root.
#   desktop  the base tree plus an X desktop for computer use: Xvfb, Xfce (session, xfwm4,
#            xfdesktop, panel, terminal), xdotool, scrot, x11vnc, noVNC with websockify
#            (/opt/noVNC), Chromium, Firefox ESR, fonts. Its tree is cached like base's (it is
#            made from the base tree with apt-get). Needs root and ~370 MB of downloads once.
#
# The given binary becomes /sbin/init (mode 0755) and /usr/bin/space-guestd. The image path
# is printed as the last line of stdout; progress goes to stderr.
#
# Cache (root: ${SPACE_CACHE:-$HOME/.cache/space}):
#   images/<kind>-<key>.ext4    key = sha256(init binary, this script, kind, tree keys)
#   rootfs/base-<key>/tree/     key = sha256(package list, suite, the tree recipe function)
#   rootfs/desktop-<key>/tree/  key = sha256(package list, suite, base tree key, its recipe)
# Only the newest $SPACE_IMAGE_KEEP (default 3) images per kind and the newest 2 trees of each
# kind are kept.
#
# Environment: SPACE_CACHE, SPACE_DEBIAN_MIRROR (default http://deb.debian.org/debian),
#              SPACE_IMAGE_KEEP.
set -euo pipefail

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }
usage() { printf 'usage: %s <minimal|base|desktop> <path-to-static-space-guestd>\n' "$0" >&2; exit 2; }

(($# == 2)) || usage
kind=$1
init_src=$2
case "$kind" in minimal | base | desktop) ;; *) usage ;; esac
[[ -f "$init_src" ]] || die "init binary not found or not a regular file: $init_src"
init_src=$(readlink -f "$init_src")

script_path=$(readlink -f "${BASH_SOURCE[0]}")
cache_root="${SPACE_CACHE:-$HOME/.cache/space}"
images_dir="$cache_root/images"
rootfs_dir="$cache_root/rootfs"
mirror="${SPACE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
keep="${SPACE_IMAGE_KEEP:-3}"
suite=bookworm
base_packages=(bash coreutils python3 python-is-python3 python3-pip python3-venv git curl ca-certificates procps iproute2 sudo)
# On top of base, without recommends. What E2B's desktop SDK runs: Xvfb, xdpyinfo (x11-utils),
# startxfce4 with xfwm4 and xfdesktop, xdotool, scrot, xrandr (x11-xserver-utils), x11vnc,
# /opt/noVNC/utils/novnc_proxy (novnc, websockify), netstat (net-tools), xdg-open, gtk-launch
# (libgtk-3-bin). dbus-x11 gives the session its bus (startxfce4 runs dbus-launch). certutil
# (libnss3-tools) puts the gateway's CA into Chromium's certificate store when it starts.
desktop_packages=(xvfb xauth dbus-x11 xfce4-session xfwm4 xfdesktop4 xfce4-panel xfce4-settings
    xfce4-terminal xdotool scrot x11-xserver-utils x11-utils x11vnc novnc python3-websockify
    net-tools libgtk-3-bin xdg-utils librsvg2-common chromium firefox-esr libnss3-tools fonts-dejavu-core
    fonts-liberation fonts-noto-color-emoji)

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

# The desktop tree: a copy of the base tree, then apt-get inside it. Its text is part of the
# desktop tree key, like make_base_tree's is of the base tree's.
make_desktop_tree() {
    local root=$1 base=$2 suite=$3 mirror=$4
    shift 4
    local -a in_root=(chroot "$root" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin
        HOME=/root LC_ALL=C DEBIAN_FRONTEND=noninteractive)
    mkdir -p "$root"
    cp -a --reflink=auto "$base/." "$root/"
    # apt in the tree resolves with the build host's resolver; no package may start a service.
    cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    printf 'deb %s %s main\n' "$mirror" "$suite" >"$root/etc/apt/sources.list"
    printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
    chmod 0755 "$root/usr/sbin/policy-rc.d"
    mount -t proc proc "$root/proc"
    "${in_root[@]}" apt-get update -q >&2
    "${in_root[@]}" apt-get install -y -q --no-install-recommends "$@" >&2
    "${in_root[@]}" apt-get clean >&2
    umount "$root/proc"
    rm -f "$root/usr/sbin/policy-rc.d"
    # Small as base: no package caches, indexes, docs (licences stay), man pages, help,
    # translations or logs; Chromium keeps only its en-US strings. Python bytecode and the
    # fontconfig cache stay: both would be rebuilt, slowly, at first use under TCG.
    rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/var/cache/debconf/*-old \
        "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
        "$root"/usr/share/help/* "$root"/usr/share/gtk-doc "$root"/usr/share/lintian \
        "$root"/var/log/*.log "$root"/var/log/apt/* "$root"/var/cache/ldconfig/*
    find "$root/usr/lib/chromium/locales" -name '*.pak' ! -name 'en-US.pak' -delete
    find "$root/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete
    : >"$root/etc/resolv.conf"
    rm -f "$root/etc/machine-id" "$root/var/lib/dbus/machine-id"
}

# ---------------------------------------------------------------------------------------

check_init
mkdir -p "$images_dir"

base_key=""
base_tree=""
desktop_key=""
desktop_tree=""
if [[ "$kind" == base || "$kind" == desktop ]]; then
    base_key=$( { printf 'suite %s\npackages %s\n' "$suite" "${base_packages[*]}"; declare -f make_base_tree; } | sha256)
    base_tree="$rootfs_dir/base-$base_key/tree"
fi
if [[ "$kind" == desktop ]]; then
    desktop_key=$( { printf 'suite %s\nbase %s\npackages %s\n' "$suite" "$base_key" "${desktop_packages[*]}"; declare -f make_desktop_tree; } | sha256)
    desktop_tree="$rootfs_dir/desktop-$desktop_key/tree"
fi

key=$( { printf 'kind %s\nbase %s\ndesktop %s\n' "$kind" "$base_key" "$desktop_key"; sha256sum <"$init_src"; sha256sum <"$script_path"; } | sha256)
image="$images_dir/$kind-$key.ext4"

if [[ -f "$image" ]]; then
    touch "$image"
    printf '%s\n' "$image"
    exit 0
fi

if [[ "$kind" != minimal && $EUID -ne 0 ]]; then
    die "building the $kind image needs root (debootstrap, apt-get in a chroot, file ownership)"
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

# --- the cached trees (base, and desktop on top of it) ---
# Makes rootfs/<name>-<key>/tree unless it exists: runs the recipe function (its first
# argument the new tree, then the rest) in its own process group, so an interrupted build
# stops debootstrap, apt and dpkg too, in a temporary directory renamed into place at the end.
cached_tree() {
    local name=$1 tkey=$2 what=$3 recipe=$4
    shift 4
    local tree="$rootfs_dir/$name-$tkey/tree" stale t0 ticks tree_log
    [[ -d "$tree" ]] && return 0
    mkdir -p "$rootfs_dir"
    exec 8>"$rootfs_dir/.lock-$name-$tkey"
    flock 8
    if [[ ! -d "$tree" ]]; then
        for stale in "$rootfs_dir/.tmp-$name-$tkey".*; do remove_tree "$stale"; done
        tmp_tree=$(mktemp -d "$rootfs_dir/.tmp-$name-$tkey.XXXXXX")
        t0=$(date +%s)
        log "$what"
        tree_log="$tmp_tree/build.log"
        export -f "$recipe" log die
        setsid bash -c 'set -euo pipefail; "$0" "$@"' "$recipe" "$tmp_tree/tree" "$@" 2>"$tree_log" &
        db_pid=$!
        ticks=0
        while kill -0 "$db_pid" 2>/dev/null; do
            sleep 1
            ticks=$((ticks + 1))
            if ((ticks % 20 == 0)) && kill -0 "$db_pid" 2>/dev/null; then
                log "$name tree: $(grep -E '^(I: |Get:|Unpacking |Setting up )' "$tree_log" | tail -n1 | sed 's/^I: //' | cut -c1-100) ($(($(date +%s) - t0)) s)"
            fi
        done
        if ! wait "$db_pid"; then
            db_pid=""
            tail -n 30 "$tree_log" >&2
            die "the $name tree failed (log above)"
        fi
        db_pid=""
        rm -f "$tree_log"
        mkdir -p "$rootfs_dir/$name-$tkey"
        mv -T "$tmp_tree/tree" "$tree"
        rm -rf "$tmp_tree"
        tmp_tree=""
        log "$name tree ready in $(($(date +%s) - t0)) s: $tree ($(du -sh "$tree" | cut -f1))"
        touch "$rootfs_dir/$name-$tkey"
        prune "$rootfs_dir/$name-*" 2
    fi
    exec 8>&-
}

if [[ -n "$base_key" && ! -d "${desktop_tree:-$base_tree}" ]]; then
    command -v debootstrap >/dev/null 2>&1 || die "debootstrap not found (apt-get install debootstrap)"
    cached_tree base "$base_key" \
        "debootstrap $suite (minbase + ${base_packages[*]}) from $mirror (first build only; about a minute with a fast mirror)" \
        make_base_tree "$suite" "$mirror" "${base_packages[@]}"
fi
if [[ -n "$desktop_key" && ! -d "$desktop_tree" ]]; then
    touch "$rootfs_dir/base-$base_key"
    cached_tree desktop "$desktop_key" \
        "apt-get install ${desktop_packages[*]} into a copy of the base tree (first build only; a few minutes, ~370 MB of downloads)" \
        make_desktop_tree "$base_tree" "$suite" "$mirror" "${desktop_packages[@]}"
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

# What the desktop image adds to its tree; written per image, so changing it does not re-run
# apt. The layout follows E2B's desktop template, which its SDK assumes.
configure_desktop() {
    local root=$1
    log "configuring the desktop: /opt/noVNC, Chromium and Firefox defaults, no screen blanking, machine id"
    # noVNC where the SDK looks for it (/opt/noVNC/utils/novnc_proxy, /opt/noVNC/vnc.html);
    # novnc_proxy finds Debian's websockify on PATH.
    mkdir -p "$root/opt"
    ln -sfn /usr/share/novnc "$root/opt/noVNC"
    # Debian's /usr/bin/chromium sources every file in /etc/chromium.d and passes
    # $CHROMIUM_FLAGS before the caller's arguments. In a VM whose memory is its snapshot:
    # no background work that costs memory (component and model downloads, translation, the
    # media router, a spare renderer kept warm, prerendering, the back-forward cache), no
    # traffic through the egress gateway that nobody asked for, no first-run, default-browser
    # or keyring prompt in the way of a program driving it. There is no GPU: --disable-gpu
    # halves the GPU process (software compositing without GL emulation). The network
    # service runs in the browser process: one process fewer, and under TCG a separate one
    # could miss its 15 s start-up handshake, be restarted and lose the first navigation;
    # the longer IPC timeout keeps the other child processes from the same fate. Autofill
    # and the password manager are left alone (logins in the sandbox use them).
    mkdir -p "$root/etc/chromium.d"
    cat >"$root/etc/chromium.d/space-defaults" <<'EOF'
# Defaults of the space desktop image (guest/build-image.sh, docs/guest.md).
CHROMIUM_FLAGS="$CHROMIUM_FLAGS --no-first-run --no-default-browser-check --password-store=basic"
CHROMIUM_FLAGS="$CHROMIUM_FLAGS --disable-background-networking --disable-component-update"
CHROMIUM_FLAGS="$CHROMIUM_FLAGS --disable-sync --disable-default-apps --disable-domain-reliability"
CHROMIUM_FLAGS="$CHROMIUM_FLAGS --disable-client-side-phishing-detection --no-pings"
CHROMIUM_FLAGS="$CHROMIUM_FLAGS --hide-crash-restore-bubble --disable-gpu --ipc-connection-timeout=60"
CHROMIUM_FLAGS="$CHROMIUM_FLAGS --enable-features=NetworkServiceInProcess2"
CHROMIUM_FLAGS="$CHROMIUM_FLAGS --disable-features=Translate,MediaRouter,DialMediaRouteProvider,OptimizationHints,OptimizationGuideModelDownloading,SpareRendererForSitePerProcess,Prerender2,BackForwardCache,InterestFeedContentSuggestions,CertificateTransparencyComponentUpdater"
export CHROMIUM_FLAGS
EOF
    chmod 0644 "$root/etc/chromium.d/space-defaults"
    # Xfce's session starts its clients one priority group at a time and waits for each
    # group to register; stock, the desktop (xfdesktop) comes last, after the settings
    # daemon, the panel and Thunar (not installed), about 26 s under TCG. Clients that
    # drive the desktop wait for xfwm4 and xfdesktop, so those two start first, together:
    # about 5 s. Settings and the panel follow.
    cat >"$root/etc/xdg/xfce4/xfconf/xfce-perchannel-xml/xfce4-session.xml" <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<channel name="xfce4-session" version="1.0">
  <property name="general" type="empty">
    <property name="FailsafeSessionName" type="string" value="Failsafe"/>
    <property name="LockCommand" type="string" value=""/>
  </property>
  <property name="sessions" type="empty">
    <property name="Failsafe" type="empty">
      <property name="IsFailsafe" type="bool" value="true"/>
      <property name="Count" type="int" value="4"/>
      <property name="Client0_Command" type="array">
        <value type="string" value="xfwm4"/>
      </property>
      <property name="Client0_Priority" type="int" value="15"/>
      <property name="Client0_PerScreen" type="bool" value="false"/>
      <property name="Client1_Command" type="array">
        <value type="string" value="xfdesktop"/>
      </property>
      <property name="Client1_Priority" type="int" value="15"/>
      <property name="Client1_PerScreen" type="bool" value="false"/>
      <property name="Client2_Command" type="array">
        <value type="string" value="xfsettingsd"/>
      </property>
      <property name="Client2_Priority" type="int" value="20"/>
      <property name="Client2_PerScreen" type="bool" value="false"/>
      <property name="Client3_Command" type="array">
        <value type="string" value="xfce4-panel"/>
      </property>
      <property name="Client3_Priority" type="int" value="25"/>
      <property name="Client3_PerScreen" type="bool" value="false"/>
    </property>
  </property>
</channel>
EOF
    chmod 0644 "$root/etc/xdg/xfce4/xfconf/xfce-perchannel-xml/xfce4-session.xml"
    # The X server blanks the screen after 10 idle minutes, and screenshots then come back
    # black: the Xfce session turns the screen saver and DPMS off when it starts.
    mkdir -p "$root/etc/xdg/autostart"
    cat >"$root/etc/xdg/autostart/space-no-blanking.desktop" <<'EOF'
[Desktop Entry]
Type=Application
Name=No screen blanking
Exec=xset s off s noblank -dpms
NoDisplay=true
EOF
    chmod 0644 "$root/etc/xdg/autostart/space-no-blanking.desktop"
    # Firefox ESR is the default browser (x-www-browser, so xdg-open and Xfce use it): no
    # telemetry, studies, default-browser check or first-run and what's-new tabs (the first
    # run would open Mozilla's privacy notice, a request through the egress gateway).
    mkdir -p "$root/usr/share/firefox-esr/distribution"
    cat >"$root/usr/share/firefox-esr/distribution/policies.json" <<'EOF'
{
  "policies": {
    "DisableTelemetry": true,
    "DisableFirefoxStudies": true,
    "DontCheckDefaultBrowser": true,
    "OverrideFirstRunPage": "",
    "OverridePostUpdatePage": "",
    "UserMessaging": {
      "WhatsNew": false,
      "ExtensionRecommendations": false,
      "FeatureRecommendations": false,
      "SkipOnboarding": true,
      "MoreFromMozilla": false
    }
  }
}
EOF
    chmod 0644 "$root/usr/share/firefox-esr/distribution/policies.json"
    # A machine id, unlike base: without one libdbus cannot find the session's bus through
    # the X display, so every program started by its own exec (the SDK starts each one that
    # way) runs without the session bus (Chromium logs bus errors; a second firefox-esr
    # cannot hand its URL to the running one). Every sandbox of one image build shares it.
    tr -d '-' </proc/sys/kernel/random/uuid >"$root/etc/machine-id"
    chmod 0444 "$root/etc/machine-id"
    mkdir -p "$root/var/lib/dbus"
    ln -sfn /etc/machine-id "$root/var/lib/dbus/machine-id"
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
desktop)
    log "copying desktop tree"
    touch "$rootfs_dir/desktop-$desktop_key"
    cp -a --reflink=auto "$desktop_tree/." "$stage/"
    configure_egress_proxy "$stage"
    add_user_account "$stage"
    configure_desktop "$stage"
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
# Browser profiles and caches grow fast: 1 GiB free rather than base's half.
desktop) size_mib=$((tree_mib + tree_mib / 10 + 1024)) ;;
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
