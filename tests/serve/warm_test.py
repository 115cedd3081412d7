#!/usr/bin/env python3
"""A worker that comes back warm (docs/fleet.md "Coming back warm"): a real expertd with a cache
smaller than the model and a --state-path, a real expert-serve with the SSD prefix tier on a real
directory, the official openai client.

1. expert-serve answers a long conversation's first turn, is stopped with SIGTERM (a drain: exit
   0) and restarted with the same flags: its RAM tier is empty, and the conversation's next turn
   resumes at least 0.9 of the first turn's prompt from the SSD tier, with the same greedy text
   and the same logprobs as a worker without any prefix cache (the storage never changes the
   math). expertd kept running: the restarted worker's first request finds the experts warm.
2. With --workers 2 (two engine processes, one --parallel each) on the same directory, two
   copies of that turn sent at once go to both processes, each with an empty RAM tier: both
   resume from the tier the single process wrote.
3. expertd restarted: with its --state-path it reads the popular experts back before the first
   request; the first requests' hit rate with and without it is printed and compared.

Usage: warm_test.py --bin BUILD_DIR --source SOURCE_DIR
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
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
QWEN3 = os.path.join(SRC, "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")
tmp = tempfile.mkdtemp(prefix="warm-test-", dir=B)
procs = []
daemons = []
SLOTS = 48  # of 4 layers x 32 experts: the cache holds 3/8 of the model


def start_expertd(sock, state):
    extra = ["--cache-slots", str(SLOTS), "--clients-max", "4"] + (["--state-path", state] if state else [])
    return serve_util.start_expertd(B, os.path.join(tmp, "kjv.manifest.json"), sock, daemons, extra)


def metrics(u):
    t = urllib.request.urlopen(u + "/metrics", timeout=10).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^([a-z_:]+) (\S+)$", t, re.M)}


def stop(p, what):
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=60)
    check(rc == 0, f"{what}: SIGTERM drains and exits 0 (rc {rc})")


def hit_rate(before, after):
    h = after["expertd_cache_hits_total"] - before.get("expertd_cache_hits_total", 0)
    m = after["expertd_cache_misses_total"] - before.get("expertd_cache_misses_total", 0)
    return h / max(1.0, h + m), int(h), int(m)


def client(u):
    return openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=300)


def chat(u, messages, n=24, c=None):
    c = c or client(u)
    return c.chat.completions.create(model="kjv", messages=messages, max_tokens=n, temperature=0, logprobs=True,
                                     top_logprobs=5)


def logits_of(r):
    """The tokens and their logprobs with the top 5 alternatives: what the math produced."""
    return [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in r.choices[0].logprobs.content]


def settle(u):
    """Waits until expertd reads nothing (its warm start done), returns its metrics."""
    m = metrics(u)
    for _ in range(400):
        if m.get("expertd_slots_loading", 1) == 0:
            break
        time.sleep(0.05)
        m = metrics(u)
    return m


CONV = [{"role": "system", "content": "You are a scribe of the old books, and you answer as they speak. " * 30},
        {"role": "user", "content": "Tell me of Moses and the people in the wilderness."}]
OTHER = [{"role": "user", "content": "Sing of the rivers of Babylon, and of the harps upon the willows."}]

try:
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")],
                   check=True, capture_output=True)
    core = os.path.join(tmp, "kjv.core.gguf")
    sock = os.path.join(tmp, "d.sock")
    open(sock + ".conf", "w").write("# flags only\n")
    state = os.path.join(tmp, "popularity.json")
    pdir = os.path.join(tmp, "prefix-tier")
    daemon = start_expertd(sock, state)
    base = ["--model", core, "--socket", sock, "--alias", "kjv", "--ctx", "2048", "--chat-template", QWEN3]
    tier = base + ["--parallel", "2", "--prefix-cache-mib", "64", "--prefix-cache-dir", pdir]

    # ---- 1. One worker: SIGTERM, the same flags again, the next turn from the SSD tier ----
    p, u = serve_util.start_serve(B, tmp, procs, tier)
    cold_m0 = metrics(u)
    t0 = time.monotonic()
    first = chat(u, CONV)
    cold_rate = hit_rate(cold_m0, metrics(u))
    prompt1 = first.usage.prompt_tokens
    print(f"turn 1: {prompt1} prompt tokens, {first.usage.completion_tokens} generated in "
          f"{time.monotonic() - t0:.2f} s; expertd cold (just started): first request's hit rate "
          f"{cold_rate[0]:.3f} ({cold_rate[1]} hits, {cold_rate[2]} misses)", flush=True)
    check(prompt1 >= 400, f"a long prompt ({prompt1} tokens)")
    for _ in range(200):
        if metrics(u).get("expert_serve_prefix_disk_writes_total", 0) >= 2:
            break
        time.sleep(0.05)
    check(metrics(u).get("expert_serve_prefix_disk_writes_total", 0) >= 2,
          "the prompt's and the reply's states are written to the SSD tier")
    stop(p, "the worker")
    files = [f for f in os.listdir(pdir) if f.endswith(".pfx")]
    check(len(files) >= 2, f"the tier's files outlive the worker ({len(files)} in {pdir})")

    conv2 = CONV + [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "And then what happened in the land?"}]
    p, u = serve_util.start_serve(B, tmp, procs, tier)  # the same flags
    m0 = metrics(u)
    check(m0.get("expert_serve_prefix_cache_entries") == 0 and m0.get("expert_serve_prefix_disk_entries", 0) >= 2,
          f"restarted: the RAM tier is empty ({m0.get('expert_serve_prefix_cache_entries')} entries), the SSD "
          f"tier indexed from the directory ({m0.get('expert_serve_prefix_disk_entries')} entries)")
    t0 = time.monotonic()
    warm = chat(u, conv2)
    warm_s = time.monotonic() - t0
    serve_restart_rate = hit_rate(m0, metrics(u))
    m1 = metrics(u)
    cached = warm.usage.prompt_tokens_details.cached_tokens
    print(f"turn 2 after the restart: {warm.usage.prompt_tokens} prompt tokens, {cached} resumed from the SSD tier, "
          f"{warm_s:.2f} s; expertd kept running: the restarted worker's first request's hit rate "
          f"{serve_restart_rate[0]:.3f} ({serve_restart_rate[1]} hits, {serve_restart_rate[2]} misses)", flush=True)
    check(cached >= 0.9 * prompt1, f"turn 2 resumes >= 0.9 of turn 1's prompt from the SSD tier ({cached} of {prompt1})")
    check(m1.get("expert_serve_prefix_disk_hits_total") == 1 and m1.get("expert_serve_prefix_disk_reads_total") == 1,
          "the resume came from the SSD tier (one disk hit, one state read)")
    check(serve_restart_rate[0] > cold_rate[0],
          f"expertd kept its cache through the worker's restart: hit rate {serve_restart_rate[0]:.3f} > "
          f"{cold_rate[0]:.3f} when it was cold")
    stop(p, "the restarted worker")

    p, u = serve_util.start_serve(B, tmp, procs, base + ["--parallel", "2", "--prefix-cache-mib", "0"])
    t0 = time.monotonic()
    ref = chat(u, conv2)
    print(f"turn 2 on a worker without a prefix cache: {time.monotonic() - t0:.2f} s", flush=True)
    check(ref.usage.prompt_tokens_details is None or not ref.usage.prompt_tokens_details.cached_tokens,
          "the reference computed the whole prompt")
    check(warm.choices[0].message.content == ref.choices[0].message.content and len(logits_of(ref)) > 0,
          "the resumed turn's greedy text equals the cold run's")
    check(logits_of(warm) == logits_of(ref),
          f"and its logprobs, top 5 alternatives included, are equal ({len(logits_of(ref))} tokens)")
    stop(p, "the reference worker")

    # ---- 2. --workers 2 on the same directory: both engine processes read the tier ----
    p, u = serve_util.start_serve(B, tmp, procs, base + ["--workers", "2", "--parallel", "1", "--prefix-cache-mib",
                                                         "64", "--prefix-cache-dir", pdir], new_session=True)
    # /health answers once one engine process is up: both must be, or both requests go to the first.
    check(serve_util.wait_for(lambda: metrics(u).get("expert_serve_engines_ready") == 2, 60),
          "--workers 2: both engine processes ready")
    got = [None, None]
    # Both clients made first and the two requests sent together: the second must arrive while the
    # first runs (the dispatcher gives it the idle process), not after a slow client's set-up.
    clients, start = [client(u), client(u)], threading.Barrier(2)

    def one(i):
        start.wait()
        got[i] = chat(u, conv2, c=clients[i])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for i, r in enumerate(got):
        c = r.usage.prompt_tokens_details.cached_tokens
        check(c >= 0.9 * prompt1 and logits_of(r) == logits_of(ref),
              f"--workers 2, request {i} (one per engine process): {c} tokens resumed, the same logprobs")
    mw = metrics(u)
    check(mw.get("expert_serve_prefix_disk_hits_total") == 2 and mw.get("expert_serve_prefix_hits_total") == 0,
          f"both engine processes resumed from the SSD tier ({mw.get('expert_serve_prefix_disk_hits_total')} disk "
          f"hits, {mw.get('expert_serve_prefix_hits_total')} RAM hits, summed over the processes)")
    os.killpg(p.pid, signal.SIGTERM)
    check(p.wait(timeout=60) == 0, "--workers 2 drains and exits 0")

    # ---- 3. expertd restarted, with and without its warm start ----
    def first_requests(with_state):
        d_ = start_expertd(sock, state if with_state else None)
        q, uq = serve_util.start_serve(B, tmp, procs, base + ["--parallel", "2", "--prefix-cache-mib", "0"])
        m_ = settle(uq)
        warm_reads = int(m_.get("expertd_warm_reads_total", 0))
        chat(uq, OTHER, n=16)
        chat(uq, CONV[:1] + OTHER, n=16)
        rate = hit_rate(m_, metrics(uq))
        stop(q, "the worker")
        return d_, rate, warm_reads

    stop(daemon, "expertd")  # writes its popularity to --state-path
    check(os.path.exists(state), "expertd wrote its experts' popularity at stop")
    daemon, with_rate, with_reads = first_requests(True)
    stop(daemon, "expertd (warm start)")
    daemon, without_rate, without_reads = first_requests(False)
    stop(daemon, "expertd (cold)")
    print(f"expertd restarted, its first two requests: hit rate {with_rate[0]:.3f} with the warm start "
          f"({with_reads} experts read before them; {with_rate[1]} hits, {with_rate[2]} misses), "
          f"{without_rate[0]:.3f} without ({without_reads} read; {without_rate[1]} hits, {without_rate[2]} misses)",
          flush=True)
    check(with_reads == SLOTS and without_reads == 0,
          f"the warm start filled the {SLOTS} slots with the most popular experts ({with_reads} read), the cold "
          f"start none ({without_reads})")
    check(with_rate[0] > without_rate[0], "the warm start raises the first requests' hit rate")
finally:
    for q in procs + daemons:
        if q.poll() is None:
            q.kill()
        q.wait()

if failures:
    print(f"{len(failures)} check(s) failed; logs in {tmp}")
    sys.exit(1)
shutil.rmtree(tmp, ignore_errors=True)
print("all warm-restart checks passed")
