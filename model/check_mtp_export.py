#!/usr/bin/env python3
"""Checks kjv-moe-mtp-q8_0.gguf with llama.cpp itself (llama-cpp-python 0.3.36, whose libllama
runs glm4moe's NextN block): the glm4moe file loads with load_mtp off and on, its trunk's logits
equal the qwen3moe original's on every row of a few prompts, and llama.cpp's MTP context (the
catch-up over a prompt and the first draft step, as common/speculative.cpp drives it) gives the
logits (--dump keeps them, to compare with PyTorch's head and the engine's drafts).

    /tmp/llvenv/bin/python model/check_mtp_export.py --orig model/kjv-moe-q8_0.gguf \\
        --mtp model/kjv-moe-mtp-q8_0.gguf [--dump model/build/mtp-oracle.npz]
"""
import argparse
import os
import sys

import numpy as np
import llama_cpp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from synth_cases import new_context, process  # noqa: E402

PROMPTS = ["In the beginning God created", "And the LORD said unto Moses,", "Blessed are the",
           "For God so loved the world", "The LORD is my shepherd; I shall not want."]

def load(path, mtp):
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers, mp.use_extra_bufts = 0, False
    mp.load_mtp = mtp
    m = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    if not m:
        sys.exit(f"llama.cpp cannot load {path} (load_mtp {mtp})")
    return m


def tokenize(m, text):
    vocab = llama_cpp.llama_model_get_vocab(m)
    buf = (llama_cpp.llama_token * 512)()
    n = llama_cpp.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, False, False)
    return list(buf[:n])


def trunk_logits(m, toks):
    V = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))
    ctx = new_context(m, llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT)
    b = llama_cpp.llama_batch_init(len(toks), 0, 1)
    b.n_tokens = len(toks)
    for i, t in enumerate(toks):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, i, 1, 1
        b.seq_id[i][0] = 0
    assert llama_cpp.llama_decode(ctx, b) == 0
    out = np.array([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(V,)).copy()
                    for i in range(len(toks))])
    llama_cpp.llama_batch_free(b)
    llama_cpp.llama_free(ctx)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orig", default="model/kjv-moe-q8_0.gguf")
    ap.add_argument("--mtp", default="model/kjv-moe-mtp-q8_0.gguf")
    ap.add_argument("--dump", help="write the MTP oracle (prompts, trunk h, catch-up and draft logits) here, .npz")
    args = ap.parse_args()
    orig = load(args.orig, False)
    plain, with_mtp = load(args.mtp, False), load(args.mtp, True)
    assert llama_cpp.llama_model_n_layer_nextn(with_mtp) == 1
    V = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(orig))
    E = llama_cpp.llama_model_n_embd(orig)
    worst = {"load_mtp false": 0.0, "load_mtp true": 0.0}
    dump = {}
    agree = total = 0
    for pi, p in enumerate(PROMPTS):
        toks = tokenize(orig, p)
        assert toks == tokenize(with_mtp, p)
        ref = trunk_logits(orig, toks)
        for name, m in (("load_mtp false", plain), ("load_mtp true", with_mtp)):
            worst[name] = max(worst[name], float(np.abs(trunk_logits(m, toks) - ref).max()))
        # llama.cpp's MTP: the trunk's h (after output_norm) for every row, the catch-up over the
        # prompt (row k: x_k with h_{k-1}, zeros for k = 0), then the first draft: the trunk's
        # greedy token at N with h_{N-1}
        tgt = new_context(with_mtp, llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT)
        tl, th = process(tgt, toks, 0, None, V, E)
        dft = new_context(with_mtp, llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
        states = np.vstack([np.zeros((1, E), np.float32), th[:-1]])
        ml, _ = process(dft, toks, 0, states, V, E)
        pending = int(tl[-1].argmax())
        dl, _ = process(dft, [pending], len(toks), th[-1:], V, E)
        agree += int((ml.argmax(-1) == tl.argmax(-1)).sum())
        total += len(toks)
        dump.update({f"p{pi}_tokens": np.array(toks), f"p{pi}_trunk_logits": tl, f"p{pi}_trunk_h": th,
                     f"p{pi}_catchup_logits": ml, f"p{pi}_pending": np.array(pending), f"p{pi}_draft_logits": dl})
        tok = lambda t: llama_cpp.llama_vocab_get_text(llama_cpp.llama_model_get_vocab(orig), t).decode()
        print(f"{p!r}: trunk greedy {tok(pending)!r}, MTP first draft {tok(int(dl[0].argmax()))!r}")
        for c in (tgt, dft):
            llama_cpp.llama_free(c)
    print(f"trunk logits, glm4moe file vs qwen3moe original, max|diff| over {len(PROMPTS)} prompts (all rows): "
          + ", ".join(f"{k} {v:.2e}" for k, v in worst.items()))
    print(f"llama.cpp MTP catch-up rows whose argmax equals the trunk's next greedy token: {agree}/{total}")
    if args.dump:
        np.savez(args.dump, **dump)
        print(f"wrote {args.dump}")
    ok = max(worst.values()) <= 1e-5
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
