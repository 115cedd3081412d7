#!/usr/bin/env python3
"""expert-run vs llama.cpp (CPU, the same GGUF, the same thread count), measured in one run.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install llama-cpp-python   # builds llama.cpp
    /tmp/venv/bin/python bench/compare_llamacpp.py --model M.gguf --threads 2 -p 128 -n 64

Prints prefill and decode tokens/s of both and, last, ratio=<expert-run decode / llama.cpp decode>.
With --repeat N the two sides alternate N times (this is a shared, noisy machine) and the medians
of the per-round ratios are reported.
llama.cpp is used here only, as the baseline; it is never part of expertd.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time


class LlamaCpp:
    def __init__(self, model: str, threads: int, n_ctx: int, n_batch: int, repack: bool):
        import llama_cpp
        import llama_cpp.llama_cpp as C

        if not repack:  # llama.cpp's --no-repack: weights stay in the mmap
            default_params = C.llama_model_default_params

            def no_repack():
                p = default_params()
                p.use_extra_bufts = False
                return p

            C.llama_model_default_params = no_repack
        self.llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                                   n_batch=n_batch, n_gpu_layers=0, verbose=False, logits_all=False)

    def bench(self, prompt: list[int], stream: list[int]) -> dict:
        self.llm.reset()
        t0 = time.time()
        self.llm.eval(prompt)
        pp = time.time() - t0
        t1 = time.time()
        for t in stream:  # the same tokens expert-run decoded
            self.llm.eval([t])
        tg = time.time() - t1
        return {"prefill_tok_s": len(prompt) / pp, "decode_tok_s": len(stream) / tg if stream else 0.0}


def llama_bench_subprocess(args, prompt: list[int], stream: list[int]) -> dict:
    # A process of its own per round: an idle llama.cpp process left alive beside expert-run
    # measurably slows it (same file mapped by both; seen as 350 -> 260 tok/s prefill here).
    import sys
    cmd = [sys.executable, __file__, "--llama-worker", "--model", args.model, "--threads", str(args.threads),
           "--tokens", ",".join(map(str, prompt)), "--stream", ",".join(map(str, stream))]
    if args.no_repack:
        cmd.append("--no-repack")
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])


def ours_bench(args) -> dict:
    return json.loads(subprocess.run([args.expert_run, "bench", "--model", args.model, "--local", "-p", str(args.p), "-n",
                                      str(args.n), "--threads", str(args.threads), "--json"],
                                     capture_output=True, text=True, check=True).stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--expert-run", default="build/engine/expert-run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--no-repack", action="store_true", help="llama.cpp streams weights from the mmap (no repacking)")
    ap.add_argument("--repeat", type=int, default=1, help="alternate the two sides this many times; report medians")
    ap.add_argument("--llama-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", default="", help=argparse.SUPPRESS)
    ap.add_argument("--stream", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llama_worker:
        prompt = [int(t) for t in args.tokens.split(",")]
        stream = [int(t) for t in args.stream.split(",")] if args.stream else []
        eng = LlamaCpp(args.model, args.threads, len(prompt) + len(stream) + 8, max(len(prompt), 8), not args.no_repack)
        print(json.dumps(eng.bench(prompt, stream)))
        return
    import statistics
    pr, dr = [], []
    for r in range(args.repeat):
        ours = ours_bench(args)
        if r == 0:
            print(f"model {args.model}, {args.threads} threads, prompt {args.p}, generate {args.n}, {ours['kernels']} kernels")
        ref = llama_bench_subprocess(args, ours["prompt"], ours["decode_stream"])
        pr.append(ours["prefill_tok_s"] / ref["prefill_tok_s"])
        dr.append(ours["decode_tok_s"] / ref["decode_tok_s"] if args.n else 0.0)
        print(f"round {r + 1}: expert-run --local prefill {ours['prefill_tok_s']:.2f} decode {ours['decode_tok_s']:.2f} tok/s; "
              f"llama.cpp{' (no repack)' if args.no_repack else ''} prefill {ref['prefill_tok_s']:.2f} "
              f"decode {ref['decode_tok_s']:.2f} tok/s; ratios {pr[-1]:.3f} / {dr[-1]:.3f}", flush=True)
    print(f"prefill ratio {statistics.median(pr):.3f} (median of {len(pr)}: {min(pr):.3f}-{max(pr):.3f})")
    print(f"ratio={statistics.median(dr):.3f}")


if __name__ == "__main__":
    main()
