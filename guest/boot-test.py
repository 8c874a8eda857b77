#!/usr/bin/env python3
"""Boot the guest kernel with an image under QEMU microvm and check the result.

Usage: guest/boot-test.py [--kind minimal|base|desktop] [--smp N] [--runs N] [--accel tcg|kvm]

Builds (or reuses) the kernel with build-kernel.sh, builds an image of the requested kind
with test-init.sh as /sbin/init (in a private cache directory, so test images never push
real ones out of the image cache), then boots it --runs times. Each run measures the time
from starting QEMU to the guest's first byte on the space.ctl port, round-trips a payload
over that port, compares the guest clock rate with the host's, asks the guest to reboot and
checks that QEMU exits by itself. Prints one line per run, the guest's CHECK lines of the
first run, and a summary; exits non-zero if any run failed. Needs qemu-system-x86_64.
Every QEMU it starts is killed and every temporary file removed before it returns.
"""
import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg):
    print(f"[boot-test] {msg}", file=sys.stderr, flush=True)


def host_tsc_khz():
    """TSC frequency of this host in kHz. Under TCG the guest's TSC counts host TSC ticks, so
    this is the value the guest must be told (tsc_early_khz=). SPACE_TSC_KHZ overrides."""
    env = os.environ.get("SPACE_TSC_KHZ")
    if env:
        return int(env)
    # rdtsc is not reachable from Python: run four instructions from an executable page
    # (rdtsc; shl rdx, 32; or rax, rdx; ret) and compare with CLOCK_MONOTONIC_RAW.
    try:
        import ctypes
        import mmap
        code = b"\x0f\x31\x48\xc1\xe2\x20\x48\x09\xd0\xc3"
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        page.write(code)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(page))
        rdtsc = ctypes.CFUNCTYPE(ctypes.c_uint64)(addr)
        def pair():
            # the clock read closest to a TSC read: bracket it and keep the tightest of 5
            best = None
            for _ in range(5):
                a = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
                c = rdtsc()
                b = time.clock_gettime_ns(time.CLOCK_MONOTONIC_RAW)
                if best is None or b - a < best[0]:
                    best = (b - a, c, (a + b) // 2)
            return best[1], best[2]
        samples = []
        for _ in range(3):
            c0, n0 = pair()
            time.sleep(0.1)
            c1, n1 = pair()
            samples.append((c1 - c0) * 1e6 / (n1 - n0))
        del rdtsc, addr
        return int(round(statistics.median(samples) / 10.0)) * 10
    except Exception as e:
        log(f"cannot measure the TSC frequency: {e}")
        return None


def build(kind):
    kernel = subprocess.run([os.path.join(HERE, "build-kernel.sh")], check=True,
                            stdout=subprocess.PIPE, text=True).stdout.strip().splitlines()[-1]
    cache = tempfile.mkdtemp(prefix="space-boot-test-cache-")
    env = dict(os.environ)
    if kind in ("base", "desktop"):
        # Reuse the cached trees of the real cache; only the image is private.
        real = os.environ.get("SPACE_CACHE", os.path.expanduser("~/.cache/space"))
        os.makedirs(os.path.join(cache, "rootfs"), exist_ok=True)
        rootfs = os.path.join(real, "rootfs")
        if os.path.isdir(rootfs):
            for entry in os.listdir(rootfs):
                if entry.startswith(("base-", "desktop-")):
                    os.symlink(os.path.join(rootfs, entry), os.path.join(cache, "rootfs", entry))
    env["SPACE_CACHE"] = cache
    image = subprocess.run([os.path.join(HERE, "build-image.sh"), kind,
                            os.path.join(HERE, "test-init.sh")], check=True,
                           stdout=subprocess.PIPE, text=True, env=env).stdout.strip().splitlines()[-1]
    return kernel, image, cache


def qemu_args(d, kernel, disk, smp, mem, accel, tsc_khz):
    append = "console=ttyS0 root=/dev/vda rw quiet panic=-1 reboot=t"
    if accel == "tcg":
        append += " tsc=reliable"
        if tsc_khz:
            append += f" tsc_early_khz={tsc_khz}"
    cpu = "max" if accel == "tcg" else "host"
    return [
        "qemu-system-x86_64", "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
        "-M", "microvm,acpi=off,memory-backend=mem", "-accel", accel, "-cpu", cpu,
        "-smp", str(smp), "-m", f"{mem}M",
        "-object", f"memory-backend-file,id=mem,size={mem}M,mem-path={d}/mem,share=on",
        "-serial", f"file:{d}/console.log",
        "-drive", f"id=root,file={disk},format=raw,if=none",
        "-device", "virtio-blk-device,drive=root",
        "-object", "rng-random,id=rng,filename=/dev/urandom",
        "-device", "virtio-rng-device,rng=rng",
        "-device", "virtio-serial-device,id=vser",
        "-chardev", f"socket,id=ctl,path={d}/ctl.sock,server=on,wait=off",
        "-device", "virtserialport,bus=vser.0,chardev=ctl,name=space.ctl,nr=1",
        "-chardev", f"socket,id=egress,path={d}/egress.sock,server=on,wait=off",
        "-device", "virtserialport,bus=vser.0,chardev=egress,name=space.egress,nr=2",
        "-qmp", f"unix:{d}/qmp.sock,server=on,wait=off",
        "-kernel", kernel, "-append", append,
    ]


def one_run(kernel, image, smp, mem, accel, tsc_khz, timeout):
    d = tempfile.mkdtemp(prefix="space-boot-test-")
    res = {"ok": False}
    proc = None
    try:
        disk = os.path.join(d, "rootfs.ext4")
        subprocess.run(["cp", "--sparse=always", "--reflink=auto", image, disk], check=True)
        t0 = time.monotonic()
        proc = subprocess.Popen(qemu_args(d, kernel, disk, smp, mem, accel, tsc_khz),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(d, "qemu.log"), "wb"))
        sock = None
        while sock is None:
            if time.monotonic() - t0 > 10 or proc.poll() is not None:
                raise RuntimeError("QEMU did not create ctl.sock")
            try:
                sock = socket.socket(socket.AF_UNIX)
                sock.connect(os.path.join(d, "ctl.sock"))
            except OSError:
                sock = None
                time.sleep(0.005)
        sock.settimeout(timeout)
        first = sock.recv(1)
        if first != b"R":
            raise RuntimeError(f"expected readiness byte R, got {first!r}")
        res["ready_s"] = time.monotonic() - t0

        def roundtrip(payload):
            sock.sendall(payload)
            got = b""
            while not got.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise RuntimeError("ctl port closed")
                got += chunk
            return got

        payload = os.urandom(2048).hex().encode() + b"\n"
        t1 = time.monotonic()
        res["echo_ok"] = roundtrip(payload) == payload
        res["echo_ms"] = (time.monotonic() - t1) * 1000
        g0, h0 = float(roundtrip(b"uptime\n")), time.monotonic()
        time.sleep(1.0)
        g1, h1 = float(roundtrip(b"uptime\n")), time.monotonic()
        res["clock_rate"] = (g1 - g0) / (h1 - h0)
        if roundtrip(b"reboot\n") != b"BYE\n":
            raise RuntimeError("no BYE before reboot")
        t2 = time.monotonic()
        res["exit_code"] = proc.wait(timeout=30)
        res["exit_ms"] = (time.monotonic() - t2) * 1000
        res["ok"] = res["echo_ok"] and res["exit_code"] == 0 and abs(res["clock_rate"] - 1) < 0.05
    except Exception as e:  # report and go on with the next run
        res["error"] = str(e)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
            res["killed"] = True
        try:
            with open(os.path.join(d, "console.log"), errors="replace") as f:
                res["console"] = f.read()
        except OSError:
            res["console"] = ""
        shutil.rmtree(d, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=["minimal", "base", "desktop"], default="minimal")
    ap.add_argument("--smp", type=int, default=1)
    ap.add_argument("--mem", type=int, default=256, help="MiB")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--accel", choices=["tcg", "kvm"], default="tcg")
    ap.add_argument("--timeout", type=float, default=60)
    a = ap.parse_args()

    tsc_khz = host_tsc_khz() if a.accel == "tcg" else None
    if a.accel == "tcg" and not tsc_khz:
        log("warning: host TSC frequency unknown (set SPACE_TSC_KHZ); the guest may fall back "
            "to the jiffies clocksource")
    kernel, image, cache = build(a.kind)
    try:
        log(f"kernel {kernel}")
        log(f"image  {image} ({a.kind}), smp {a.smp}, {a.mem} MiB, {a.accel}, tsc_khz {tsc_khz}")
        results = []
        for i in range(a.runs):
            r = one_run(kernel, image, a.smp, a.mem, a.accel, tsc_khz, a.timeout)
            results.append(r)
            fields = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                              for k, v in r.items() if k != "console")
            print(f"run {i + 1}: {fields}", flush=True)
            if not r["ok"]:
                print(r["console"][-3000:])
        checks = [l for l in results[0]["console"].splitlines() if l.startswith("CHECK")]
        print("\n".join(checks))
        ready = [r["ready_s"] for r in results if "ready_s" in r]
        if ready:
            print(f"ready (QEMU start -> first byte from init on space.ctl): "
                  f"min {min(ready):.3f} s, median {statistics.median(ready):.3f} s, "
                  f"max {max(ready):.3f} s over {len(ready)} runs")
        failed = sum(not r["ok"] for r in results)
        print(f"{len(results) - failed}/{len(results)} runs ok")
        return 1 if failed else 0
    finally:
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
