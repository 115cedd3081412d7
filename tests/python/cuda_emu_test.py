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
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from py_util import Packed, check, finish, in_package_venv, start_expertd  # noqa: E402
import py_util  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()
B, SRC = os.path.abspath(args.bin), os.path.abspath(args.source)
in_package_venv(B, SRC, "python-emu-venv", [], defines=["EXPERTD_PY_CUDA=EMU"])

import expertd  # noqa: E402

tmp = tempfile.mkdtemp(prefix="python-emu-", dir=B)
d = None
try:
    pk = Packed(B, SRC, tmp)
    manifest = pk.manifest
    pack = open(pk.pack_file, "rb").read()
    sock = os.path.join(tmp, "s.sock")
    d = start_expertd(B, pk.manifest_path, sock, ["--backend", "cuda", "--cache-slots", "24",
                                                   "--stage-slots", "4", "--clients-max", "2"],
                      exe="expertd_emu")

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
            py_util.raises(expertd.Error, fn, ["VRAM", "lease.torch"], f"a NumPy {what} of VRAM")
    c.close()
finally:
    py_util.stop_all([d], tmp)

finish()
