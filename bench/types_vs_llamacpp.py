#!/usr/bin/env python3
"""Every weight type end to end against llama.cpp: for each type, `expert-pack synth --type T`
writes a small qwen3moe GGUF, `expert-run logits --local` and llama.cpp (llama-cpp-python, F32 KV
cache, no flash attention, no repacking, 1 thread) evaluate the same tokens (a batch, then one at
a time), and the largest logit difference per row is reported. llama.cpp is the oracle here only.

    python3 bench/types_vs_llamacpp.py [--build build] [--types Q2_K,IQ2_XXS,...]

Prints one line per type and, last, the worst type's median row-max difference.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import tempfile

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--types", default="F32,F16,BF16,Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,MXFP4,NVFP4,Q1_0,Q2_0,"
                    "IQ4_NL,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,TQ1_0,TQ2_0,IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,"
                    "IQ1_S,IQ1_M,IQ4_XS")
    ap.add_argument("--dims", default="256,2,8,2,256,4,2,512")
    args = ap.parse_args()
    import llama_cpp
    import llama_cpp.llama_cpp as C
    default_params = C.llama_model_default_params

    def no_repack():  # weights stay as the file has them
        p = default_params()
        p.use_extra_bufts = False
        return p

    C.llama_model_default_params = no_repack
    toks = [5, 17, 300, 42, 7, 99, 123, 256, 11, 3]
    n_batch = 4
    worst = 0.0
    with tempfile.TemporaryDirectory() as d:
        for t in args.types.split(","):
            m = os.path.join(d, t + ".gguf")
            subprocess.run([os.path.join(args.build, "pack/expert-pack"), "synth", "--dims", args.dims,
                            "--type", t, "--out", m], check=True, capture_output=True)
            out = os.path.join(d, "logits.bin")
            subprocess.run([os.path.join(args.build, "engine/expert-run"), "logits", "--model", m, "--local",
                            "--threads", "1", "--tokens", ",".join(map(str, toks)), "--out", out,
                            "--decode-from", str(n_batch)], check=True, capture_output=True)
            ours = np.fromfile(out, dtype=np.float32).reshape(len(toks), -1)
            llm = llama_cpp.Llama(model_path=m, n_threads=1, n_ctx=64, n_batch=64, logits_all=True,
                                  verbose=False, type_k=0, type_v=0, flash_attn=False)
            llm.eval(toks[:n_batch])
            for tk in toks[n_batch:]:
                llm.eval([tk])
            ref = np.array(llm.scores[:len(toks)], dtype=np.float32)
            del llm
            rows = np.abs(ours - ref).max(axis=1)
            med = float(np.median(rows))
            worst = max(worst, med)
            print(f"{t:8s} median row-max |d| {med:.2e}  max {rows.max():.2e}  (logit std {ref.std():.2f})",
                  flush=True)
    print(f"worst_median={worst:.3e}")


if __name__ == "__main__":
    main()
