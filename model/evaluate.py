#!/usr/bin/python3
"""Held-out evaluation of the bundled model on both sides, over the same windows:
PyTorch (the float32 checkpoint) and expert-run perplexity (the exported GGUF).

    /usr/bin/python3 model/evaluate.py --build model/build --gguf model/kjv-moe-q8_0.gguf

Also writes heldout.txt (every 20th chapter of the KJV) and kjv-words.txt (the training
text's vocabulary, used by the tests) into --build.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import train  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="model/build")
    ap.add_argument("--gguf", action="append", default=[])
    ap.add_argument("--expert-run", default="build/engine/expert-run")
    ap.add_argument("--window", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(2)
    train_text, held_text = train.load_text()
    held_path = os.path.join(args.build, "heldout.txt")
    with open(held_path, "w") as f:
        f.write(held_text)
    words = sorted(set(re.findall(r"[a-z]+", train_text.lower())))
    with open(os.path.join(args.build, "kjv-words.txt"), "w") as f:
        f.write("\n".join(words) + "\n")
    t = json.load(open(os.path.join(args.build, "tokenizer.json")))
    tok = bpe.Tokenizer(t["tokens"], t["merges"])
    ids = torch.tensor(tok.encode(held_text), dtype=torch.long)
    ck = torch.load(os.path.join(args.build, "checkpoint.pt"), map_location="cpu")
    model = train.MoeLM(ck["config"])
    model.load_state_dict(ck["state"])
    model.eval()
    W = args.window
    nll, n = 0.0, 0
    with torch.no_grad():
        starts = list(range(0, len(ids) - W, W))  # the windows expert-run perplexity uses
        for i in range(0, len(starts), 8):
            s = starts[i:i + 8]
            xb = torch.stack([ids[j:j + W] for j in s])
            yb = torch.stack([ids[j + 1:j + W + 1] for j in s])
            logits, _ = model(xb)
            nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1), reduction="sum").item()
            n += yb.numel()
    result = {"held_out_tokens": len(ids), "tokens_scored": n, "pytorch_f32": {"mean_nll": nll / n, "perplexity": math.exp(nll / n)}}
    for g in args.gguf:
        out = subprocess.run([args.expert_run, "perplexity", "--model", g, "--local", "--file", held_path,
                              "--window", str(W), "--json", "--threads", "2"], capture_output=True, text=True, check=True)
        result[os.path.basename(g)] = json.loads(out.stdout)
    print(json.dumps(result, indent=1))
    with open(os.path.join(args.build, "evaluation.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
