#!/usr/bin/python3
"""Trains a NextN / MTP (multi-token prediction) draft head for the bundled model, the trunk frozen.

    /usr/bin/python3 model/train_mtp.py --gguf model/kjv-moe-q8_0.gguf --out model/build --steps 280

The trunk is the committed GGUF's (Q8_0 weights dequantized: the head learns the hidden states
the deployed model has), its tokenizer the GGUF's own; the data and the held-out split are
train.py's. The head is GLM-4.5's NextN block as llama.cpp's glm4moe graph_mtp runs it: for row k
(position k), e = token_embd[x_k] and h = the trunk's final hidden state (after output_norm) at
row k-1 (zeros at k = 0);
    x = eh_proj(concat(enorm(e), hnorm(h)))
    x = x + attn(attn_norm(x))            (q/k norm, NeoX RoPE at position k, causal over rows)
    x = x + moe(post_attention_norm(x))   (softmax router, top-4 of 32, renormalised, SwiGLU)
    logits = output(shared_head_norm(x))  (the trunk's tied token_embd)
and its target is x_{k+1}: drafting from the pending token x_n with the trunk's h_{n-1} predicts
x_{n+1}. The loss mixes cross-entropy on the text with the KL divergence to the trunk's own
next-token distribution at row k (--distill), which is what a greedy draft must match to be
accepted. The block starts as a copy of the trunk's last layer, shared_head_norm as its
output_norm; eh_proj is random.

Writes mtp-checkpoint.pt and mtp-metrics.json to --out (export_mtp_gguf.py turns the checkpoint
and the trunk GGUF into a glm4moe GGUF). Deterministic for a given --seed, --steps and --threads.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import export_gguf  # noqa: E402
import export_mtp_gguf  # noqa: E402
import train  # noqa: E402


def load_trunk(path: str):
    """The GGUF's trunk as a train.MoeLM (float32, the stored weights) and its tokenizer."""
    r = export_gguf.Reader(path)
    a = r.kv["general.architecture"]
    assert a == "qwen3moe", a
    c = dict(train.CONFIG)
    assert (r.kv[f"{a}.block_count"], r.kv[f"{a}.embedding_length"], r.kv[f"{a}.expert_count"]) == \
        (c["n_layer"], c["n_embd"], c["n_expert"])
    t = lambda name: torch.from_numpy(r.array(name))
    st = {"tok": t("token_embd.weight"), "out_norm": t("output_norm.weight")}
    for i in range(c["n_layer"]):
        p, q = f"blk.{i}.", f"layers.{i}."
        for g, mine, _ in export_mtp_gguf.BLOCK_TENSORS + [("ffn_norm", "ffn_norm", "F32")]:
            st[q + mine] = t(p + g + ".weight")
    model = train.MoeLM(c)
    model.load_state_dict(st)
    model.eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    tok = bpe.Tokenizer(r.kv["tokenizer.ggml.tokens"], r.kv["tokenizer.ggml.merges"])
    return model, tok


class NextN(torch.nn.Module):
    """The NextN block (its parameter names: eh_proj, enorm, hnorm, head_norm, block.*)."""

    def __init__(self, c: dict, trunk: train.MoeLM):
        super().__init__()
        self.c = c
        E = c["n_embd"]
        self.eh_proj = torch.nn.Parameter(torch.randn(E, 2 * E) * (2 * E) ** -0.5)
        self.enorm = torch.nn.Parameter(torch.ones(E))
        self.hnorm = torch.nn.Parameter(torch.ones(E))
        self.block = train.new_layer(c, c["n_layer"])
        self.block.load_state_dict(trunk.layers[-1].state_dict())  # a copy of the trunk's last block
        self.head_norm = torch.nn.Parameter(trunk.out_norm.detach().clone())  # and of its output_norm
        for prm in self.parameters():
            prm.requires_grad_(True)

    def forward(self, emb, h):
        """emb: token_embd[x_k], h: the trunk's h_{k-1}, both (B, T, E) -> shared_head_norm'd x, aux."""
        eps = self.c["eps"]
        x = torch.cat([train.rms_norm(emb, self.enorm, eps), train.rms_norm(h, self.hnorm, eps)], -1) @ self.eh_proj.t()
        x, aux = train.block(self.c, self.block, x)
        return train.rms_norm(x, self.head_norm, eps), aux


def rows(trunk, xb):
    """xb: (B, T+1) tokens -> the MTP rows' inputs (emb, h_prev), the trunk's logits at rows 0..T-1
    (its prediction of x_{k+1}) and the targets x_{k+1}."""
    with torch.no_grad():
        T = xb.shape[1] - 1
        h, _ = trunk.hidden(xb[:, :T])
        trunk_logits = h @ trunk.tok.t()
        h_prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)
        emb = trunk.tok[xb[:, :T]]
    return emb, h_prev, trunk_logits, xb[:, 1:]


def evaluate(trunk, head, ids, window, max_windows=None):
    """Held-out, over evaluate.py's windows (non-overlapping, `window` tokens, each from position 0):
    the head's loss on x_{k+1}, its top-1 accuracy, and how often its argmax equals the trunk's
    (teacher-forced: the chance a greedy first draft is accepted), with the trunk's own figures."""
    head.eval()
    starts = list(range(0, len(ids) - window, window))[:max_windows]
    nll = hit = agree = trunk_hit = n = 0.0
    with torch.no_grad():
        for i in range(0, len(starts), 8):
            xb = torch.stack([ids[j:j + window + 1] for j in starts[i:i + 8]])
            emb, h_prev, tl, y = rows(trunk, xb)
            x, _ = head(emb, h_prev)
            logits = x @ trunk.tok.t()
            nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
            a = logits.argmax(-1)
            hit += (a == y).sum().item()
            agree += (a == tl.argmax(-1)).sum().item()
            trunk_hit += (tl.argmax(-1) == y).sum().item()
            n += y.numel()
    head.train()
    return {"mtp_loss": nll / n, "mtp_top1": hit / n, "mtp_agrees_with_trunk_argmax": agree / n,
            "trunk_top1": trunk_hit / n, "rows": int(n)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default="model/kjv-moe-q8_0.gguf")
    ap.add_argument("--out", default="model/build")
    ap.add_argument("--steps", type=int, default=280)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--distill", type=float, default=0.5, help="weight of KL(trunk || head); 1 - it on the text")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=70)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    trunk, tok = load_trunk(args.gguf)
    c = trunk.c
    train_text, held_text = train.load_text()
    train_ids = torch.tensor(tok.encode(train_text), dtype=torch.long)
    held_ids = torch.tensor(tok.encode(held_text), dtype=torch.long)
    print(f"trunk {args.gguf}; train {len(train_ids)} tokens, held-out {len(held_ids)} tokens", flush=True)
    head = NextN(c, trunk)
    n_params = sum(p.numel() for p in head.parameters())
    print(f"NextN head: {n_params / 1e6:.2f} M parameters", flush=True)
    before = evaluate(trunk, head, held_ids, args.seq, max_windows=80)
    print(f"before training (80 held-out windows): {json.dumps(before)}", flush=True)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    g = torch.Generator().manual_seed(args.seed)
    start, log, seen = time.time(), [], 0
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_ids) - args.seq - 1, (args.batch,), generator=g)
        xb = torch.stack([train_ids[s:s + args.seq + 1] for s in starts])
        emb, h_prev, tl, y = rows(trunk, xb)
        x, aux = head(emb, h_prev)
        logits = (x @ trunk.tok.t()).reshape(-1, c["n_vocab"])
        ce = F.cross_entropy(logits, y.reshape(-1))
        kl = F.kl_div(F.log_softmax(logits, -1), F.log_softmax(tl.reshape(-1, c["n_vocab"]), -1),
                      log_target=True, reduction="batchmean")
        loss = (1 - args.distill) * ce + args.distill * kl
        (loss + 0.01 * aux).backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen += y.numel()
        if (step + 1) % 25 == 0:
            el = time.time() - start
            print(f"step {step + 1} ce {ce.item():.3f} kl {kl.item():.3f} aux {float(aux):.3f} lr {lr:.2e} "
                  f"{seen / el:.0f} tok/s {el / 60:.1f} min", flush=True)
        if (step + 1) % args.eval_every == 0 and step + 1 < args.steps:
            ev = evaluate(trunk, head, held_ids, args.seq, max_windows=80)
            log.append({"step": step + 1, "train_ce": ce.item(), "train_kl": kl.item(), **ev})
            print(f"  held-out (80 windows): {json.dumps(ev)}", flush=True)
    minutes = (time.time() - start) / 60
    final = evaluate(trunk, head, held_ids, args.seq)
    gguf_sha = hashlib.sha256(open(args.gguf, "rb").read()).hexdigest()
    torch.save({"config": c, "state": head.state_dict(), "step": args.steps, "trunk_sha256": gguf_sha},
               os.path.join(args.out, "mtp-checkpoint.pt"))
    metrics = {"trunk": os.path.basename(args.gguf), "trunk_sha256": gguf_sha, "steps": args.steps,
               "tokens_seen": seen, "minutes": minutes, "params": n_params, "seq": args.seq, "batch": args.batch,
               "lr": args.lr, "distill": args.distill, "seed": args.seed, "threads": args.threads,
               "held_out": final, "held_out_before_training_80_windows": before, "log": log}
    with open(os.path.join(args.out, "mtp-metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"done: {args.steps} steps in {minutes:.1f} min; held-out {json.dumps(final)}", flush=True)


if __name__ == "__main__":
    main()
