#!/usr/bin/env python3
"""llama.cpp's NextN/MTP (multi-token prediction) head on GLM-4.5, Qwen3.5, Qwen3-Next,
DeepSeek-V3.2, GLM-5, GLM-4.7-Flash, Hy3, Ling 3.0, MiMo-V2, Step 3.5 and DeepSeek-V4 synth
models.

The glm45air-* cases are a test-size synthetic GLM-4.5-Air (`expert-pack synth --preset
glm-4.5-air --dims 128,3,8,2,64,4,2,512`: 3 trunk layers and one NextN block, blk.3) and what
llama.cpp's MTP speculative decoding (common/speculative.cpp, common_speculative_impl_draft_mtp)
computes on it: the trunk's logits and h (its final hidden state after output_norm) for a
24-token prompt; the MTP context's catch-up over the prompt (row k: token x_k at position k with
the trunk's h of row k-1, zeros for k = 0); and a 4-step greedy draft chain from the trunk's
greedy token after the prompt. q35-f32 is the same on a synthetic Qwen3.5 (its NextN block a
full-attention one, after three delta-net layers and one full-attention layer), q3next-f32 the same
on a synthetic Qwen3-Next; ds32-f32 and
glm5-f32 on the synthetic DeepSeek-V3.2 and GLM-5 of tests/data/dsa (their NextN blocks run
dense latent attention: no indexer); glm47flash-f32 on a synthetic GLM-4.7-Flash (deepseek2,
llama.cpp's deepseek2 graph_mtp); hy3-f32 and ling3-f32 on tests/data/hy3's Hy3 and tests/data/ling3's Ling 3.0.
mimo2-f32 and step35-f32 are synthetic MiMo-V2 and Step 3.5 models with three NextN blocks, which
llama.cpp chains (common_speculative_impl_draft_mtp, chain_heads): the catch-up runs every block
over the prompt, and draft step i runs block i (llama_set_nextn_layer_offset) over the pending
token and the i drafts before it, from position N, each row with the hidden row the step before
produced; three drafts, one per block (chain_oracle). Their h is the final residual row before
the output norm, and a block's output before its head norm.
The dsv4-* cases do the same on the synthetic DeepSeek-V4-Flash models of tests/data/deepseek4
(v4-f32, v4-q8_0: 4 trunk layers and one NextN block, blk.4) with the first 40 tokens of those
cases' prompts, past the 8-position window. There h is the hyper-connection state, 4 streams of
n_embd (llama_model_n_embd_out wide), before hc_head; the MTP block runs plain sliding-window
attention (over its own K cache, no compressed entries, no indexer): the NextN block has compress
ratio 0, as the published model's (synth writes it so; llama.cpp's MTP graph aborts on another,
deepseek4.cpp: GGML_ASSERT(inp_dsv4 || ratio == 0)).
case.json names every file and what its rows are. The tests regenerate the model from the recipe
in case.json (synth is deterministic) and compare, so CI needs no llama.cpp.

Needs llama-cpp-python 0.3.36 (its libllama has glm4moe's and deepseek4's MTP graphs and the
llama_batch_ext API):
    python3 scripts/gen-mtp-cases.py --pack build/pack/expert-pack --out tests/data/mtp
"""
import argparse, ctypes, json, os, struct, subprocess, sys, tempfile, zlib

import numpy as np
import llama_cpp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import new_context, process, teacher_forced  # noqa: E402

CASES = {  # name -> synth arguments
    "glm45air-f32": ["synth", "--preset", "glm-4.5-air", "--dims", "128,3,8,2,64,4,2,512",
                     "--type", "F32", "--seed", "3"],
    "glm45air-q8_0": ["synth", "--preset", "glm-4.5-air", "--dims", "128,3,8,2,64,4,2,512",
                      "--type", "Q8_0", "--seed", "3"],
    # Qwen3.5: three gated delta-net layers to one full-attention layer; the NextN block is a
    # full-attention one
    "q35-f32": ["synth", "--preset", "qwen3.5-397b-a17b", "--dims", "128,4,8,2,64,2,1,512",
                "--type", "F32", "--seed", "3"],
    # Qwen3-Next: the same hybrid, its delta-net heads grouped, plain RoPE
    "q3next-f32": ["synth", "--preset", "qwen3-next-80b-a3b", "--dims", "128,4,8,2,64,2,1,512",
                   "--type", "F32", "--seed", "3"],
    # DeepSeek-V3.2 and GLM-5 (the models of tests/data/dsa/ds32-f32 and glm5-f32): their NextN
    # blocks run dense latent attention (no indexer)
    "ds32-f32": ["synth", "--preset", "deepseek-v3.2", "--dims", "128,4,8,2,64,4,1,512",
                 "--type", "F32", "--seed", "1"],
    "glm5-f32": ["synth", "--preset", "glm-5", "--dims", "128,4,8,2,64,4,1,512",
                 "--type", "F32", "--seed", "4"],
    # GLM-4.7-Flash: deepseek2 (dense latent attention) with its MTP layer after the trunk
    "glm47flash-f32": ["synth", "--preset", "glm-4.7-flash", "--dims", "128,4,8,2,64,4,1,512",
                       "--type", "F32", "--seed", "1"],
    # Hy3 (the model of tests/data/hy3/hy3-f32)
    "hy3-f32": ["synth", "--preset", "hy3", "--dims", "128,4,8,2,64,4,2,512", "--type", "F32",
                "--seed", "1"],
    # Ling 3.0 (the model of tests/data/ling3/ling3-f32): a latent-attention NextN block after
    # the KDA and latent-attention trunk
    "ling3-f32": ["synth", "--preset", "ling-3.0-flash", "--dims", "64,5,8,2,32,4,1,512",
                  "--type", "F32", "--seed", "1"],
    # MiMo-V2 and Step-3.5: three NextN blocks, chained (llama.cpp's chain_heads: the catch-up runs
    # every block over the batch; draft i runs block i over the pending token and the drafts
    # before it). MiMo's blocks slide (window 8, sinks), their q, k and v fused, a dense FFN;
    # Step's are MoE blocks with a shared expert, q/k norms and a head gate
    "mimo2-f32": ["synth", "--preset", "mimo-v2", "--dims", "128,4,8,2,64,4,2,512", "--type",
                  "F32", "--seed", "1"],
    "step35-f32": ["synth", "--preset", "step-3.7-flash", "--dims", "128,4,8,2,64,4,2,512",
                   "--type", "F32", "--seed", "1"],
    # the models of tests/data/deepseek4/v4-f32 and v4-q8_0
    "dsv4-f32": ["synth", "--preset", "deepseek-v4-flash", "--dims", "128,4,8,2,64,4,1,512",
                 "--type", "F32", "--seed", "1"],
    "dsv4-q8_0": ["synth", "--preset", "deepseek-v4-flash", "--dims", "256,4,8,2,128,4,1,512",
                  "--type", "Q8_0", "--seed", "2"],
}
N_PROMPT, N_DRAFT = 24, 4
# DeepSeek-V4 cases: the first DSV4_PROMPT tokens of the deepseek4 case's prompt (its trunk logits
# are that case's first rows), past the model's 8-position sliding window
DSV4_GOLDEN = {"dsv4-f32": "v4-f32", "dsv4-q8_0": "v4-q8_0"}
DSV4_PROMPT = 40
DSV4_MTP_ATTENTION = (
    "llama.cpp's deepseek4 graph_mtp: the NextN block's attention is the trunk's attention "
    "code with compress ratio 0 and a plain sliding-window K cache of its own (ctx_type MTP: "
    "llama_kv_cache_iswa over the NextN layer only): no compressed entries, no indexer. Its "
    "keys are its own rows (the catch-up's and the draft steps', at their positions), K = V = "
    "the rotated kv_norm(wkv x), one head; a query at position p sees keys at p - 7 .. p (window "
    "8, attention.sliding_window), with the sinks (attn_sinks), scale 1/sqrt(head_dim). RoPE is "
    "the uncompressed layers': rope.freq_base, no YaRN, on the last rope.dimension_count "
    "dimensions of each head, undone on the output at the query's position before wo_a/wo_b.")

WINDOW_OUT = "MTP last row, row N-1-window changed"  # before the last row's window: 0
WINDOW_IN = "MTP last row, row N-window changed"  # the window's first row: a change


_set_offset = llama_cpp.llama_cpp._lib._Z28llama_set_nextn_layer_offsetP13llama_contexti
_set_offset.argtypes, _set_offset.restype = [ctypes.c_void_p, ctypes.c_int32], None


def seq_rm(ctx, p0):
    llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, p0, -1)


def chain_oracle(m, prompt, V, E, H):
    """common_speculative_impl_draft_mtp with chain_heads (n_layer_nextn = H > 1), in one MTP
    context as llama.cpp's driver runs it: the catch-up once per head (seq_rm from the batch's
    start, nextn_layer_offset = head), then draft step i under head i over [pending, drafts so
    far] from position N (seq_rm from N), each row with the state the step before produced."""
    tgt = new_context(m, llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT)
    N = len(prompt)
    trunk_logits, trunk_h = process(tgt, prompt, 0, None, V, E)
    pending = int(np.argmax(trunk_logits[-1]))
    states = np.vstack([np.zeros((1, E), np.float32), trunk_h[:-1]])
    dft = new_context(m, llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
    catch = []
    for head in range(H):
        seq_rm(dft, 0)
        _set_offset(dft, head)
        catch.append(process(dft, prompt, 0, states, V, E))
    toks, hs, draft, draft_logits, draft_h = [pending], [trunk_h[-1]], [], [], []
    for i in range(H):
        seq_rm(dft, N)
        _set_offset(dft, i)
        lg, hh = process(dft, toks, N, np.array(hs), V, E)
        draft.append(int(np.argmax(lg[-1])))
        draft_logits.append(lg[-1])
        draft_h.append(hh[-1])
        toks.append(draft[-1])
        hs.append(hh[-1])
    draft_logits, draft_h = np.array(draft_logits), np.array(draft_h)
    # checks: each head alone in a fresh MTP context, the prompt and its draft rows in one batch,
    # gives the catch-up rows and the step's last row (the driver's per-head rows are its own)
    checks = {}
    for i in range(H):
        c = new_context(m, llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
        _set_offset(c, i)
        lg, hh = process(c, prompt + toks[:i + 1], 0, np.vstack([states, np.array(hs[:i + 1])]),
                         V, E)
        llama_cpp.llama_free(c)
        checks["head %d alone: catch-up rows" % i] = np.abs(lg[:N] - catch[i][0]).max()
        checks["head %d alone: draft step %d" % (i, i)] = np.abs(lg[-1] - draft_logits[i]).max()
        checks["head %d alone: draft h" % i] = np.abs(hh[-1] - draft_h[i]).max()
    for c in (dft, tgt):
        llama_cpp.llama_free(c)
    return dict(trunk_logits=trunk_logits, trunk_h=trunk_h, mtp_logits=catch[0][0],
                mtp_h=catch[0][1], draft_logits=draft_logits, draft_h=draft_h), pending, draft, checks


def mtp_oracle(model, prompt, window=0):
    mp = llama_cpp.llama_model_default_params()
    mp.n_gpu_layers, mp.use_extra_bufts, mp.load_mtp = 0, False, True
    m = llama_cpp.llama_model_load_from_file(model.encode(), mp)
    if not m:
        sys.exit(f"llama.cpp cannot load {model}")
    H = llama_cpp.llama_model_n_layer_nextn(m)
    if H > 1:
        V = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))
        E = llama_cpp.llama_model_n_embd_out(m)
        out = chain_oracle(m, prompt, V, E, H)
        llama_cpp.llama_model_free(m)
        return out
    assert H == 1
    V = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(m))
    E = llama_cpp.llama_model_n_embd_out(m)  # the MTP state's width (n_embd * hc for deepseek4)
    tgt = new_context(m, llama_cpp.LLAMA_CONTEXT_TYPE_DEFAULT)
    N = len(prompt)
    trunk_logits, trunk_h = process(tgt, prompt, 0, None, V, E)
    pending = int(np.argmax(trunk_logits[-1]))
    # catch-up: row k pairs x_k with h_{k-1}
    states = np.vstack([np.zeros((1, E), np.float32), trunk_h[:-1]])
    dft = new_context(m, llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
    mtp_logits, mtp_h = process(dft, prompt, 0, states, V, E)
    # draft: the pending token at N with h_{N-1}, then each draft token with the MTP's own h
    draft, draft_logits, draft_h, tok, h = [], [], [], pending, trunk_h[-1]
    for i in range(N_DRAFT):
        lg, hh = process(dft, [tok], N + i, [h], V, E)
        tok, h = int(np.argmax(lg[0])), hh[0]
        draft.append(tok)
        draft_logits.append(lg[0])
        draft_h.append(h)
    draft_logits, draft_h = np.array(draft_logits), np.array(draft_h)

    # checks: one catch-up batch over prompt + pending + draft[:-1] in a fresh MTP context gives
    # the catch-up rows and, from row N on, the draft steps
    chk = new_context(m, llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
    chk_logits, chk_h = process(chk, prompt + [pending] + draft[:-1], 0,
                                np.vstack([states, trunk_h[-1:], draft_h[:-1]]), V, E)
    checks = {
        "catch-up rerun vs catch-up": np.abs(chk_logits[:N] - mtp_logits).max(),
        "catch-up rerun h vs h": np.abs(chk_h[:N] - mtp_h).max(),
        "catch-up row N vs draft step 1": np.abs(chk_logits[N] - draft_logits[0]).max(),
        "catch-up rows N.. vs draft steps": np.abs(chk_logits[N:] - draft_logits).max(),
        "catch-up rows N.. h vs draft h": np.abs(chk_h[N:] - draft_h).max(),
    }
    if window:
        # the MTP attention's window: the catch-up again with one row's token and state changed,
        # the row just before the last row's window (no change to the last row) or its first row
        for k, key in ((N - 1 - window, WINDOW_OUT), (N - window, WINDOW_IN)):
            toks, st = list(prompt), states.copy()
            toks[k], st[k] = (toks[k] + 1) % V, trunk_h[0]
            w = new_context(m, llama_cpp.LLAMA_CONTEXT_TYPE_MTP)
            lg = process(w, toks, 0, st, V, E)[0]
            llama_cpp.llama_free(w)
            checks[key] = np.abs(lg[-1] - mtp_logits[-1]).max()
    for c in (chk, dft, tgt):
        llama_cpp.llama_free(c)
    llama_cpp.llama_model_free(m)
    return dict(trunk_logits=trunk_logits, trunk_h=trunk_h, mtp_logits=mtp_logits, mtp_h=mtp_h,
                draft_logits=draft_logits, draft_h=draft_h), pending, draft, checks


def margin(row):
    s = np.sort(row)
    return float(s[-1] - s[-2])


_GGUF_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
                12: "d"}


def gguf_scalar(path, want):
    """The scalar metadata value `want` of the GGUF at path."""
    b = open(path, "rb").read()
    o = 0

    def take(fmt):
        nonlocal o
        v = struct.unpack_from("<" + fmt, b, o)
        o += struct.calcsize("<" + fmt)
        return v[0]

    def skip(t):
        nonlocal o
        if t == 8:
            n = take("Q")
            o += n
        elif t == 9:
            et, n = take("I"), take("Q")
            for _ in range(n):
                skip(et)
        else:
            take(_GGUF_SCALAR[t])

    assert b[:4] == b"GGUF" and struct.unpack_from("<I", b, 4)[0] == 3
    o = 16
    for _ in range(take("Q")):
        n = take("Q")
        key, o = b[o:o + n].decode(), o + n
        t = take("I")
        if key == want:
            return take(_GGUF_SCALAR[t])
        skip(t)
    sys.exit(f"{path}: no {want}")


def write_case(pack, out_dir, name, synth):
    golden = DSV4_GOLDEN.get(name)
    if golden:
        gdir = os.path.join(out_dir, "..", "deepseek4", golden)
        with open(os.path.join(gdir, "case.json")) as f:
            g = json.load(f)
        assert g["synth"] == synth, f"{name}: not the model of deepseek4/{golden}"
        prompt = g["prompt_tokens"][:DSV4_PROMPT]
        glogits = np.fromfile(os.path.join(gdir, g["logits"]["file"]), np.float32)
        glogits = glogits.reshape(g["logits"]["shape"])[:DSV4_PROMPT]
    else:
        r = np.random.default_rng(zlib.crc32(name.encode()))
        prompt = [int(x) for x in r.integers(0, 300, N_PROMPT)]
    window = 0
    with tempfile.TemporaryDirectory() as d:
        model = os.path.join(d, "m.gguf")
        subprocess.run([pack, "-q"] + synth + ["--out", model], check=True)
        if golden:
            window = gguf_scalar(model, "deepseek4.attention.sliding_window")
        arrays, pending, draft, checks = mtp_oracle(model, prompt, window)
        plain = teacher_forced(model, prompt, 0)[0]
    checks["trunk vs plain llama_decode"] = np.abs(arrays["trunk_logits"] - plain).max()
    if golden:
        checks["trunk vs deepseek4/" + golden + " logits"] = np.abs(
            arrays["trunk_logits"] - glogits).max()
    window_in = checks.pop(WINDOW_IN, None)
    if max(checks.values()) > 1e-5 or (window and window_in < 1e-3):
        sys.exit(f"{name}: llama.cpp disagrees with itself: {checks}, {WINDOW_IN}: {window_in}")
    N, D = len(prompt), len(draft)
    V, E = arrays["trunk_logits"].shape[1], arrays["trunk_h"].shape[1]
    if golden:
        h_what = ("the hyper-connection state before hc_head, its " + str(E // 4) + "-wide "
                  "streams one after another (llama_model_n_embd_out = n_embd * 4 floats)")
        rows = {
            "trunk_logits": ([N, V], "target context, the prompt in one batch: row k = logits "
                                     "after x_k at position k (predicts x_{k+1}); the first N "
                                     "rows of deepseek4/" + golden + "'s logits"),
            "trunk_h": ([N, E], "target context, same batch: row k = h_k, " + h_what +
                                " after the last trunk layer (llama_get_embeddings_nextn_ith)"),
            "mtp_logits": ([N, V], "MTP context, the prompt in one batch (catch-up): row k = "
                                   "token x_k at position k with state h_{k-1} (zeros for k = "
                                   "0); predicts x_{k+1} from the trunk's view up to x_{k-1}"),
            "mtp_h": ([N, E], "MTP context, same batch: row k = the NextN block's output, " +
                              h_what + " (logits = output(shared_head_norm(hc_head(h))))"),
            "draft_logits": ([D, V], "MTP context after the catch-up, one token a step: step i "
                                     "= token t_i at position N+i (t_0 = pending_token, t_i = "
                                     "draft_tokens[i-1]) with state s_i (s_0 = h_{N-1} = "
                                     "trunk_h[N-1], s_i = draft_h[i-1]); draft_tokens[i] = its "
                                     "argmax"),
            "draft_h": ([D, E], "MTP context, same steps: step i's h output, as mtp_h"),
        }
    else:
        rows = {
            "trunk_logits": ([N, V], "target context, the prompt in one batch: row k = logits "
                                     "after x_k at position k (predicts x_{k+1})"),
            "trunk_h": ([N, E], "target context, same batch: row k = h_k, the final hidden state "
                                "after output_norm (llama_get_embeddings_nextn_ith)"),
            "mtp_logits": ([N, V], "MTP context, the prompt in one batch (catch-up): row k = "
                                   "token x_k at position k with state h_{k-1} (zeros for k = "
                                   "0); predicts x_{k+1} from the trunk's view up to x_{k-1}"),
            "mtp_h": ([N, E], "MTP context, same batch: row k = the NextN block's output after "
                              "shared_head_norm"),
            "draft_logits": ([D, V], "MTP context after the catch-up, one token a step: step i = "
                                     "token t_i at position N+i (t_0 = pending_token, t_i = "
                                     "draft_tokens[i-1]) with state s_i (s_0 = h_{N-1} = "
                                     "trunk_h[N-1], s_i = draft_h[i-1]); draft_tokens[i] = its "
                                     "argmax"),
            "draft_h": ([D, E], "MTP context, same steps: step i's h output, after "
                                "shared_head_norm"),
        }
    if D != N_DRAFT:  # chained blocks: their h is the row before the norm
        rows.update({
            "trunk_h": ([N, E], "target context, same batch: row k = h_k, the final residual row "
                                "before output_norm (llama_get_embeddings_nextn_ith)"),
            "mtp_logits": ([N, V], "MTP context, the prompt in one batch under head 0 (the "
                                   "catch-up; every head is caught up on the same rows): row k = "
                                   "token x_k at position k with state h_{k-1} (zeros for k = 0)"),
            "mtp_h": ([N, E], "MTP context, same batch: row k = head 0's output before its head "
                              "norm"),
            "draft_logits": ([D, V], "MTP context after the catch-up: step i = head i (blk.n_layer"
                                     "+i) over tokens t_0..t_i at positions N..N+i (t_0 = "
                                     "pending_token, t_j = draft_tokens[j-1]) with states s_0..s_i "
                                     "(s_0 = trunk_h[N-1], s_j = draft_h[j-1]), its last row; "
                                     "draft_tokens[i] = its argmax. One step per head"),
            "draft_h": ([D, E], "MTP context, same steps: step i's last row's output before the "
                                "head norm"),
        })
    case = {
        "synth": synth,
        "prompt_tokens": prompt,
        "pending_token": pending,
        "draft_tokens": draft,
        "pending_top1_top2_margin": margin(arrays["trunk_logits"][-1]),
        "draft_top1_top2_margins": [margin(x) for x in arrays["draft_logits"]],
        "files": {k: {"file": k + ".bin", "dtype": "float32", "shape": s, "rows": what}
                  for k, (s, what) in rows.items()},
        "checks_max_abs_diff": {k: float(v) for k, v in checks.items()},
        "llama_cpp": {"package": "llama-cpp-python " + llama_cpp.__version__,
                      "settings": "n_ctx 256, one ubatch, 1 thread, F32 KV, no flash attention, "
                                  "no weight repacking, load_mtp; target context embeddings_nextn "
                                  "unmasked, MTP context (ctx_type MTP) masked; llama_process"},
    }
    if golden:
        case["prompt_from"] = "deepseek4/%s prompt_tokens[:%d]" % (golden, N)
        case["mtp_attention"] = DSV4_MTP_ATTENTION
        case["sliding_window"] = window
        case["window_check"] = {WINDOW_IN + " (max abs logit change)": float(window_in)}
    os.makedirs(os.path.join(out_dir, name), exist_ok=True)
    with open(os.path.join(out_dir, name, "case.json"), "w") as f:
        json.dump(case, f, indent=1)
    for k, a in arrays.items():
        a.astype(np.float32).tofile(os.path.join(out_dir, name, k + ".bin"))
    print(name, "pending", pending, "draft", draft,
          "min draft margin %.3f" % min(case["draft_top1_top2_margins"]))
    for k, v in checks.items():
        print("  %-34s %.3g" % (k, v))


ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--pack", required=True, help="the expert-pack binary")
ap.add_argument("--out", required=True, help="the cases' folder, e.g. tests/data/mtp")
ap.add_argument("only", nargs="*", help="make only these cases")
a = ap.parse_args()
for name, synth in CASES.items():
    if not a.only or name in a.only:
        write_case(a.pack, a.out, name, synth)
