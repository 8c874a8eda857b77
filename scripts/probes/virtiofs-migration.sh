#!/usr/bin/env bash
# Asks this host's QEMU whether a VM with a virtio-fs device (vhost-user-fs, served by
# virtiofsd) can be migrated, which is what a suspend does (docs/volumes.md, *Why FUSE over
# the uplink*). Prints QEMU's answer to `migrate` and `query-migrate`.
# Usage: scripts/probes/virtiofs-migration.sh   (needs qemu-system-x86_64 and virtiofsd)
set -euo pipefail
virtiofsd=$(command -v virtiofsd || echo /usr/lib/qemu/virtiofsd)
[[ -x $virtiofsd ]] || { echo "no virtiofsd (Debian: the qemu-system-common package)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
"$virtiofsd" --socket-path="$dir/vfs.sock" -o source="$dir" -o cache=none >"$dir/virtiofsd.log" 2>&1 &
for _ in $(seq 50); do [[ -S $dir/vfs.sock ]] && break; sleep 0.1; done
qemu-system-x86_64 -M microvm,memory-backend=mem -accel tcg -m 256M \
    -object memory-backend-memfd,id=mem,size=256M,share=on -nodefaults -nographic -S \
    -chardev socket,id=vfs,path="$dir/vfs.sock" -device vhost-user-fs-device,chardev=vfs,tag=vol \
    -qmp unix:"$dir/qmp.sock",server=on,wait=off >"$dir/qemu.log" 2>&1 &
for _ in $(seq 50); do [[ -S $dir/qmp.sock ]] && break; sleep 0.1; done
python3 - "$dir/qmp.sock" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.readline()
def cmd(c):
    f.write(json.dumps(c) + "\n")
    f.flush()
    while True:
        line = json.loads(f.readline())
        if "event" not in line:
            return line
cmd({"execute": "qmp_capabilities"})
print("migrate:", json.dumps(cmd({"execute": "migrate", "arguments": {"uri": "exec:cat > /dev/null"}})))
print("query-migrate:", json.dumps(cmd({"execute": "query-migrate"})))
cmd({"execute": "quit"})
PY
