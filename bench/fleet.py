#!/usr/bin/env python3
"""One run of bench/fleet.sh: K conversations of T turns at once against URL (a gateway or one
expert-serve), each turn re-sending its whole history plus a new question, streamed. Prints one
JSON line: the aggregate decode rate (completion tokens of all turns / the run's wall time), the
median time to first token of the last turn, and the prefix-hit rate (from turn 2: cached prompt
tokens / prompt tokens, from the servers' usage.prompt_tokens_details.cached_tokens)."""
import argparse
import json
import random
import statistics
import threading
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--conversations", type=int, default=6)
ap.add_argument("--turns", type=int, default=4)
ap.add_argument("--max-tokens", type=int, default=32)
ap.add_argument("--first-words", type=int, default=150)
ap.add_argument("--words", required=True, help="a word list (the first turn's text is drawn from it)")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--label", default="")
args = ap.parse_args()

words = open(args.words).read().split()


def turn(messages):
    """One streamed chat turn: (reply, time to first token s, usage)."""
    body = {"model": "kjv", "messages": messages, "max_tokens": args.max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(args.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    ttft, reply, usage = None, "", {}
    try:
        r = urllib.request.urlopen(req, timeout=600)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"{args.url}: HTTP {e.code}: {e.read().decode()[:500]}")
    with r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            for c in ev.get("choices") or []:
                text = (c.get("delta") or {}).get("content") or ""
                if text and ttft is None:
                    ttft = time.time() - t0
                reply += text
            usage = ev.get("usage") or usage
    return reply, (ttft if ttft is not None else time.time() - t0), usage


results = []  # (turn, ttft, usage)
lock = threading.Lock()


def conversation(k):
    rng = random.Random(args.seed * 1000 + k)
    messages = [{"role": "user", "content": " ".join(rng.choice(words) for _ in range(args.first_words))
                 + ". Go on with it."}]
    for t in range(1, args.turns + 1):
        reply, ttft, usage = turn(messages)
        with lock:
            results.append((t, ttft, usage))
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"Turn {t + 1}: go on."}]


t0 = time.time()
threads = [threading.Thread(target=conversation, args=(k,)) for k in range(args.conversations)]
[t.start() for t in threads]
[t.join() for t in threads]
wall = time.time() - t0
completion = sum(u.get("completion_tokens", 0) for _, _, u in results)
later = [u for t, _, u in results if t > 1]
prompt = sum(u.get("prompt_tokens", 0) for u in later)
cached = sum(((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0) for u in later)
print(json.dumps({"label": args.label, "requests": len(results), "wall_s": round(wall, 3),
                  "decode_tok_s": round(completion / wall, 2),
                  "ttft_last_ms": round(1000 * statistics.median(x for t, x, _ in results if t == args.turns), 1),
                  "prefix_hit": round(cached / prompt, 3) if prompt else 0.0}), flush=True)
