#!/usr/bin/env python3
"""expert-serve against the official `openai` and `anthropic` Python clients (pip, in a venv this
test creates under the build directory), with a real expertd serving the bundled model's pack:
greedy text equal to `expert-run generate --temp 0`, streaming and not, usage, stop sequences,
eight concurrent requests each equal to its run alone, chat through a template, Anthropic's
messages, bad input of every kind, a client that leaves mid-stream, a full queue, and expertd
going away and coming back, and --workers 2 (two engine processes on one expertd).

Usage: serve_test.py --bin BUILD_DIR --source SOURCE_DIR
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()

from serve_util import check, failures, in_client_venv  # noqa: E402
import serve_util  # noqa: E402

in_client_venv(args.bin)

import anthropic  # noqa: E402
import openai  # noqa: E402

B = args.bin
MODEL = os.path.join(args.source, "model", "kjv-moe-q8_0.gguf")
QWEN3 = os.path.join(args.source, "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")
KEY = "sekrit"
tmp = tempfile.mkdtemp(prefix="serve-test-", dir=B)
procs = []


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def start_expertd(sock):
    conf = sock + ".conf"
    open(conf, "w").write("# flags only\n")
    log = open(sock + ".log", "w")
    p = subprocess.Popen([os.path.join(B, "daemon", "expertd"), "--manifest", manifest,
                          "--socket", sock, "--config", conf, "--lock-memory", "false",
                          "--reserve-mib", "64", "--cache-slots", "64"], stdout=log, stderr=log)
    procs.append(p)
    for _ in range(500):
        if os.path.exists(sock):
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(sock)
                s.close()
                return p
            except OSError:
                pass
        time.sleep(0.02)
    raise RuntimeError("expertd did not start: " + open(sock + ".log").read())


def start_serve(extra):
    return serve_util.start_serve(B, tmp, procs, extra)


def http(url, body=None, headers=None, method=None):
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def metric(url, name):
    _, text, _ = http(url + "/metrics")
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def expert_run(prompt, n, chat=False):
    cmd = [os.path.join(B, "engine", "expert-run"), "generate", "--model", MODEL, "--local",
           "--prompt", prompt, "-n", str(n), "--temp", "0", "--threads", "2"]
    if chat:
        cmd += ["--chat", "--chat-template", QWEN3]
    return run(cmd)[:-1]  # its trailing newline


try:
    # The bundled model's pack, served by a real expertd.
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")])
    core = os.path.join(tmp, "kjv.core.gguf")
    manifest = os.path.join(tmp, "kjv.manifest.json")
    sock = os.path.join(tmp, "d.sock")
    daemon = start_expertd(sock)
    serve, url = start_serve(["--model", core, "--socket", sock, "--parallel", "8", "--ctx", "256",
                              "--api-key", KEY, "--chat-template", QWEN3, "--alias", "kjv"])
    oa = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    an = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)

    st, body, _ = http(url + "/health")
    check(st == 200 and json.loads(body)["status"] == "ok", "health is 200 once the daemon is up")
    check([m.id for m in oa.models.list().data] == ["kjv"], "/v1/models lists the model")

    # Greedy completions equal expert-run generate --temp 0.
    prompts = ["In the beginning", "And God said", "The LORD is my shepherd", "Blessed are the",
               "And it came to pass", "Thus saith the LORD", "For God so loved", "Let there be"]
    n = 24
    want = {p: expert_run(p, n) for p in prompts}
    r = oa.completions.create(model="kjv", prompt=prompts[0], max_tokens=n, temperature=0)
    check(r.choices[0].text == want[prompts[0]], "greedy completion == expert-run generate --temp 0")
    check(r.choices[0].finish_reason == "length", "finish_reason length at max_tokens")
    n_prompt = len(run([os.path.join(B, "engine", "expert-run"), "tokenize", "--model", MODEL,
                        "--text", prompts[0]]).split())
    check(r.usage.prompt_tokens == n_prompt and r.usage.completion_tokens == n and
          r.usage.total_tokens == n_prompt + n, f"usage counts ({r.usage})")

    # Streaming: the deltas make the same text; usage in the last chunk when asked.
    chunks = list(oa.completions.create(model="kjv", prompt=prompts[1], max_tokens=n, temperature=0,
                                        stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    check(text == want[prompts[1]], "streamed text == expert-run's")
    check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == n,
          "stream_options.include_usage: usage in the final chunk")

    # A stop sequence ends the text before it.
    w = want[prompts[0]]
    stop = w[w.index(" ", 8):w.index(" ", 8) + 4]
    r = oa.completions.create(model="kjv", prompt=prompts[0], max_tokens=n, temperature=0, stop=[stop])
    check(r.choices[0].text == w[:w.index(stop)] and r.choices[0].finish_reason == "stop",
          f"stop sequence {stop!r} cuts the text")

    # Eight concurrent requests: each text is its run alone; the steps batched them.
    steps0, rows0 = metric(url, "expert_serve_steps_total"), metric(url, "expert_serve_batched_rows_total")
    out = {}

    def one(p):
        out[p] = oa.completions.create(model="kjv", prompt=p, max_tokens=n, temperature=0).choices[0].text
    ts = [threading.Thread(target=one, args=(p,)) for p in prompts]
    [t.start() for t in ts]
    [t.join() for t in ts]
    check(all(out[p] == want[p] for p in prompts), "8 concurrent greedy texts == each alone")
    steps = metric(url, "expert_serve_steps_total") - steps0
    rows = metric(url, "expert_serve_batched_rows_total") - rows0
    check(rows / steps > 2, f"concurrent requests were batched ({rows:.0f} rows in {steps:.0f} steps)")

    # Chat through the template; equal to expert-run --chat (thinking off).
    r = oa.chat.completions.create(model="kjv", messages=[{"role": "user", "content": "hello"}],
                                   max_tokens=n, temperature=0,
                                   extra_body={"chat_template_kwargs": {"enable_thinking": False,
                                                                        "thinking": False}})
    check(r.choices[0].message.content == expert_run("hello", n, chat=True),
          "chat completion == expert-run generate --chat")
    chunks = list(oa.chat.completions.create(model="kjv", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=8, temperature=0, stream=True))
    check(chunks[0].choices[0].delta.role == "assistant" and chunks[-1].choices[0].finish_reason,
          "chat stream: role first, finish_reason last")

    # Anthropic's messages, streaming and not.
    m = an.messages.create(model="kjv", max_tokens=n, extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": "hello"}])
    check(m.content[0].type == "text" and m.stop_reason == "max_tokens" and
          m.usage.output_tokens == n and m.usage.input_tokens > 0, "anthropic messages.create")
    with an.messages.stream(model="kjv", max_tokens=n, extra_body={"temperature": 0},
                            messages=[{"role": "user", "content": "hello"}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    check(streamed == m.content[0].text and final.stop_reason == "max_tokens",
          "anthropic stream == messages.create")
    sys_m = an.messages.create(model="kjv", max_tokens=4, extra_body={"temperature": 0}, system="Be brief.",
                               stop_sequences=["zzz"], messages=[{"role": "user", "content": "hi"}])
    check(sys_m.stop_reason in ("max_tokens", "end_turn", "stop_sequence"), "anthropic system + stop_sequences")

    # Bad input.
    st, body, _ = http(url + "/v1/completions", b"{not json", {"Authorization": "Bearer " + KEY})
    check(st == 400 and "error" in json.loads(body), "malformed JSON: 400 with an OpenAI error")
    try:
        oa.completions.create(model="kjv", prompt="word " * 400, max_tokens=4)
        check(False, "an over-long prompt is refused")
    except openai.BadRequestError as e:
        check("256" in str(e), "prompt over the context: 400 naming the limit")
    try:
        oa.completions.create(model="gpt-4", prompt="x", max_tokens=1)
        check(False, "unknown model refused")
    except openai.NotFoundError:
        check(True, "unknown model: 404")
    st, _, _ = http(url + "/v1/completions", b'{"prompt": "' + b"a" * (9 << 20) + b'"}',
                    {"Authorization": "Bearer " + KEY})
    check(st == 413, "a body over the limit: 413")
    try:
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
        check(False, "a wrong key is refused")
    except openai.AuthenticationError:
        check(True, "wrong API key: 401")
    try:
        an.messages.create(model="kjv", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}])
        check(False, "image parts refused")
    except anthropic.BadRequestError:
        check(True, "anthropic: non-text content is a 400")
    st, body, _ = http(url + "/v1/completions", {"prompt": "x", "max_tokens": -1},
                       {"Authorization": "Bearer " + KEY})
    check(st == 400 and "max_tokens" in body, "bad max_tokens: 400 naming it")

    # A client that leaves mid-stream frees its sequence at once.
    s = oa.completions.create(model="kjv", prompt=prompts[2], max_tokens=200, temperature=0, stream=True)
    next(iter(s))
    s.close()
    for _ in range(100):
        if metric(url, "expert_serve_active_sequences") == 0:
            break
        time.sleep(0.02)
    check(metric(url, "expert_serve_active_sequences") == 0, "a closed stream frees its sequence")

    # Metrics: requests, tokens, latency histograms and expertd's counters.
    _, text, _ = http(url + "/metrics")
    check("expert_serve_requests_total{endpoint=\"completions\",status=\"200\"}" in text and
          "expert_serve_time_to_first_token_seconds_bucket" in text and
          re.search(r"^expertd_cache_hits_total \d", text, re.M) is not None and
          re.search(r"^expertd_pack_read_bytes_total \d", text, re.M) is not None,
          "/metrics: requests, latency histograms and expertd's counters")

    # A full queue: 503 with Retry-After.
    serve2, url2 = start_serve(["--model", MODEL, "--local", "--parallel", "1", "--queue-max", "1",
                                "--ctx", "256"])
    codes = []

    def slow():
        st, body, _ = http(url2 + "/v1/completions", {"prompt": "And", "max_tokens": 120})
        codes.append(st)
        if st not in (200, 503):
            print(f"unexpected {st}: {body}")
    ts = [threading.Thread(target=slow) for _ in range(4)]
    [t.start() for t in ts]
    time.sleep(0.3)
    st, _, hdr = http(url2 + "/v1/completions", {"prompt": "And", "max_tokens": 1})
    [t.join() for t in ts]
    codes.append(st)
    check(503 in codes and 200 in codes and set(codes) <= {200, 503},
          f"beyond --queue-max: 503 ({codes})")
    st, body, _ = http(url2 + "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    check(st == 400 and "/v1/completions" in body, "no chat template: 400 saying use /v1/completions")

    # expertd going away: the open stream gets an error, new requests 503, then it comes back.
    s = oa.completions.create(model="kjv", prompt=prompts[3], max_tokens=200, temperature=0, stream=True)
    it = iter(s)
    next(it)
    daemon.kill()
    daemon.wait()
    try:
        for _ in it:
            pass
        check(False, "an open stream reports the daemon's loss")
    except openai.APIError as e:
        check("generation failed" in str(e), "open stream: a clear error when expertd goes away")
    time.sleep(0.3)
    st, _, _ = http(url + "/health")
    check(st == 503, "health is 503 without the daemon")
    try:
        oa.completions.create(model="kjv", prompt="x", max_tokens=1)
        check(False, "new requests refused without the daemon")
    except openai.APIStatusError as e:
        check(e.status_code == 503, "new requests: 503 without the daemon")
    daemon = start_expertd(sock)
    for _ in range(100):
        if http(url + "/health")[0] == 200:
            break
        time.sleep(0.1)
    r = oa.completions.create(model="kjv", prompt=prompts[0], max_tokens=n, temperature=0)
    check(r.choices[0].text == want[prompts[0]], "expertd back: serving again, same text")

    # --workers 2: two engine processes on the one expertd; texts as alone; a worker killed is
    # replaced and its requests end with an error, the other worker's go on.
    serve3, url3 = start_serve(["--model", core, "--socket", sock, "--workers", "2", "--parallel", "4",
                                "--ctx", "256", "--alias", "kjv"])
    def kids():  # the engine processes (children of any of the server's threads), running
        out = []
        for t in os.listdir(f"/proc/{serve3.pid}/task"):
            try:
                for c in open(f"/proc/{serve3.pid}/task/{t}/children").read().split():
                    if open(f"/proc/{c}/stat").read().split(") ")[1][0] != "Z":
                        out.append(int(c))
            except FileNotFoundError:  # a thread or child that just ended
                pass
        return out
    check(len(kids()) == 2, "--workers 2: two engine processes")
    oa3 = openai.OpenAI(base_url=url3 + "/v1", api_key="none", max_retries=0)
    for _ in range(100):
        if http(url3 + "/health")[0] == 200:
            break
        time.sleep(0.05)
    out = {}

    def one3(p):
        out[p] = oa3.completions.create(model="kjv", prompt=p, max_tokens=n, temperature=0).choices[0].text
    ts = [threading.Thread(target=one3, args=(p,)) for p in prompts]
    [t.start() for t in ts]
    [t.join() for t in ts]
    check(all(out[p] == want[p] for p in prompts), "--workers 2: 8 concurrent greedy texts == each alone")
    _, text, _ = http(url3 + "/metrics")
    gen = re.search(r"^expert_serve_generated_tokens_total (\S+)$", text, re.M)
    check(gen is not None and float(gen.group(1)) >= 8 * n and
          re.search(r"^expertd_cache_hits_total \d", text, re.M) is not None,
          "--workers 2: /metrics sums the workers' tokens, with expertd's counters")
    victim = kids()[0]
    os.kill(victim, signal.SIGKILL)
    for _ in range(100):
        k = kids()
        if len(k) == 2 and victim not in k and http(url3 + "/health")[0] == 200:
            break
        time.sleep(0.05)
    check(len(kids()) == 2 and victim not in kids(), "a killed engine process is replaced")
    r = oa3.completions.create(model="kjv", prompt=prompts[0], max_tokens=n, temperature=0)
    check(r.choices[0].text == want[prompts[0]], "after the replacement: the same text")
    _, text, _ = http(url3 + "/metrics")
    gen2 = re.search(r"^expert_serve_generated_tokens_total (\S+)$", text, re.M)
    check(gen2 is not None and float(gen2.group(1)) >= float(gen.group(1)) + r.usage.completion_tokens,
          "after the replacement: the summed token counter did not step back")
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    if not failures:
        shutil.rmtree(tmp, ignore_errors=True)

print(f"{len(failures)} failure(s)")
sys.exit(1 if failures else 0)
