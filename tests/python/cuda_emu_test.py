#!/usr/bin/env python3
"""The expertd Python package on a cuda expertd's VRAM arena, without a GPU: the package built
with EXPERTD_PY_CUDA=EMU (the tests' CPU emulation of the CUDA runtime, whose device memory is
host memory shared across processes) against expertd_emu --backend cuda. The path a GPU takes is
the same code (client/cuda_slots.cpp: the arena opened through a CUDA IPC memory handle, each
slot's interprocess event waited on by the default stream); here the "device" pointers can be
read from the CPU, so each acquired expert's bytes are checked against the pack.

Checked: info says the arena is cuda; Lease.pointer(i) is ("cuda:0", the slot's bytes) and its
memory equals the pack's bytes for every expert of two layers with fewer slots than experts;
pointer(i, role) is the role's offset into it; NumPy views of VRAM raise naming lease.torch."""
import argparse
import ctypes
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()
B, SRC = os.path.abspath(args.bin), os.path.abspath(args.source)
VENV = os.path.join(B, "python-emu-venv")
PY = os.path.join(VENV, "bin", "python")

if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
    if not os.path.exists(os.path.join(VENV, ".ready")):
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([PY, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               "scikit-build-core>=0.10", "nanobind>=2.0", "numpy>=1.22"])
        open(os.path.join(VENV, ".ready"), "w").close()
    subprocess.check_call([PY, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "--no-build-isolation", "--force-reinstall", "--no-deps",
                           "-C", "build-dir=" + os.path.join(B, "python-emu-build"),
                           "-C", "cmake.define.EXPERTD_PY_CUDA=EMU", os.path.join(SRC, "python")])
    os.execv(PY, [PY] + sys.argv)

import expertd  # noqa: E402

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


tmp = tempfile.mkdtemp(prefix="python-emu-", dir=B)
d = None
try:
    model = os.path.join(tmp, "m.gguf")
    shutil.copy(os.path.join(SRC, "model", "kjv-moe-q8_0.gguf"), model)
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", model], check=True,
                   stdout=subprocess.DEVNULL)
    manifest = json.load(open(os.path.join(tmp, "m.manifest.json")))
    pack = open(os.path.join(tmp, manifest["pack_file"]), "rb").read()
    sock = os.path.join(tmp, "s.sock")
    open(sock + ".conf", "w").write("# flags only\n")
    d = subprocess.Popen([os.path.join(B, "daemon", "expertd_emu"), "--manifest",
                          os.path.join(tmp, "m.manifest.json"), "--socket", sock, "--config",
                          sock + ".conf", "--lock-memory", "false", "--reserve-mib", "16",
                          "--backend", "cuda", "--cache-slots", "24", "--stage-slots", "4",
                          "--clients-max", "2"],
                         stdout=open(sock + ".log", "w"), stderr=subprocess.STDOUT)
    for _ in range(500):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            break
        except OSError:
            if d.poll() is not None:
                raise RuntimeError("expertd_emu did not start: " + open(sock + ".log").read())
            time.sleep(0.02)

    c = expertd.Client.connect(sock)
    info = c.info
    check(info["arena"] == "cuda", f"the arena is {info['arena']}")
    same = total = 0
    for li in (0, 3):
        layer = manifest["layers"][li]
        for e0 in range(0, manifest["n_experts"], 4):
            ids = list(range(e0, e0 + 4))
            with c.acquire(li, ids) as lease:
                for i, e in enumerate(ids):
                    ptr, size, dev = lease.pointer(i)
                    at = layer["base"] + e * layer["stride"]
                    ok = dev == "cuda:0" and size == info["slot_bytes"]
                    same += ok and ctypes.string_at(ptr, layer["stride"]) == pack[at:at + layer["stride"]]
                    total += 1
    check(same == total == 2 * manifest["n_experts"],
          f"{same} of {total} experts' VRAM slots (24 slots, 2 clients of 8) hold the pack's bytes")

    role = info["layers"][0]["roles"][2]
    with c.acquire(0, [5]) as lease:
        base, _, _ = lease.pointer(0)
        rp, rbytes, dev = lease.pointer(0, role["role"])
        check(rp == base + role["offset"] and rbytes == role["bytes"] and dev == "cuda:0",
              f"pointer(i, '{role['role']}') is at the role's offset ({role['offset']}, {rbytes} bytes)")
        for fn, what in ((lambda: lease.view(0), "view"), (lambda: lease.tensor(0, "gate"), "tensor")):
            try:
                fn()
                check(False, f"a NumPy {what} of VRAM raises")
            except expertd.Error as e:
                check("VRAM" in str(e) and "lease.torch" in str(e), f"a NumPy {what} of VRAM: {e}")
    c.close()
finally:
    if d:
        d.terminate()
        d.wait(timeout=30)
    shutil.rmtree(tmp, ignore_errors=True)

if failures:
    print(f"{len(failures)} failed: " + "; ".join(failures))
    sys.exit(1)
print("all checks passed")
