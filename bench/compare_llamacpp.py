#!/usr/bin/env python3
"""expert-run vs llama.cpp (CPU, the same GGUF, the same thread count), measured in one run.

    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install llama-cpp-python   # builds llama.cpp
    /tmp/venv/bin/python bench/compare_llamacpp.py --model M.gguf --threads 2 -p 128 -n 64

Prints prefill and decode tokens/s of both and, last, ratio=<expert-run decode / llama.cpp decode>.
llama.cpp is used here only, as the baseline; it is never part of expertd.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import time


def llama_cpp_bench(model: str, threads: int, prompt: list[int], stream: list[int], repack: bool) -> dict:
    import llama_cpp
    import llama_cpp.llama_cpp as C

    n_prompt = len(prompt)
    if not repack:  # llama.cpp's --no-repack: weights stay in the mmap
        default_params = C.llama_model_default_params

        def no_repack():
            p = default_params()
            p.use_extra_bufts = False
            return p

        C.llama_model_default_params = no_repack

    n_gen = len(stream)
    kw = dict(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=n_prompt + n_gen + 8,
              n_batch=max(n_prompt, 8), n_gpu_layers=0, verbose=False, logits_all=False)
    llm = llama_cpp.Llama(**kw)
    t0 = time.time()
    llm.eval(prompt)
    pp = time.time() - t0
    t1 = time.time()
    for t in stream:  # the same tokens expert-run decoded
        llm.eval([t])
    tg = time.time() - t1
    return {"prefill_tok_s": n_prompt / pp, "decode_tok_s": n_gen / tg}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--expert-run", default="build/engine/expert-run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--no-repack", action="store_true", help="llama.cpp streams weights from the mmap (no repacking)")
    args = ap.parse_args()
    ours = json.loads(subprocess.run([args.expert_run, "bench", "--model", args.model, "--local", "-p", str(args.p), "-n",
                                      str(args.n), "--threads", str(args.threads), "--json"],
                                     capture_output=True, text=True, check=True).stdout)
    ref = llama_cpp_bench(args.model, args.threads, ours["prompt"], ours["decode_stream"], not args.no_repack)
    print(f"model {args.model}, {args.threads} threads, prompt {args.p}, generate {args.n}")
    print(f"expert-run --local: prefill {ours['prefill_tok_s']:.2f} tok/s, decode {ours['decode_tok_s']:.2f} tok/s")
    print(f"llama.cpp{' (no repack)' if args.no_repack else ''}: prefill {ref['prefill_tok_s']:.2f} tok/s, "
          f"decode {ref['decode_tok_s']:.2f} tok/s")
    print(f"prefill ratio {ours['prefill_tok_s'] / ref['prefill_tok_s']:.3f}")
    print(f"ratio={ours['decode_tok_s'] / ref['decode_tok_s']:.3f}")


if __name__ == "__main__":
    main()
