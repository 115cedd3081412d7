#!/usr/bin/env python3
"""Load for expert-serve: ROUNDS rounds alternating the concurrency levels given, each level
sending the same REQUESTS streaming completions (distinct prompts, temperature 0, N_GEN tokens)
from that many clients at once. Prints per level the medians over rounds: total decode tok/s,
time to first token p50/p99, time per token p50/p99, and expertd bytes read per generated token
(from /metrics). Standard library only (http.client), so the clients cost little CPU.
--no-metrics: a server without expertd's counters (llama.cpp's); tokens are counted from the
stream's text chunks when the server sends no usage.

  serve_load.py URL --levels 1,4,8 --requests 8 --n-gen 32 --rounds 3 [--json] [--no-metrics]
"""
import argparse
import http.client
import json
import re
import statistics
import threading
import time
import urllib.parse
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--levels", default="1,4,8")
ap.add_argument("--requests", type=int, default=8)
ap.add_argument("--n-gen", type=int, default=32)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--json", action="store_true")
ap.add_argument("--no-metrics", action="store_true")
a = ap.parse_args()
u = urllib.parse.urlparse(a.url)
PROMPTS = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the",
           "And it came to pass", "Thus saith the LORD", "For God so loved", "Let there be",
           "Hear, O Israel", "Remember the sabbath", "Honour thy father", "Thou shalt not",
           "Vanity of vanities", "The heavens declare", "Praise ye the LORD", "Unto thee"]


def metric(name):
    if a.no_metrics:
        return 0.0
    text = urllib.request.urlopen(a.url + "/metrics", timeout=60).read().decode()
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def one(prompt, out):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": prompt, "max_tokens": a.n_gen, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}, "stop": []})
    t0 = time.time()
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    times, n = [], 0
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        j = json.loads(line[6:])
        if j.get("choices") and j["choices"][0].get("text"):
            times.append(time.time())
        if j.get("usage"):
            n = j["usage"]["completion_tokens"]
    c.close()
    out.append({"t0": t0, "times": times, "n": n or len(times)})


def level(conc):
    results, lock = [], threading.Lock()
    todo = list(PROMPTS[: a.requests])
    read0 = metric("expertd_pack_read_bytes_total")

    def client():
        while True:
            with lock:
                if not todo:
                    return
                p = todo.pop(0)
            one(p, results)
    t0 = time.time()
    ts = [threading.Thread(target=client) for _ in range(conc)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    wall = time.time() - t0
    read = metric("expertd_pack_read_bytes_total") - read0
    toks = sum(r["n"] for r in results)
    ttft = sorted(r["times"][0] - r["t0"] for r in results if r["times"])
    gaps = sorted(g for r in results for g in
                  [(r["times"][i] - r["times"][i - 1]) for i in range(1, len(r["times"]))])
    pct = lambda v, q: v[min(len(v) - 1, int(q * len(v)))] if v else 0.0
    return {"tok_s": toks / wall, "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "tpot_p50": pct(gaps, 0.5), "tpot_p99": pct(gaps, 0.99),
            "bytes_per_token": read / max(toks, 1), "tokens": toks}


levels = [int(x) for x in a.levels.split(",")]
runs = {c: [] for c in levels}
for rnd in range(a.rounds):
    for c in (levels if rnd % 2 == 0 else levels[::-1]):
        runs[c].append(level(c))
med = {c: {k: statistics.median(r[k] for r in runs[c]) for k in runs[c][0]} for c in levels}
if a.json:
    print(json.dumps({"levels": med, "runs": runs}))
else:
    base = med[levels[0]]["tok_s"]
    for c in levels:
        m = med[c]
        print(f"{c} concurrent: {m['tok_s']:.2f} tok/s ({m['tok_s'] / base:.2f}x of {levels[0]}), "
              f"TTFT p50 {m['ttft_p50']:.2f} s p99 {m['ttft_p99']:.2f} s, per token p50 "
              f"{m['tpot_p50'] * 1000:.0f} ms p99 {m['tpot_p99'] * 1000:.0f} ms"
              + ("" if a.no_metrics else f", {m['bytes_per_token'] / 2**20:.1f} MiB read per token")
              + f"; {m['tokens']:.0f} tokens")
