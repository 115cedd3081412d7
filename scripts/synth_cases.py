"""llama.cpp's teacher-forced logits on expert-pack synth models, written as test cases.

The shared part of scripts/gen-*-cases.py: each case is a synth recipe and llama.cpp's logits on
its model, in the golden data's format (../shared/golden/README.md): the prompt in one batch, then
llama.cpp's greedy tokens one at a time. The tests regenerate the model from the recipe in
case.json (synth is deterministic) and compare, so CI needs no llama.cpp.
Needs llama-cpp-python 0.3.36.
"""
import json, os, subprocess, sys, tempfile, zlib

import numpy as np
import llama_cpp


def teacher_forced(model, prompt, n_gen, flash_attn=False):
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers, mp.use_extra_bufts = 0, False
    m = llama_cpp.llama_model_load_from_file(model.encode(), mp)
    if not m:
        sys.exit(f"llama.cpp cannot load {model}")
    V = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
    cp.n_threads = cp.n_threads_batch = 1
    cp.type_k = cp.type_v = 0  # F32 KV cache
    cp.flash_attn_type = 1 if flash_attn else 0  # MiniMax-M3's sparse attention needs it on
    ctx = llama_cpp.llama_init_from_model(m, cp)

    def decode(toks, pos0, all_rows):
        b = llama_cpp.llama_batch_init(len(toks), 0, 1)
        b.n_tokens = len(toks)
        for i, t in enumerate(toks):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, pos0 + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if all_rows or i == len(toks) - 1 else 0
        if llama_cpp.llama_decode(ctx, b) != 0:
            sys.exit("llama_decode failed")
        n = len(toks) if all_rows else 1
        first = 0 if all_rows else len(toks) - 1
        out = [np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, first + i), shape=(V,)).copy()
               for i in range(n)]
        llama_cpp.llama_batch_free(b)
        return out

    rows = decode(prompt, 0, True)
    toks, greedy = list(prompt), []
    for _ in range(n_gen):
        t = int(np.argmax(rows[-1]))
        greedy.append(t)
        toks.append(t)
        rows += decode([t], len(toks) - 1, False)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(m)
    return np.array(rows, dtype=np.float32), toks, greedy, V



def write_cases(pack, out_dir, cases, n_prompt, n_gen, preset=None, only=(), seed=None,
                flash_attn=False):
    """cases: name -> synth arguments (after --preset PRESET when given). The prompts come from
    one generator seeded with `seed` in the cases' order, or, with seed None, each from its
    case's name (so a case can be made alone: `only`)."""
    rng = np.random.default_rng(seed) if seed is not None else None
    for name, args in cases.items():
        r = rng if rng is not None else np.random.default_rng(zlib.crc32(name.encode()))
        prompt = [int(x) for x in r.integers(0, 300, n_prompt)]
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as d:
            model = os.path.join(d, "m.gguf")
            synth = ["synth"] + (["--preset", preset] if preset else []) + args
            subprocess.run([pack, "-q"] + synth + ["--out", model], check=True)
            logits, toks, greedy, V = teacher_forced(model, prompt, n_gen, flash_attn)
        # the tokens fed: the prompt, then every greedy token but the last
        all_tokens = toks[:-1]
        logits = logits[: len(all_tokens)]
        margins = []
        for row in logits[n_prompt - 1:]:
            s = np.sort(row)
            margins.append(float(s[-1] - s[-2]))
        case = {
            "synth": synth,
            "prompt_tokens": prompt,
            "all_tokens": all_tokens,
            "greedy_tokens": greedy,
            "greedy_top1_top2_margins": margins,
            "logits": {"file": "logits.bin", "dtype": "float32", "shape": [len(all_tokens), V]},
            "llama_cpp": {"package": "llama-cpp-python " + llama_cpp.__version__,
                          "settings": "n_ctx 256, one ubatch, 1 thread, F32 KV, " +
                                      ("flash attention" if flash_attn else "no flash attention") +
                                      ", no weight repacking"},
        }
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        with open(os.path.join(out_dir, name, "case.json"), "w") as f:
            json.dump(case, f, indent=1)
        logits.tofile(os.path.join(out_dir, name, "logits.bin"))
        print(name, "rows", len(all_tokens), "min greedy margin %.3f" % min(margins))
