#!/usr/bin/env python3
"""Reference logits for DeepSeek-V4 (deepseek4) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset deepseek-v4-flash --dims
...`: hyper-connections, a sliding-window layer, compressed-by-4 layers with the lightning
indexer, a compressed-by-128 layer, a hash-routed layer, limited SwiGLU) and llama.cpp's
teacher-forced logits on it, in the golden data's format (../shared/golden/README.md): the prompt
in one batch, then llama.cpp's greedy tokens one at a time. The prompt is long enough for every
mechanism to act: past the 8-position window, past the indexer's top-3 of the compressed
entries, and past 128 positions (the first entry of the compressed-by-128 layer). The tests
regenerate the model from the recipe in case.json (synth is deterministic) and compare, so CI
needs no llama.cpp.

Needs llama-cpp-python 0.3.36 (it knows deepseek4) and a build of expert-pack:
    python3 scripts/gen-deepseek4-cases.py build/pack/expert-pack tests/data/deepseek4
"""
import json, os, subprocess, sys, tempfile

import numpy as np
import llama_cpp

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "v4-f32": ["--dims", "128,4,8,2,64,4,1,512", "--type", "F32", "--seed", "1"],
    "v4-q8_0": ["--dims", "256,4,8,2,128,4,1,512", "--type", "Q8_0", "--seed", "2"],
    # the seed's GGUF: MXFP4 routed experts, Q8_0 elsewhere
    "v4-mxfp4": ["--dims", "256,4,8,2,128,4,1,512", "--type", "Q8_0", "--gate-type", "MXFP4",
                 "--up-type", "MXFP4", "--down-type", "MXFP4", "--seed", "3"],
}
N_PROMPT, N_GEN = 140, 8


def teacher_forced(model, prompt, n_gen):
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
    cp.flash_attn_type = 0
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


def main():
    pack, out_dir = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(11)
    for name, args in CASES.items():
        prompt = [int(x) for x in rng.integers(0, 300, N_PROMPT)]
        with tempfile.TemporaryDirectory() as d:
            model = os.path.join(d, "m.gguf")
            synth = ["synth", "--preset", "deepseek-v4-flash"] + args
            subprocess.run([pack, "-q"] + synth + ["--out", model], check=True)
            logits, toks, greedy, V = teacher_forced(model, prompt, N_GEN)
        # the tokens fed: the prompt, then every greedy token but the last
        all_tokens = toks[:-1]
        logits = logits[: len(all_tokens)]
        margins = []
        for r in logits[N_PROMPT - 1:]:
            s = np.sort(r)
            margins.append(float(s[-1] - s[-2]))
        case = {
            "synth": synth,
            "prompt_tokens": prompt,
            "all_tokens": all_tokens,
            "greedy_tokens": greedy,
            "greedy_top1_top2_margins": margins,
            "logits": {"file": "logits.bin", "dtype": "float32", "shape": [len(all_tokens), V]},
            "llama_cpp": {"package": "llama-cpp-python " + llama_cpp.__version__,
                          "settings": "n_ctx 256, one ubatch, 1 thread, F32 KV, no flash "
                                      "attention, no weight repacking"},
        }
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        with open(os.path.join(out_dir, name, "case.json"), "w") as f:
            json.dump(case, f, indent=1)
        logits.tofile(os.path.join(out_dir, name, "logits.bin"))
        print(name, "rows", len(all_tokens), "min greedy margin %.3f" % min(margins))


main()
