#!/usr/bin/env bash
# Installs what building, running and testing space needs on Debian 12, idempotently:
# packages already present are not touched, so a warm run costs well under a second.
set -euo pipefail

log() { printf '[deps] %s\n' "$*" >&2; }

PACKAGES=(
    # the sandbox runtime and the guest images
    qemu-system-x86 qemu-utils busybox-static e2fsprogs debootstrap btrfs-progs
    # the reflink storage driver is tested on XFS
    xfsprogs
    # the guest kernel, built from Debian's source package
    linux-source-6.12 build-essential flex bison bc libelf-dev libssl-dev xz-utils cpio
    # tools the scripts and tests use
    util-linux procps ca-certificates curl python3-venv tmux
    # images: a registry, and the tools that make and push test images (no Docker daemon)
    docker-registry umoci skopeo apache2-utils
    # the live view's end-to-end tests open it in a real browser that trusts the deployment CA
    chromium libnss3-tools
)

if [[ $(id -u) -ne 0 ]]; then
    log "space needs root (loop devices, btrfs mounts, QEMU); run as root"
    exit 1
fi

# A cold build and test run writes several GB under target/ and the data dirs;
# running out of disk shows up as a linker bus error, so say it plainly first.
avail_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if ((avail_kb < 8 * 1024 * 1024)); then
    log "warning: only $((avail_kb / 1024 / 1024)) GB free here; a cold build and test run needs about 8 GB"
fi

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
        missing+=("$p")
    fi
done

if ((${#missing[@]})); then
    log "installing ${#missing[@]} Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be stale or absent on a fresh machine.
    log "apt-get update"
    apt-get update -qq >&2
    log "apt-get install (this can take a few minutes on a fresh machine)"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    log "packages installed"
fi

if ! command -v cargo >/dev/null 2>&1; then
    if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
        log "cargo is in ~/.cargo/bin; add it to PATH"
    else
        log "no Rust toolchain found: install Rust (rustup) and run again"
    fi
    exit 1
fi

# Static linking of the guest daemon needs the target's std, which every rustup toolchain has
# for the host triple; nothing to add here beyond checking the compiler works.
rustc --version >/dev/null
