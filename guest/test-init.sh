#!/bin/sh
# Stand-in PID 1 for checking a kernel + image without space-guestd (used by boot-test.py).
# Works with busybox sh (minimal image) and dash (base image).
#
# It mounts the pseudo filesystems, reports what it finds on the serial console (lines
# "CHECK <name> <value>"), writes one byte "R" to the space.ctl port as the readiness marker,
# then serves that port line by line:
#   uptime   -> the guest's /proc/uptime seconds
#   reboot   -> "BYE", then reboot(RB_AUTOBOOT) (QEMU with -no-reboot exits)
#   anything else is echoed back.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
con=/dev/ttyS0

mount -t proc proc /proc
mount -t sysfs sysfs /sys 2>/dev/null
# CONFIG_DEVTMPFS_MOUNT has mounted /dev already; this is a fallback.
[ -e /dev/null ] || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null

ctl=""
for d in /sys/class/virtio-ports/*; do
    name=$(cat "$d/name")
    echo "CHECK port $name /dev/${d##*/} ($(cat "$d/dev"))" >$con
    [ "$name" = space.ctl ] && ctl=/dev/${d##*/}
done
if [ -z "$ctl" ]; then
    echo "CHECK FAIL no space.ctl port" >$con
    exec reboot -f
fi
# A virtio-serial port can be open only once: open it read-write a single time.
exec 3<>"$ctl"
printf R >&3

echo "CHECK nproc $(nproc)" >$con
echo "CHECK hwrng $(cat /sys/class/misc/hw_random/rng_current 2>&1)" >$con
echo "CHECK uuid $(cat /proc/sys/kernel/random/uuid)" >$con
date -s '2030-01-02 03:04:05' >/dev/null 2>&1 && echo "CHECK date $(date +%Y-%m-%dT%H:%M)" >$con
hostname sandbox-test && echo "CHECK hostname $(hostname)" >$con
echo "CHECK uname $(uname -r)" >$con
echo "CHECK cgroup2 $(cat /sys/fs/cgroup/cgroup.controllers 2>&1)" >$con
echo "CHECK pty $(ls /dev/pts/ptmx 2>&1)" >$con
if command -v ip >/dev/null 2>&1; then ip link set lo up; else ifconfig lo 127.0.0.1 up; fi
echo "CHECK lo $(cat /sys/class/net/lo/operstate)" >$con
if command -v python3 >/dev/null 2>&1; then
    echo "CHECK python3 $(python3 -c 'print(1+1)' 2>&1)" >$con
fi
echo "CHECK uptime $(cut -d' ' -f1 /proc/uptime)" >$con

while IFS= read -r line <&3; do
    case "$line" in
    reboot) echo BYE >&3; break ;;
    uptime) cut -d' ' -f1 /proc/uptime >&3 ;;
    *) printf '%s\n' "$line" >&3 ;;
    esac
done
sync
# busybox has reboot -f; Debian minbase has no reboot binary, so call reboot(2) from python.
# If both fail, init exits, the kernel panics and panic=-1 still ends the VM.
reboot -f 2>/dev/null || python3 -c 'import ctypes; ctypes.CDLL(None).reboot(0x01234567)'
