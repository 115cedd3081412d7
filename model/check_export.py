#!/usr/bin/python3
"""Checks an exported GGUF independently: the project's engine (expert-run --local) must give the
same greedy tokens as the PyTorch model for a few prompts, and logits within a stated tolerance.

The PyTorch side runs with the weights the GGUF stores (F16- or Q8_0-rounded), so what remains
is the engine's arithmetic (activation quantization as llama.cpp does it, float32 sums).

    /usr/bin/python3 model/check_export.py --build model/build --gguf model/kjv-moe-q8_0.gguf --type Q8_0 \\
        --expert-run build/engine/expert-run
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import export_gguf  # noqa: E402
import train  # noqa: E402

PROMPTS = ["In the beginning God created", "And the LORD said unto Moses,", "Blessed are the",
           "For God so loved the world", "The LORD is my shepherd;"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="model/build")
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--type", choices=["F16", "Q8_0"], required=True)
    ap.add_argument("--expert-run", default="build/engine/expert-run")
    ap.add_argument("-n", type=int, default=24)
    ap.add_argument("--tolerance", type=float, default=None, help="max |logit difference| allowed")
    args = ap.parse_args()
    # Row-wise limits, as ../shared/golden/README.md recommends: F16 activations move logits by
    # ~1e-3 and Q8_0 activation blocks by ~0.05-0.15; a row where two experts' router scores
    # nearly tie may select another expert and differ by more, so a few rows may exceed `tol`.
    tol = args.tolerance if args.tolerance is not None else (0.02 if args.type == "F16" else 0.25)
    rows_over_max = 0.1 if args.type == "F16" else 0.2
    rowmaxes = []
    torch.set_num_threads(2)
    ck = torch.load(os.path.join(args.build, "checkpoint.pt"), map_location="cpu")
    model = train.MoeLM(ck["config"])
    state = {}
    for k, v in ck["state"].items():  # the weights as the GGUF stores them
        matrix = v.dim() >= 2 and not k.endswith("router")
        state[k] = torch.from_numpy(export_gguf.dequantize(args.type if matrix else "F32", v.float().numpy()).copy())
    model.load_state_dict(state)
    model.eval()
    t = json.load(open(os.path.join(args.build, "tokenizer.json")))
    tok = bpe.Tokenizer(t["tokens"], t["merges"])
    worst, agree, argmax_ok = 0.0, 0, True
    for p in PROMPTS:
        ids = tok.encode(p)
        n_prompt = len(ids)
        margins = []
        with torch.no_grad():
            for _ in range(args.n):
                logits, _ = model(torch.tensor([ids]))
                top2 = logits[0, -1].topk(2).values
                margins.append(float(top2[0] - top2[1]))
                ids.append(int(logits[0, -1].argmax()))
        ref_text = tok.decode(ids[len(tok.encode(p)):])
        run = subprocess.run([args.expert_run, "generate", "--model", args.gguf, "--local", "--prompt", p, "-n", str(args.n),
                              "--temp", "0", "--threads", "2"], capture_output=True, text=True, check=True)
        same = run.stdout.rstrip("\n") == ref_text
        agree += same
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            subprocess.run([args.expert_run, "logits", "--model", args.gguf, "--local", "--tokens", ",".join(map(str, ids)),
                            "--out", f.name, "--threads", "2"], capture_output=True, check=True)
            mine = np.fromfile(f.name, dtype="<f4").reshape(len(ids), -1)
        with torch.no_grad():
            ref, _ = model(torch.tensor([ids]))
        rm = np.abs(mine - ref[0].numpy()).max(axis=1)
        rowmaxes += rm.tolist()
        d = float(rm.max())
        worst = max(worst, d)
        # Teacher-forced: the engine's argmax equals PyTorch's greedy token at every step, up to
        # the first step whose PyTorch top1-top2 margin is below 0.3.
        for i in range(args.n):
            if margins[i] < 0.3:
                break
            if int(mine[n_prompt - 1 + i].argmax()) != ids[n_prompt + i]:
                argmax_ok = False
        print(f"{'same' if same else 'diff'}  max|dlogit| {d:.2e}  {p!r} -> {ref_text!r}")
    median = float(np.median(rowmaxes))
    over = float(np.mean(np.array(rowmaxes) > tol))
    print(f"free-running greedy text identical for {agree}/{len(PROMPTS)} prompts; teacher-forced argmax "
          f"{'agrees' if argmax_ok else 'DISAGREES'}; per-row max|dlogit|: median {median:.2e}, worst {worst:.2e}, "
          f"{100 * over:.1f}% of rows above {tol} (limit {100 * rows_over_max:.0f}%)")
    ok = argmax_ok and median <= tol and over <= rows_over_max and (args.type != "F16" or agree == len(PROMPTS))
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
