#!/usr/bin/python3
"""Trains the bundled MoE language model (qwen3moe architecture) on the King James Bible.

    /usr/bin/python3 model/train.py --out model/build --minutes 60

Needs Debian's python3-torch, python3-numpy, bible-kjv and libopenblas0-pthread. Writes
tokenizer.json, checkpoint.pt and metrics.json to --out; export_gguf.py turns them into GGUF.
The math is exactly what llama.cpp (and expert-run) compute for qwen3moe: RMSNorm, GQA with
per-head q/k RMSNorm and NeoX RoPE, softmax router -> top-k -> renormalised weights, SwiGLU
experts; token embeddings tied to the output.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

CONFIG = dict(n_vocab=4096, n_embd=256, n_layer=4, n_head=4, n_head_kv=2, head_dim=64, n_expert=32,
              n_expert_used=4, n_ff_exp=128, rope_base=10000.0, eps=1e-6, n_ctx=256)


def load_text() -> tuple[str, str]:
    """KJV verses without references, one per line; every 20th chapter is held out."""
    raw = subprocess.run(["bible", "-f", "Genesis 1:1-Revelation 22:21"], capture_output=True, text=True, check=True).stdout
    train, held = [], []
    chapter, last = 0, None
    for line in raw.splitlines():
        if not line.strip():
            continue
        ref, _, verse = line.partition(" ")
        book_ch = ref.split(":")[0]
        if book_ch != last:
            chapter, last = chapter + 1, book_ch
        (held if chapter % 20 == 0 else train).append(verse.strip())
    return "\n".join(train) + "\n", "\n".join(held) + "\n"


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, base):
    """NeoX pairs (i, i + d/2). x: (B, H, T, D)."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d // 2, dtype=torch.float32) * 2.0 / d)
    ang = pos[:, None].float() * inv[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * c - b * s, a * s + b * c], dim=-1)


def new_layer(c: dict, n_layer: int) -> torch.nn.Module:
    """One decoder block's parameters (attention, router, experts), randomly initialised."""
    E, H, HKV, D, X, FF = c["n_embd"], c["n_head"], c["n_head_kv"], c["head_dim"], c["n_expert"], c["n_ff_exp"]
    p = lambda *shape, s: torch.nn.Parameter(torch.randn(*shape) * s)
    m = torch.nn.Module()
    m.attn_norm = torch.nn.Parameter(torch.ones(E))
    m.wq, m.wk, m.wv = p(H * D, E, s=E ** -0.5), p(HKV * D, E, s=E ** -0.5), p(HKV * D, E, s=E ** -0.5)
    m.q_norm, m.k_norm = torch.nn.Parameter(torch.ones(D)), torch.nn.Parameter(torch.ones(D))
    m.wo = p(E, H * D, s=(H * D) ** -0.5 / math.sqrt(2 * n_layer))
    m.ffn_norm = torch.nn.Parameter(torch.ones(E))
    m.router = p(X, E, s=E ** -0.5)
    m.gate, m.up = p(X, FF, E, s=E ** -0.5), p(X, FF, E, s=E ** -0.5)
    m.down = p(X, E, FF, s=FF ** -0.5 / math.sqrt(2 * n_layer))
    return m


def moe(c, m, h):
    """h: (N, E) -> (N, E), aux balance loss. Tokens are grouped per expert into one padded
    batch, so each projection is a single batched matmul over all experts."""
    X, K = c["n_expert"], c["n_expert_used"]
    N, E = h.shape
    probs = F.softmax(h @ m.router.t(), dim=-1)
    w, idx = probs.topk(K, dim=-1)
    w = w / w.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
    flat_e = idx.reshape(-1)
    flat_t = torch.arange(N).repeat_interleave(K)
    flat_w = w.reshape(-1)
    order = torch.argsort(flat_e, stable=True)
    counts = torch.bincount(flat_e, minlength=X)
    cap = int(counts.max())
    se = flat_e[order]
    slot = torch.arange(order.numel()) - (torch.cumsum(counts, 0) - counts)[se]
    xin = h.new_zeros(X, cap, E)
    xin[se, slot] = h[flat_t[order]]
    y = torch.bmm(F.silu(torch.bmm(xin, m.gate.transpose(1, 2))) * torch.bmm(xin, m.up.transpose(1, 2)),
                  m.down.transpose(1, 2))
    out = torch.zeros_like(h)
    out.index_add_(0, flat_t[order], y[se, slot] * flat_w[order, None])
    frac = counts.float() / flat_e.numel()
    aux = X * (frac * probs.mean(0)).sum()
    return out, aux


def block(c, m, x):
    """One decoder block over x: (B, T, E) at positions 0..T-1, causal. Returns (x, aux)."""
    B, T, _ = x.shape
    H, HKV, D, eps = c["n_head"], c["n_head_kv"], c["head_dim"], c["eps"]
    pos = torch.arange(T)
    h = rms_norm(x, m.attn_norm, eps)
    q = (h @ m.wq.t()).view(B, T, H, D)
    k = (h @ m.wk.t()).view(B, T, HKV, D)
    v = (h @ m.wv.t()).view(B, T, HKV, D)
    q, k = rms_norm(q, m.q_norm, eps), rms_norm(k, m.k_norm, eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    q, k = rope(q, pos, c["rope_base"]), rope(k, pos, c["rope_base"])
    k = k.repeat_interleave(H // HKV, dim=1)
    v = v.repeat_interleave(H // HKV, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
    x = x + att.transpose(1, 2).reshape(B, T, H * D) @ m.wo.t()
    h = rms_norm(x, m.ffn_norm, eps)
    y, aux = moe(c, m, h.reshape(B * T, -1))
    return x + y.view(B, T, -1), aux


class MoeLM(torch.nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.c = c
        E, L = c["n_embd"], c["n_layer"]
        self.tok = torch.nn.Parameter(torch.randn(c["n_vocab"], E) * 0.02)
        self.layers = torch.nn.ModuleList([new_layer(c, L) for _ in range(L)])
        self.out_norm = torch.nn.Parameter(torch.ones(E))

    def moe(self, m, h):
        return moe(self.c, m, h)

    def hidden(self, tokens):
        """The final hidden state after output_norm, (B, T, E), and the mean balance loss."""
        x = self.tok[tokens]
        aux_total = 0.0
        for m in self.layers:
            x, aux = block(self.c, m, x)
            aux_total = aux_total + aux
        return rms_norm(x, self.out_norm, self.c["eps"]), aux_total / len(self.layers)

    def forward(self, tokens):
        x, aux = self.hidden(tokens)
        return x @ self.tok.t(), aux


def evaluate(model, data, seq, batches=20):
    model.eval()
    losses = []
    with torch.no_grad():
        n = (len(data) - 1) // seq
        for i in range(min(batches, n // 8)):
            starts = torch.arange(i * 8, i * 8 + 8) * seq
            xb = torch.stack([data[s:s + seq] for s in starts])
            yb = torch.stack([data[s + 1:s + seq + 1] for s in starts])
            logits, _ = model(xb)
            losses.append(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1)).item())
    model.train()
    return sum(losses) / max(1, len(losses))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="model/build")
    ap.add_argument("--minutes", type=float, default=60)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    train_text, held_text = load_text()
    t0 = time.time()
    tokens, merges = bpe.train(train_text, CONFIG["n_vocab"])
    tok = bpe.Tokenizer(tokens, merges)
    with open(os.path.join(args.out, "tokenizer.json"), "w") as f:
        json.dump({"tokens": tokens, "merges": merges, "pre": "gpt-2"}, f)
    train_ids = torch.tensor(tok.encode(train_text), dtype=torch.long)
    held_ids = torch.tensor(tok.encode(held_text), dtype=torch.long)
    print(f"tokenizer: {len(tokens)} tokens in {time.time() - t0:.0f} s; train {len(train_ids)} tokens, "
          f"held-out {len(held_ids)} tokens", flush=True)
    model = MoeLM(CONFIG)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.05)
    deadline = time.time() + args.minutes * 60
    step, seen, log = 0, 0, []
    start = time.time()
    g = torch.Generator().manual_seed(args.seed)
    while time.time() < deadline:
        frac = min(1.0, (time.time() - start) / (deadline - start))
        lr = args.lr * min(1.0, (step + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_ids) - args.seq - 1, (args.batch,), generator=g)
        xb = torch.stack([train_ids[s:s + args.seq] for s in starts])
        yb = torch.stack([train_ids[s + 1:s + args.seq + 1] for s in starts])
        logits, aux = model(xb)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1))
        (loss + 0.01 * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        seen += xb.numel()
        if step % 100 == 0:
            el = time.time() - start
            print(f"step {step} loss {loss.item():.3f} aux {float(aux):.3f} lr {lr:.2e} {seen / el:.0f} tok/s", flush=True)
        if step % 1000 == 0:
            held = evaluate(model, held_ids, args.seq)
            log.append({"step": step, "tokens": seen, "train_loss": loss.item(), "held_loss": held})
            print(f"  held-out loss {held:.3f} (ppl {math.exp(held):.1f})", flush=True)
            torch.save({"config": CONFIG, "state": model.state_dict(), "step": step}, os.path.join(args.out, "checkpoint.pt"))
    held = evaluate(model, held_ids, args.seq, batches=10 ** 9)
    torch.save({"config": CONFIG, "state": model.state_dict(), "step": step}, os.path.join(args.out, "checkpoint.pt"))
    metrics = {"steps": step, "tokens_seen": seen, "minutes": (time.time() - start) / 60, "params": n_params,
               "held_out_loss": held, "held_out_ppl": math.exp(held), "train_tokens": len(train_ids),
               "held_out_tokens": len(held_ids), "seq": args.seq, "batch": args.batch, "lr": args.lr, "log": log}
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"done: {step} steps, held-out loss {held:.3f}, perplexity {math.exp(held):.2f}", flush=True)


if __name__ == "__main__":
    main()
