#!/usr/bin/env python3
"""The cost of constrained decoding per step: expert-serve (--local, the bundled model, Qwen3's
template) decodes the same chat request free and under a JSON-schema grammar (a string field
long enough to fill the budget), in alternating rounds; each round's figure is the time between
the first streamed text and the end, over the tokens generated after it (usage), and the result is the medians and
their ratio, beside the server's own mask timing from /metrics.

Usage: bench/grammar_bench.py --bin BUILD_DIR [--rounds 5] [--tokens 96]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--tokens", type=int, default=96)
args = ap.parse_args()
src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
log = open("/tmp/grammar_bench_serve.log", "w")
p = subprocess.Popen([os.path.join(args.bin, "serve", "expert-serve"), "--local", "--port", "0",
                      "--threads", "2", "--parallel", "1", "--ctx", "1024", "--chat-template",
                      os.path.join(src, "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")],
                     stdout=log, stderr=subprocess.STDOUT)
try:
    url = None
    for _ in range(500):
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", open(log.name).read())
        if m:
            url = f"http://127.0.0.1:{m.group(1)}"
            break
        time.sleep(0.02)
    time.sleep(0.5)
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

    def per_token(constrained):
        body = {"messages": [{"role": "user", "content": "Tell me of the kings."}],
                "max_tokens": args.tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        if constrained:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}
        req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        first, tokens = None, 0
        with urllib.request.urlopen(req) as r:
            for line in r:
                if not line.startswith(b"data: {"):
                    continue
                j = json.loads(line[6:])
                if j.get("usage"):
                    tokens = j["usage"]["completion_tokens"]
                elif first is None and j["choices"] and j["choices"][0]["delta"].get("content"):
                    first = time.perf_counter()  # the prompt is done: decode from here
        end = time.perf_counter()
        return (end - first) / (tokens - 1)

    per_token(False), per_token(True)  # warm
    free, cons = [], []
    for i in range(args.rounds):
        for c in ((False, True) if i % 2 == 0 else (True, False)):
            (cons if c else free).append(per_token(c))
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    s = float(re.search(r"^expert_serve_grammar_mask_seconds_sum (\S+)$", text, re.M).group(1))
    n = float(re.search(r"^expert_serve_grammar_mask_seconds_count (\S+)$", text, re.M).group(1))
    kern = "avx512" if "avx512f" in open("/proc/cpuinfo").read() else "avx2"
    fm, cm = statistics.median(free), statistics.median(cons)
    print(f"cpu: {kern}; {args.rounds} alternating rounds of {args.tokens} tokens")
    print(f"free step        {1e3 * fm:.3f} ms (median; {', '.join(f'{1e3 * x:.3f}' for x in free)})")
    print(f"constrained step {1e3 * cm:.3f} ms (median; {', '.join(f'{1e3 * x:.3f}' for x in cons)})")
    print(f"ratio constrained/free {cm / fm:.3f}; mask itself {1e6 * s / n:.1f} us per step (/metrics)")
finally:
    p.terminate()
    p.wait()
