#!/usr/bin/env python3
"""bench/web.sh's rounds: decode tok/s of one streamed generation with the dashboard closed, read
by one event-stream client, and open in headless Chromium; medians and ratios. Prints figures,
asserts nothing."""
import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--rounds", type=int, default=7)
ap.add_argument("--max-tokens", type=int, default=2000)
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--slots", type=int, default=128)
ap.add_argument("--chromium", default="/usr/bin/chromium")
args = ap.parse_args()
B = os.path.abspath(args.bin)
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
tmp = tempfile.mkdtemp(prefix="web-bench-")
procs = []


def start(cmd, log):
    p = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    procs.append(p)
    return p


def decode_rate(url):
    """Tokens per second from the first streamed token to the last (prefill left out)."""
    body = json.dumps({"prompt": "And God said", "max_tokens": args.max_tokens, "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    first = last = None
    n = 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: {"):
                continue
            now = time.perf_counter()
            first = first or now
            last = now
            n += 1
    # Chunks carry about one token each; the usage is not streamed for completions, so count
    # the server's tokens instead.
    return first, last


def generated(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    return float(re.search(r"^expert_serve_generated_tokens_total (\S+)$", text, re.M).group(1))


class EventReader:
    """One reader of /dashboard/events, as the page reads it (without the browser)."""

    def __init__(self, url):
        self.r = urllib.request.urlopen(url + "/dashboard/events", timeout=30)
        self.stop = False
        self.n = 0
        self.t = threading.Thread(target=self.loop)
        self.t.start()

    def loop(self):
        while not self.stop:
            if self.r.readline().startswith(b"data: "):
                self.n += 1

    def close(self):
        self.stop = True
        self.t.join()
        self.r.close()


try:
    shutil.copy(os.path.join(SRC, "model", "kjv-moe-q8_0.gguf"), os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")], check=True)
    sock = os.path.join(tmp, "d.sock")
    open(sock + ".conf", "w").write("# flags only\n")
    start([os.path.join(B, "daemon", "expertd"), "--manifest", os.path.join(tmp, "kjv.manifest.json"), "--socket",
           sock, "--config", sock + ".conf", "--lock-memory", "false", "--reserve-mib", "64", "--cache-slots", str(args.slots)],
          os.path.join(tmp, "expertd.log"))
    for _ in range(500):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            break
        except OSError:
            time.sleep(0.02)
    log = os.path.join(tmp, "serve.log")
    start([os.path.join(B, "serve", "expert-serve"), "--model", os.path.join(tmp, "kjv.core.gguf"), "--socket", sock,
           "--port", "0", "--threads", str(args.threads), "--ctx", str(args.max_tokens + 64), "--parallel", "1"], log)
    url = None
    for _ in range(500):
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", open(log).read())
        if m:
            url = f"http://127.0.0.1:{m.group(1)}"
            break
        time.sleep(0.02)
    time.sleep(0.5)
    from playwright.sync_api import sync_playwright

    rates = {"closed": [], "stream": [], "page": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        decode_rate(url)  # a first generation warms the cache and the prefix index
        modes = ["closed", "stream", "page"]
        for i in range(args.rounds):
            for mode in modes[i % 3:] + modes[:i % 3]:  # each round begins with the next setup
                reader = page = None
                if mode == "stream":
                    reader = EventReader(url)
                elif mode == "page":
                    page = browser.new_page(viewport={"width": 1280, "height": 800})
                    page.goto(url + "/#dashboard")
                    page.wait_for_selector("#heat[data-ticks='2']", timeout=15000)
                g0 = generated(url)
                first, last = decode_rate(url)
                n = generated(url) - g0
                rate = (n - 1) / (last - first) if last > first else 0.0
                if reader:
                    reader.close()
                if page:
                    ticks = page.eval_on_selector("#heat", "e => e.dataset.ticks")
                    page.close()
                rates[mode].append(rate)
                print(f"round {i + 1} {mode:6s}: {rate:8.1f} tok/s ({n:.0f} tokens in {last - first:.2f} s)"
                      + (f", the page drew {ticks} snapshots" if page else ""), flush=True)
        browser.close()
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"\nmedians over {args.rounds} rounds ({args.max_tokens} tokens each, expert-serve --threads "
          f"{args.threads}, expertd --cache-slots {args.slots} of the 128 experts):")
    for k in ("closed", "stream", "page"):
        # Also the median of each round's own ratio: a round's three runs are close in time, so
        # the machine's drift (other processes, frequency) cancels more there than across rounds.
        paired = statistics.median(v / c for v, c in zip(rates[k], rates["closed"]))
        print(f"  dashboard {k:6s}: {med[k]:8.1f} tok/s  ({med[k] / med['closed']:.3f} of closed; "
              f"median of the rounds' ratios {paired:.3f})")
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait()
    shutil.rmtree(tmp, ignore_errors=True)
