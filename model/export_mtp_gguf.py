#!/usr/bin/python3
"""Writes the bundled model with its trained NextN / MTP draft head as a glm4moe GGUF, the
architecture whose NextN block llama.cpp (graph_mtp) and expert-run run to draft.

    /usr/bin/python3 model/export_mtp_gguf.py --trunk model/kjv-moe-q8_0.gguf \\
        --checkpoint model/build/mtp-checkpoint.pt --out model/kjv-moe-mtp-q8_0.gguf

The trunk (blk.0-3, embeddings, output) is the qwen3moe file's, its tensors copied bit for bit;
the glm4moe graph computes the same function with: rope.dimension_count = head_dim (full NeoX
rotary), expert_gating_func 1 (softmax), expert_weights_norm true, expert_weights_scale 1,
leading_dense_block_count 0, post_attention_norm = qwen3moe's ffn_norm, and these zero tensors
glm4moe requires: q/k/v biases, exp_probs_b (the selection bias) and one shared expert (llama.cpp
adds build_ffn(x) with no weights, which is silu(x), where a model has none, so a zero expert is
what adds nothing). blk.4 is the NextN block (glm4moe.nextn_predict_layers 1): eh_proj, enorm,
hnorm, shared_head_norm and a decoder block shaped like the trunk's, from train_mtp.py's
checkpoint, quantized as export_gguf.py does (Q8_0 matrices; norms, routers and biases F32).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_gguf  # noqa: E402

# A decoder block's tensors common to qwen3moe and glm4moe: (GGUF name, train.new_layer's name, type).
# The FFN norm is qwen3moe's ffn_norm, glm4moe's post_attention_norm.
BLOCK_TENSORS = [("attn_norm", "attn_norm", "F32"), ("attn_q", "wq", "Q8_0"), ("attn_k", "wk", "Q8_0"),
                 ("attn_v", "wv", "Q8_0"), ("attn_q_norm", "q_norm", "F32"), ("attn_k_norm", "k_norm", "F32"),
                 ("attn_output", "wo", "Q8_0"), ("ffn_gate_inp", "router", "F32"),
                 ("ffn_gate_exps", "gate", "Q8_0"), ("ffn_up_exps", "up", "Q8_0"), ("ffn_down_exps", "down", "Q8_0")]


def export(trunk: str, checkpoint: str, out: str):
    r = export_gguf.Reader(trunk)
    src = r.kv["general.architecture"]
    assert src == "qwen3moe", src
    ck = torch.load(checkpoint, map_location="cpu")
    st = {k: v.detach().float().numpy() for k, v in ck["state"].items()}
    k = lambda name: r.kv[f"{src}.{name}"]
    n_layer, E, D, FF = k("block_count"), k("embedding_length"), k("attention.key_length"), k("expert_feed_forward_length")
    H, HKV, X = k("attention.head_count"), k("attention.head_count_kv"), k("expert_count")
    a = "glm4moe"
    w = export_gguf.Writer()
    w.string("general.architecture", a)
    w.string("general.name", "expertd KJV MoE 14M + NextN")
    w.u32("general.file_type", 7)
    w.u32("general.alignment", 32)
    w.u32(f"{a}.context_length", k("context_length"))
    w.u32(f"{a}.embedding_length", E)
    w.u32(f"{a}.block_count", n_layer + 1)
    w.u32(f"{a}.nextn_predict_layers", 1)
    w.u32(f"{a}.feed_forward_length", k("feed_forward_length"))
    w.u32(f"{a}.expert_feed_forward_length", FF)
    w.u32(f"{a}.attention.head_count", H)
    w.u32(f"{a}.attention.head_count_kv", HKV)
    w.u32(f"{a}.attention.key_length", D)
    w.u32(f"{a}.attention.value_length", k("attention.value_length"))
    w.u32(f"{a}.rope.dimension_count", D)
    w.f32(f"{a}.rope.freq_base", k("rope.freq_base"))
    w.f32(f"{a}.attention.layer_norm_rms_epsilon", k("attention.layer_norm_rms_epsilon"))
    w.u32(f"{a}.expert_count", X)
    w.u32(f"{a}.expert_used_count", k("expert_used_count"))
    w.u32(f"{a}.expert_shared_count", 1)
    w.u32(f"{a}.leading_dense_block_count", 0)
    w.u32(f"{a}.expert_gating_func", 1)
    w.bool(f"{a}.expert_weights_norm", True)
    w.f32(f"{a}.expert_weights_scale", 1.0)
    for key, entry in r.raw_kv.items():
        if key.startswith("tokenizer."):
            w.raw_kv(entry)
    copy = lambda dst, name: w.raw_tensor(dst, *r.tensors[name])
    zero = lambda name, kind, *shape: w.tensor(name, kind, np.zeros(shape, dtype=np.float32))
    copy("token_embd.weight", "token_embd.weight")
    copy("output_norm.weight", "output_norm.weight")
    # output.weight is token_embd's bytes (tied): left out, llama.cpp and the engine use
    # token_embd in its place (and the file stays under 20 MB)

    def glm_only(p):  # what glm4moe adds to a qwen3moe block, all zero
        zero(p + "attn_q.bias", "F32", H * D)
        zero(p + "attn_k.bias", "F32", HKV * D)
        zero(p + "attn_v.bias", "F32", HKV * D)
        zero(p + "exp_probs_b.bias", "F32", X)
        zero(p + "ffn_gate_shexp.weight", "Q8_0", FF, E)
        zero(p + "ffn_up_shexp.weight", "Q8_0", FF, E)
        zero(p + "ffn_down_shexp.weight", "Q8_0", E, FF)

    for i in range(n_layer):
        p = f"blk.{i}."
        for g, _, _ in BLOCK_TENSORS:
            copy(p + g + ".weight", p + g + ".weight")
        copy(p + "post_attention_norm.weight", p + "ffn_norm.weight")
        glm_only(p)
    p = f"blk.{n_layer}."
    for g, mine, kind in BLOCK_TENSORS:
        w.tensor(p + g + ".weight", kind, st["block." + mine])
    w.tensor(p + "post_attention_norm.weight", "F32", st["block.ffn_norm"])
    glm_only(p)
    w.tensor(p + "nextn.eh_proj.weight", "Q8_0", st["eh_proj"])
    w.tensor(p + "nextn.enorm.weight", "F32", st["enorm"])
    w.tensor(p + "nextn.hnorm.weight", "F32", st["hnorm"])
    w.tensor(p + "nextn.shared_head_norm.weight", "F32", st["head_norm"])
    w.write(out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes, {len(w.tensors)} tensors: the trunk of {trunk} "
          f"and a NextN block at blk.{n_layer})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trunk", default="model/kjv-moe-q8_0.gguf")
    ap.add_argument("--checkpoint", default="model/build/mtp-checkpoint.pt")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    export(args.trunk, args.checkpoint, args.out)


if __name__ == "__main__":
    main()
