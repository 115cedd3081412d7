#!/usr/bin/env python3
"""The expertd Python package (python/) against a real expertd serving the bundled model's pack:
built with pip into a venv under the build directory (scikit-build-core and nanobind from PyPI),
then: the model's info as the manifest says; each acquired expert's view equal to the pack's bytes
for it, read-only and without a copy; a role's rows dequantized equal to NumPy's own Q8_0
arithmetic; a lease's arrays keeping its slots until they are gone; bad input of every kind as
expertd.Error naming the cause; two Python processes and expert-run on one expertd at once; and
python -m expertd stats."""
import argparse
import json
import os
import subprocess
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
in_package_venv(B, SRC, "python-venv", [])

import numpy as np  # noqa: E402

import expertd  # noqa: E402


def raises(fn, words, what):
    py_util.raises(expertd.Error, fn, words, what)


tmp = tempfile.mkdtemp(prefix="python-test-", dir=B)
procs = []
try:
    pk = Packed(B, SRC, tmp)
    manifest = pk.manifest
    pack = open(pk.pack_file, "rb").read()
    sock = os.path.join(tmp, "s.sock")
    # 48 slots for the model's 128 experts: acquires miss and are read while the test waits.
    procs.append(start_expertd(B, pk.manifest_path, sock, ["--cache-slots", "48", "--clients-max", "4"]))

    c = expertd.Client.connect(sock)
    info = c.info
    check(info["arch"] == manifest["arch"] and info["n_experts"] == manifest["n_experts"]
          and len(info["layers"]) == len(manifest["layers"]),
          f"info: {info['arch']}, {info['n_experts']} experts, {len(info['layers'])} layers")
    roles = [r["role"] for r in info["layers"][0]["roles"]]
    check(roles == [r["role"] for r in manifest["layers"][0]["roles"]], f"roles {roles}")
    check(info["layers"][0]["roles"][0]["type_name"] == "Q8_0", "role types named")

    # Every expert of every layer, in acquires of 4, equal to the pack's bytes.
    same = total = 0
    for li, layer in enumerate(manifest["layers"]):
        for e0 in range(0, manifest["n_experts"], 4):
            ids = list(range(e0, e0 + 4))
            with c.acquire(li, ids) as lease:
                for i, e in enumerate(ids):
                    v = lease.view(i)
                    at = layer["base"] + e * layer["stride"]
                    same += bytes(v[:layer["stride"]]) == pack[at:at + layer["stride"]]
                    total += 1
                del v
    check(same == total and total == manifest["n_experts"] * len(manifest["layers"]),
          f"{same} of {total} experts' views equal the pack's bytes")

    with c.acquire(0, [5, 9]) as lease:
        a, b = lease.view(0), lease.view(0)
        check(not a.flags.writeable, "a view is read-only")
        try:
            a[0] = 1
            check(False, "writing a view raises")
        except ValueError:
            check(True, "writing a view raises ValueError")
        check(np.shares_memory(a, b) and a.ctypes.data == b.ctypes.data,
              "two views of one expert are the same memory (no copy)")
        # gate rows of expert 9: Q8_0 blocks (f16 scale, 32 int8) dequantized by the package and
        # by NumPy's own arithmetic
        role = info["layers"][0]["roles"][0]
        g = lease.tensor(1, "gate")
        rows, cols = role["shape"]
        check(g.dtype == np.uint8 and g.shape == (rows, cols // 32 * 34), f"gate rows {g.shape}")
        w = expertd.dequantize(g, "Q8_0", (rows, cols))
        blocks = np.frombuffer(g.tobytes(), dtype=[("d", "<f2"), ("q", "i1", 32)])
        ref = (blocks["d"].astype(np.float32)[:, None] * blocks["q"].astype(np.float32)).reshape(rows, cols)
        check(w.dtype == np.float32 and np.array_equal(w, ref), "dequantize(Q8_0) == NumPy's")
        into = np.full((rows + 1, cols), 7.0, np.float32)
        got = expertd.dequantize(g, "Q8_0", (rows, cols), out=into[1:])
        check(np.array_equal(into[1:], ref) and np.all(into[0] == 7.0) and np.shares_memory(got, into),
              "dequantize(..., out=) writes the rows into the caller's array, nothing else")
        raises(lambda: expertd.dequantize(g, "Q8_0", (rows, cols), out=np.empty((rows, 2), np.float32)),
               ["out holds"], "an out of the wrong size")
        raises(lambda: expertd.dequantize(g, "Q8_0", (rows, cols), out=np.empty((rows, cols), np.float64)),
               ["float32"], "an out that is not float32")
        del a, b, g
    raises(lambda: lease.view(0), ["released"], "a released lease's view")

    # An array keeps its lease: the next acquire waits for it to go.
    with c.acquire(0, [1]) as lease:
        kept = lease.view(0)
    raises(lambda: c.acquire(0, [2]), ["still held"], "acquire while an array of the last lease lives")
    want = bytes(kept)
    del kept
    with c.acquire(0, [2]) as lease:
        check(len(lease) == 1 and lease.experts == [2], "acquire once the array is gone")

    # Bad input.
    raises(lambda: c.acquire(len(manifest["layers"]), [0]), ["no pack layer"], "a layer past the pack")
    raises(lambda: c.acquire(0, [manifest["n_experts"]]), ["no expert"], "an expert past the model")
    with c.acquire(0, [3]) as lease:
        raises(lambda: lease.tensor(0, "gate_up"), ["no role 'gate_up'", "gate, up, down"], "a role the pack lacks")
        raises(lambda: lease.view(7), ["no expert 7"], "an index past the lease")
    raises(lambda: expertd.dequantize(np.zeros(64, np.uint8), "Q8_0", (33,)), ["multiple of 32"], "a row off the block")
    raises(lambda: expertd.dequantize(np.zeros(10, np.uint8), "Q8_0", (2, 32)), ["fewer"], "too few bytes")
    raises(lambda: expertd.dequantize(np.zeros(10, np.uint8), "NOPE", (32,)), ["unknown GGML type"], "an unknown type")
    raises(lambda: expertd.dequantize(np.zeros(128, np.uint8), "I32", (32,)), ["cannot dequantize I32"],
           "a type the kernels do not run (at that call, not at connect)")
    raises(lambda: expertd.Client.connect(os.path.join(tmp, "none.sock")), ["none.sock"], "no daemon at the path")

    # Two Python processes and expert-run on the one expertd at once.
    child = ("import expertd, sys\n"
             "c = expertd.Client.connect(sys.argv[1], 'child')\n"
             "n = 0\n"
             "for r in range(20):\n"
             "    for e0 in range(0, 32, 4):\n"
             "        with c.acquire(0, list(range(e0, e0 + 4))) as l:\n"
             "            n += int(sum(int(l.view(i)[0]) for i in range(4)) >= 0)\n"
             "print('acquired', n)\n")
    kids = [subprocess.Popen([sys.executable, "-c", child, sock], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    er = subprocess.run([os.path.join(B, "engine", "expert-run"), "generate", "--model",
                         os.path.join(tmp, "m.core.gguf"), "--socket", sock, "--prompt", "And God said",
                         "-n", "24", "--threads", "2"], capture_output=True, text=True)
    outs = [k.communicate(timeout=300)[0].strip() for k in kids]
    check(er.returncode == 0 and len(er.stdout.strip()) > 0, f"expert-run beside them: {er.stdout.strip()[:40]!r}")
    check(outs == ["acquired 160", "acquired 160"], f"two Python processes at once: {outs}")
    st = c.stats()
    check(st.get("clients_connected_total", 0) >= 4, f"the daemon served them all: {st.get('clients_connected_total')} clients")

    out = subprocess.run([sys.executable, "-m", "expertd", "stats", "--socket", sock, "--json"],
                         capture_output=True, text=True)
    j = json.loads(out.stdout) if out.returncode == 0 else {}
    check(j.get("cache_hits", 0) > 0 and j.get("cache_misses", 0) > 0, f"python -m expertd stats: hits {j.get('cache_hits')}, misses {j.get('cache_misses')}")
    bad = subprocess.run([sys.executable, "-m", "expertd", "stats", "--socket", "/nonexistent.sock"],
                         capture_output=True, text=True)
    check(bad.returncode == 1 and "nonexistent" in bad.stderr, "stats without a daemon: exit 1 naming it")
    # The daemon gone (killed): the next call is an Error naming it, closing still works.
    procs[0].kill()
    procs[0].wait()
    raises(lambda: c.acquire(0, [2]), ["expertd closed the connection"], "the daemon killed, then an acquire")
    raises(lambda: c.stats(), ["connection to expertd is broken"], "then stats")
    c.close()
finally:
    py_util.stop_all(procs, tmp)

finish()
