"""llama.cpp's teacher-forced logits on expert-pack synth models, written as test cases.

The shared part of scripts/gen-*-cases.py: each case is a synth recipe and llama.cpp's logits on
its model, in the golden data's format (../shared/golden/README.md): the prompt in one batch, then
llama.cpp's greedy tokens one at a time. The tests regenerate the model from the recipe in
case.json (synth is deterministic) and compare, so CI needs no llama.cpp.
Needs llama-cpp-python 0.3.36.
"""
import ctypes, json, os, subprocess, sys, tempfile, zlib

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



# llama.cpp's MTP drafting (scripts/gen-mtp-cases.py, model/check_mtp_export.py).
# libllama exports these only C++-mangled; bind them on llama_cpp's own handle
_lib = llama_cpp.llama_cpp._lib
set_nextn = _lib._Z26llama_set_embeddings_nextnP13llama_contextbb
set_nextn.argtypes, set_nextn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
get_nextn_ith = _lib._Z30llama_get_embeddings_nextn_ithP13llama_contexti
get_nextn_ith.argtypes = [ctypes.c_void_p, ctypes.c_int32]
get_nextn_ith.restype = ctypes.POINTER(ctypes.c_float)


def new_context(m, ctx_type):
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 256
    cp.n_threads = cp.n_threads_batch = 1
    cp.type_k = cp.type_v = 0  # F32 KV cache
    cp.flash_attn_type = 0
    cp.ctx_type = ctx_type
    ctx = llama_cpp.llama_init_from_model(m, cp)
    # the target keeps h for every row (unmasked), the MTP context for its output rows (masked),
    # as common_speculative_impl_draft_mtp sets them
    set_nextn(ctx, True, ctx_type == llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
    return ctx


def process(ctx, toks, pos0, states, V, E):
    """One llama_process over toks at pos0.. (every row an output), each row with its state
    (the MTP context's h input) when states is given; its logits and h_nextn rows."""
    b = llama_cpp.llama_batch_ext_init(ctx)
    for i, t in enumerate(toks):
        j = llama_cpp.llama_batch_ext_add_token(b, 0, t)
        llama_cpp.llama_batch_ext_set_pos(b, j, ctypes.byref(llama_cpp.llama_pos(pos0 + i)))
        # the state goes in as the row's embd, as common_batch::set_embd does it
        # (llama_batch_ext_set_embd_state is a stub that returns false in this llama.cpp)
        if states is not None:
            h = np.ascontiguousarray(states[i], dtype=np.float32)
            e = llama_cpp.llama_embd(h.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, E)
            assert llama_cpp.llama_batch_ext_set_embd_token(b, j, e)
        llama_cpp.llama_batch_ext_set_output_logits(b, j, True)
    if llama_cpp.llama_process(ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b) != 0:
        sys.exit("llama_process failed")
    llama_cpp.llama_batch_ext_free(b)
    logits = np.array([np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, i), shape=(V,))
                       for i in range(len(toks))], dtype=np.float32)
    h = np.array([np.ctypeslib.as_array(get_nextn_ith(ctx, i), shape=(E,))
                  for i in range(len(toks))], dtype=np.float32)
    return logits, h


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
