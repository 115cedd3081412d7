#!/usr/bin/python3
"""The NextN head in PyTorch (train_mtp.NextN with the weights the MTP GGUF stores) against
llama.cpp's MTP context on the same file: check_mtp_export.py --dump writes llama.cpp's rows.

    /tmp/llvenv/bin/python model/check_mtp_export.py --dump model/build/mtp-oracle.npz
    /usr/bin/python3 model/check_mtp_head.py --mtp model/kjv-moe-mtp-q8_0.gguf --oracle model/build/mtp-oracle.npz

What remains is llama.cpp's arithmetic (Q8_0 activations, as for the trunk, whose figures are
printed beside).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_gguf  # noqa: E402
import export_mtp_gguf  # noqa: E402
import train_mtp  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mtp", default="model/kjv-moe-mtp-q8_0.gguf")
    ap.add_argument("--trunk", default="model/kjv-moe-q8_0.gguf")
    ap.add_argument("--oracle", default="model/build/mtp-oracle.npz")
    args = ap.parse_args()
    torch.set_num_threads(1)
    trunk, _ = train_mtp.load_trunk(args.trunk)
    r = export_gguf.Reader(args.mtp)
    il = r.kv["glm4moe.block_count"] - 1
    a = lambda n: torch.from_numpy(r.array(f"blk.{il}.{n}.weight"))
    head = train_mtp.NextN(trunk.c, trunk)
    st = {"eh_proj": a("nextn.eh_proj"), "enorm": a("nextn.enorm"), "hnorm": a("nextn.hnorm"),
          "head_norm": a("nextn.shared_head_norm"), "block.ffn_norm": a("post_attention_norm")}
    for g, mine, _ in export_mtp_gguf.BLOCK_TENSORS:
        st["block." + mine] = a(g)
    head.load_state_dict(st)
    head.eval()
    d = np.load(args.oracle)
    worst = {"trunk": 0.0, "catch-up": 0.0, "first draft": 0.0}
    same = {"catch-up": [0, 0], "first draft": [0, 0]}
    i = 0
    while f"p{i}_tokens" in d:
        toks = torch.tensor(d[f"p{i}_tokens"])[None]
        pending = int(d[f"p{i}_pending"])
        with torch.no_grad():
            h, _ = trunk.hidden(toks)
            # the catch-up rows and, one row further, the first draft (pending at N with h_{N-1})
            seq = torch.cat([toks, torch.tensor([[pending]])], 1)
            x, _ = head(trunk.tok[seq], torch.cat([torch.zeros_like(h[:, :1]), h], 1))
            mine = (x @ trunk.tok.t())[0].numpy()
            tl = (h @ trunk.tok.t())[0].numpy()
        n = toks.shape[1]
        for k, m, ref in (("trunk", tl, d[f"p{i}_trunk_logits"]), ("catch-up", mine[:n], d[f"p{i}_catchup_logits"]),
                          ("first draft", mine[n:], d[f"p{i}_draft_logits"])):
            worst[k] = max(worst[k], float(np.abs(m - ref).max()))
            if k in same:
                same[k][0] += int((m.argmax(-1) == ref.argmax(-1)).sum())
                same[k][1] += len(m)
        i += 1
    print(f"PyTorch (the GGUF's weights, float32) vs llama.cpp over {i} prompts, max|dlogit|: "
          + ", ".join(f"{k} {v:.3f}" for k, v in worst.items())
          + "; argmax equal: " + ", ".join(f"{k} {a}/{b}" for k, (a, b) in same.items()))


if __name__ == "__main__":
    main()
