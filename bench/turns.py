#!/usr/bin/env python3
"""A conversation replayed against a server: each turn sends the whole history again plus ~N new
tokens of text and streams a short reply; the figure per turn is the time to the first token.
--save-last F writes the last turn's prompt to F; --once F sends F's text once (bench/turns.sh
restarts the server between the two, its RAM tier empty, to time a resume from the SSD tier).
--seed picks the words, so that each round's conversation is new to the server.

Prints one line per turn and a JSON summary line (bench/turns.sh reads it).
Usage: bench/turns.py URL [--turns 8] [--first-words 180] [--new-words 60] [--n-gen 16] [--label NAME]
"""
import argparse
import json
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--turns", type=int, default=8)
ap.add_argument("--new-words", type=int, default=60)
ap.add_argument("--first-words", type=int, default=180)
ap.add_argument("--n-gen", type=int, default=16)
ap.add_argument("--label", default="server")
ap.add_argument("--model", default=None)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--save-last", default=None)
ap.add_argument("--once", default=None)
args = ap.parse_args()

WORDS = ("and the king said unto them go ye into the land which i give you for an inheritance "
         "and they went up by the way of the wilderness unto the mount of the lord and abode "
         "there many days").split()


def new_text(turn):
    k = turn * 7 + args.seed * 13
    n = args.first_words if turn == 0 else args.new_words
    return " ".join(WORDS[(k + i * (1 + args.seed % 5)) % len(WORDS)] for i in range(n))


def ask(prompt):
    body = {"prompt": prompt, "max_tokens": args.n_gen, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    if args.model:
        body["model"] = args.model
    req = urllib.request.Request(args.url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft, text, usage = None, "", {}
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            j = json.loads(line[6:])
            if j.get("usage"):
                usage = j["usage"]
            for c in j.get("choices", []):
                if c.get("text"):
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    text += c["text"]
    return ttft if ttft is not None else time.perf_counter() - t0, text, usage


if args.once:
    ttft, _, usage = ask(open(args.once).read())
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    print(f"{args.label}: prompt {usage.get('prompt_tokens')} tokens ({cached} cached), "
          f"time to first token {ttft:.3f} s", flush=True)
    print(json.dumps({"label": args.label, "ttft_s": ttft, "cached_tokens": cached}))
    raise SystemExit(0)

history = ""
rows = []
last = ""
for turn in range(args.turns):
    history += ("\n" if history else "") + new_text(turn)
    last = history
    ttft, reply, usage = ask(history)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    rows.append({"turn": turn + 1, "ttft_s": ttft, "prompt_tokens": usage.get("prompt_tokens"),
                 "cached_tokens": cached})
    print(f"{args.label}: turn {turn + 1}: prompt {usage.get('prompt_tokens')} tokens "
          f"({cached} cached), time to first token {ttft:.3f} s", flush=True)
    history += reply
if args.save_last:
    open(args.save_last, "w").write(last)
print(json.dumps({"label": args.label, "rows": rows}))
