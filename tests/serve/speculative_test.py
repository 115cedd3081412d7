#!/usr/bin/env python3
"""Speculative decoding in expert-serve (engine/speculative.h), with the official openai client, a
real expertd whose cache holds less than the model, and the bundled model's pack:

1. Greedy completions with prompt-lookup drafts ("speculative": "ngram", per request, and the
   server's --speculative ngram) give the text and the logprobs of plain decoding
   ("speculative": "none"), streamed or not, alone or two at once in one batch.
2. /metrics counts the drafts verified and kept; a text that repeats itself keeps most of them.
3. Sampled completions with drafts are valid and reproducible from their seed.
4. Bad values are 400s naming the field ("mtp" on a server without --speculative mtp too);
   --workers 2 sums the engine processes' draft counters; a model with a recurrent state
   (Qwen3.5) keeps the plain text too, and so do the drafts of a model's own NextN block
   (--speculative mtp: the bundled model's trained head through expertd, its drafts kept).

Usage: speculative_test.py --bin BUILD_DIR --source SOURCE_DIR
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()

from serve_util import check, failures, in_client_venv  # noqa: E402
import serve_util  # noqa: E402

in_client_venv(args.bin)

import openai  # noqa: E402

B = os.path.abspath(args.bin)
SRC = os.path.abspath(args.source)
MODEL = os.path.join(SRC, "model", "kjv-moe-q8_0.gguf")
tmp = tempfile.mkdtemp(prefix="spec-test-", dir=B)
procs = []

PASSAGE = ("And God said, Let there be light: and there was light. And God saw the light, that it was good: "
           "and God divided the light from the darkness. And God called the light Day, and the darkness he "
           "called Night. And the evening and the morning were the first day. ")
# An agent-style rewrite: the passage, then its start again (the model goes on as it read).
PROMPT = PASSAGE + PASSAGE[:60]


def metrics(u):
    t = urllib.request.urlopen(u + "/metrics", timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^([a-z_:]+) (\S+)$", t, re.M)}


def complete(c, spec, stream=False, n=48, model="kjv", **kw):
    extra = {} if spec is None else {"speculative": spec}
    r = c.completions.create(model=model, prompt=PROMPT, max_tokens=n, temperature=kw.pop("temperature", 0),
                             logprobs=5, stream=stream, extra_body=extra, **kw)
    if not stream:
        lp = r.choices[0].logprobs
        return r.choices[0].text, list(zip(lp.tokens, lp.token_logprobs))
    text, lps = "", []
    for ch in r:
        if ch.choices:
            text += ch.choices[0].text or ""
            if ch.choices[0].logprobs:
                lps += list(zip(ch.choices[0].logprobs.tokens, ch.choices[0].logprobs.token_logprobs))
    return text, lps


def post(u, body):
    req = urllib.request.Request(u + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


try:
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")],
                   check=True, capture_output=True)
    core = os.path.join(tmp, "kjv.core.gguf")
    sock = os.path.join(tmp, "d.sock")
    serve_util.start_expertd(B, os.path.join(tmp, "kjv.manifest.json"), sock, procs,
                             ["--cache-slots", "48", "--clients-max", "6"])
    base = ["--model", core, "--socket", sock, "--alias", "kjv", "--ctx", "1024", "--parallel", "2"]

    # ---- 1. Per request, on a server without --speculative ----
    _, u = serve_util.start_serve(B, tmp, procs, base)
    c = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=300)
    plain = complete(c, "none")
    m0 = metrics(u)
    spec = complete(c, "ngram")
    m1 = metrics(u)
    check(len(plain[0]) > 40, f"plain decoding wrote text ({len(plain[0])} characters)")
    check(spec == plain, "greedy text and logprobs with ngram drafts equal plain decoding's")
    drafted = m1["expert_serve_draft_tokens_total"] - m0.get("expert_serve_draft_tokens_total", 0)
    kept = m1["expert_serve_draft_accepted_tokens_total"] - m0.get("expert_serve_draft_accepted_tokens_total", 0)
    steps = m1["expert_serve_draft_steps_total"] - m0.get("expert_serve_draft_steps_total", 0)
    print(f"ngram drafts: {int(drafted)} drafted, {int(kept)} kept over {int(steps)} steps "
          f"({kept / max(drafted, 1):.2f} acceptance)", flush=True)
    check(drafted > 0 and kept > 0, "the drafts were verified and some kept (/metrics)")
    check(m1["expert_serve_steps_total"] - m0["expert_serve_steps_total"] < 48,
          "fewer engine steps than tokens: kept drafts saved evals")
    check(m0.get("expert_serve_draft_tokens_total", 0) == 0, "\"speculative\": \"none\" drafted nothing")

    # The engine reports its drafts to expertd (expertctl stats) and hints the drafts' routing.
    def ctl_stats():
        out = subprocess.run([os.path.join(B, "client", "expertctl"), "--socket", sock, "stats", "--json"],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out)
    ok = serve_util.wait_for(lambda: ctl_stats()["draft_tokens"] == drafted, 10)
    st = ctl_stats()
    check(ok and st["draft_accepted"] == kept and st["draft_steps"] == steps,
          f"expertctl stats counts the drafts /metrics counts ({st['draft_tokens']} drafted, "
          f"{st['draft_accepted']} kept, acceptance {st['draft_acceptance']:.2f})")
    check(st["prefetch_issued"] + st["prefetch_rejected"] + st["prefetch_dropped"] > 0,
          "the drafts' routing was hinted to expertd (no --prefetch: every hint is a draft hint)")
    text = urllib.request.urlopen(u + "/metrics", timeout=10).read().decode()
    vk = re.search(r"^vllm:spec_decode_num_accepted_tokens_total\{[^}]*\} (\S+)$", text, re.M)
    check(vk is not None and float(vk.group(1)) == m1["expert_serve_draft_accepted_tokens_total"],
          "vLLM's name for the kept drafts counts the same")
    # The page's dashboard tells the drafts too (one event of its stream).
    with urllib.request.urlopen(u + "/dashboard/events", timeout=30) as ev:
        line = b""
        while not line.startswith(b"data:"):
            line = ev.readline()
    snap = json.loads(line[5:])
    check(snap["serve"]["draft_tokens"] == drafted and snap["serve"]["draft_accepted_tokens"] == kept,
          "the dashboard's snapshot counts the drafts")
    check(complete(c, "ngram", stream=True) == plain, "streamed, the same text and logprobs")
    # Two at once: their rows (one with drafts, one without) in one batch.
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        a, b = ex.submit(complete, c, "ngram"), ex.submit(complete, c, "none")
        check(a.result() == plain and b.result() == plain, "two requests batched together: each its plain text")
    # ---- 3. Sampling: the acceptance rule; valid text, reproducible from the seed ----
    s1 = complete(c, "ngram", temperature=0.9, seed=11)
    s2 = complete(c, "ngram", temperature=0.9, seed=11)
    check(s1 == s2 and len(s1[0]) > 0, "sampled with drafts: the same text from the same seed")
    # ---- 4. Bad values ----
    for body, field in (({"speculative": "mtp"}, "speculative"), ({"speculative": 1}, "speculative"),
                        ({"speculative": "ngram", "draft_max": 0}, "draft_max"), ({"draft_max": 99}, "draft_max")):
        st, text = post(u, dict({"prompt": "And", "max_tokens": 2}, **body))
        check(st == 400 and field in text, f"{body}: 400 naming {field} ({st} {text[:120]})")
    check(complete(c, None)[0] == plain[0], "the server still answers after bad requests")

    # ---- 1b. The server's --speculative ngram: every request drafts unless it says none ----
    _, u2 = serve_util.start_serve(B, tmp, procs, base + ["--speculative", "ngram", "--draft-max", "6"])
    c2 = openai.OpenAI(base_url=u2 + "/v1", api_key="none", max_retries=0, timeout=300)
    check(complete(c2, None) == plain, "--speculative ngram: the plain greedy text")
    check(metrics(u2)["expert_serve_draft_tokens_total"] > 0, "--speculative ngram drafts without being asked")

    # ---- 4b. --workers 2: the engine processes' counters summed ----
    _, u3 = serve_util.start_serve(B, tmp, procs, base + ["--workers", "2", "--speculative", "ngram"])
    c3 = openai.OpenAI(base_url=u3 + "/v1", api_key="none", max_retries=0, timeout=300)
    check(complete(c3, None) == plain, "--workers 2 with drafts: the plain greedy text")
    ok = serve_util.wait_for(lambda: metrics(u3).get("expert_serve_draft_tokens_total", 0) > 0, 10)
    check(ok, "--workers 2: /metrics sums the engine processes' draft counters")

    # ---- 4c. A model with a recurrent state (Qwen3.5's delta rule): the state is restored after a
    # rejection and the kept drafts evaluated again; greedy text and logprobs are plain decoding's ----
    q35 = os.path.join(tmp, "q35.gguf")
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "synth", "--preset", "qwen3.5-397b-a17b",
                    "--dims", "128,5,8,2,64,2,1,512", "--type", "F16", "--seed", "3", "--out", q35],
                   check=True, capture_output=True)
    _, u4 = serve_util.start_serve(B, tmp, procs, ["--model", q35, "--local", "--speculative", "ngram",
                                                   "--draft-max", "6"])
    c4 = openai.OpenAI(base_url=u4 + "/v1", api_key="none", max_retries=0, timeout=300)
    q_plain, q_spec = complete(c4, "none", n=60, model="q35"), complete(c4, "ngram", n=60, model="q35")
    check(q_spec == q_plain and len(q_plain[1]) == 60, "Qwen3.5 (recurrent) with drafts: the plain greedy text and logprobs")
    m4 = metrics(u4)
    check(m4["expert_serve_draft_accepted_tokens_total"] > 0,
          f"Qwen3.5: drafts kept ({m4['expert_serve_draft_accepted_tokens_total']:.0f} of "
          f"{m4['expert_serve_draft_tokens_total']:.0f})")

    # ---- 4d. The model's own NextN block (--speculative mtp: the bundled model's trained head,
    # model/kjv-moe-mtp-q8_0.gguf, through expertd, its experts packed with the trunk's): greedy
    # text and logprobs are plain decoding's, alone and two at once, and its drafts are kept; a
    # request may still ask for prompt lookup ----
    mtp = os.path.join(tmp, "kjv-mtp.gguf")
    shutil.copy(os.path.join(SRC, "model", "kjv-moe-mtp-q8_0.gguf"), mtp)
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", mtp], check=True, capture_output=True)
    gsock = os.path.join(tmp, "g.sock")
    serve_util.start_expertd(B, os.path.join(tmp, "kjv-mtp.manifest.json"), gsock, procs,
                             ["--cache-slots", "80", "--clients-max", "2"])
    _, u5 = serve_util.start_serve(B, tmp, procs, ["--model", os.path.join(tmp, "kjv-mtp.core.gguf"), "--socket",
                                                   gsock, "--alias", "kjv", "--parallel", "2",
                                                   "--speculative", "mtp", "--draft-max", "3"])
    c5 = openai.OpenAI(base_url=u5 + "/v1", api_key="none", max_retries=0, timeout=300)
    g_plain = complete(c5, "none")
    m5 = metrics(u5)
    g_mtp = complete(c5, None)
    check(g_mtp == g_plain and g_plain == plain, "--speculative mtp: the plain greedy text and logprobs")
    m6 = metrics(u5)
    drafted = m6["expert_serve_draft_tokens_total"] - m5.get("expert_serve_draft_tokens_total", 0)
    kept = m6["expert_serve_draft_accepted_tokens_total"] - m5.get("expert_serve_draft_accepted_tokens_total", 0)
    check(kept > 0, f"--speculative mtp: the trained head's drafts are kept ({kept:.0f} of {drafted:.0f})")
    check(complete(c5, "ngram") == g_plain, "a request's ngram on the mtp server: plain text")
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        a, b = ex.submit(complete, c5, "mtp"), ex.submit(complete, c5, None)
        check(a.result() == g_plain and b.result() == g_plain, "two NextN-drafting requests batched: each its plain text")
finally:
    for q in procs:
        if q.poll() is None:
            q.kill()
        q.wait()

if failures:
    print(f"{len(failures)} check(s) failed; logs in {tmp}")
    sys.exit(1)
shutil.rmtree(tmp, ignore_errors=True)
print("all speculative-decoding checks passed")
