#!/usr/bin/env python3
"""Time per token of the PyTorch model served from the pack (expertd.torch: transformers'
Qwen3-MoE, experts from expertd) beside expert-run on the same pack and the same expertd.

Alternating rounds, medians: prefill of -p tokens (one forward), decode of -n tokens (greedy,
transformers' KV cache; per token = (generate(n + 1) - generate(1)) / n), and `expert-run bench`
with the same -p/-n and threads. Runs in the torch test's venv (build/python-torch-venv, made by
ctest -R python.TorchModel); prints the CPU and torch's thread count with every figure.

usage: <build>/python-torch-venv/bin/python bench/torch_model.py --bin build [--rounds 5]
       [-p 128] [-n 32] [--threads 2] [--cache-slots 128]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), ".."))
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("-p", type=int, default=128)
ap.add_argument("-n", type=int, default=32)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--cache-slots", type=int, default=128, help="expertd's slots (128: the whole model)")
args = ap.parse_args()
B, SRC = os.path.abspath(args.bin), os.path.abspath(args.source)

sys.path.insert(0, os.path.join(SRC, "tests", "python"))
from py_util import Packed, start_expertd, stop_all  # noqa: E402

import torch  # noqa: E402

import expertd  # noqa: E402
from expertd.torch import load_qwen3moe  # noqa: E402

torch.set_num_threads(args.threads)
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
flags = open("/proc/cpuinfo").read()
isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "?"
print(f"CPU: {cpu} ({isa}); torch {torch.__version__}, {args.threads} threads; "
      f"expert-run kernels: {os.environ.get('EXPERTD_KERNELS', 'best')}")

tmp = tempfile.mkdtemp(prefix="torch-bench-")
d = None
try:
    pk = Packed(B, SRC, tmp)
    core = pk.core
    sock = os.path.join(tmp, "s.sock")
    d = start_expertd(B, pk.manifest_path, sock, ["--cache-slots", str(args.cache_slots)])
    client = expertd.Client.connect(sock, "torch-bench")
    model = load_qwen3moe(core, client)
    text = open(os.path.join(SRC, "model", "kjv-words.txt")).read()[:20000]
    ids = [int(t) for t in subprocess.run([os.path.join(B, "engine", "expert-run"), "tokenize",
                                           "--text", text], capture_output=True, text=True,
                                          check=True).stdout.split()][:args.p]
    prompt = torch.tensor([ids])

    def torch_round():
        with torch.no_grad():
            t0 = time.perf_counter()
            model(prompt)
            t1 = time.perf_counter()
            model.generate(prompt, max_new_tokens=1, do_sample=False)
            t2 = time.perf_counter()
            model.generate(prompt, max_new_tokens=args.n + 1, min_new_tokens=args.n + 1,
                           do_sample=False)
            t3 = time.perf_counter()
        return args.p / (t1 - t0), args.n / ((t3 - t2) - (t2 - t1))

    def engine_round():
        r = subprocess.run([os.path.join(B, "engine", "expert-run"), "bench", "--model", core,
                            "--socket", sock, "-p", str(args.p), "-n", str(args.n), "--threads",
                            str(args.threads), "--json"], capture_output=True, text=True, check=True)
        j = json.loads(r.stdout.strip().splitlines()[-1])
        return j["prefill_tok_s"], j["decode_tok_s"]

    torch_round()  # warm: the cache, torch's first calls
    engine_round()
    tp, td, ep, ed = [], [], [], []
    for r in range(args.rounds):
        for fn, p, dd in ((torch_round, tp, td), (engine_round, ep, ed)) if r % 2 == 0 else \
                ((engine_round, ep, ed), (torch_round, tp, td)):
            a, b = fn()
            p.append(a)
            dd.append(b)
    m = statistics.median
    st = client.stats()
    print(f"prefill {args.p} tokens: torch+expertd {m(tp):.1f} tok/s, expert-run {m(ep):.1f} tok/s "
          f"(expert-run / torch {m(ep) / m(tp):.1f}x)")
    print(f"decode {args.n} tokens:  torch+expertd {m(td):.1f} tok/s ({1e3 / m(td):.2f} ms/token), "
          f"expert-run {m(ed):.1f} tok/s ({1e3 / m(ed):.2f} ms/token) (expert-run / torch "
          f"{m(ed) / m(td):.1f}x)")
    print(f"{args.rounds} alternating rounds, medians; expertd {args.cache_slots} slots, "
          f"hits {int(st['cache_hits'])}, misses {int(st['cache_misses'])}")
    client.close()
finally:
    stop_all([d], tmp)
