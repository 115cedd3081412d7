#!/usr/bin/env python3
"""Three expert-serve workers on one expertd behind a real gateway installed from PyPI (pinned, in
a venv under the build directory): SGLang Model Gateway (`smg`, sglang-router) or vllm-router,
each with its cache-aware policy. Loopback only.

1. Conversations: K conversations x T turns, each turn re-sending its whole history, half of them
   streamed. From turn 2 every turn's usage.prompt_tokens_details.cached_tokens is >= 0.9 of the
   previous turn's prompt_tokens (the gateway kept the conversation on the worker holding its
   prefix), and every worker served at least one conversation (which one served a request is read
   from the workers' own request counters in /metrics: turn 1 of every conversation is sent at
   once, as conversations arrive, the later turns one at a time).
2. A worker killed (SIGKILL) under a steady load of concurrent requests: every request through the
   gateway is answered 200 (the gateway retries what met the dead worker); restarted on the same
   port, the gateway serves through it again (its counters move).
3. A rolling restart of every worker (SIGTERM drain, restart on the same port, /health 200 and
   healthy in the gateway, next) under a steady load, streamed and not: every request answered
   200, every stream complete.

Behind vllm-router (0.1.17) ctest runs it with --api chat-session --policy consistent_hash: its
cache_aware kept no conversation on expert-serve workers (every later turn went to the least
loaded worker, cached_tokens 0; its log says "Prefix input preparation unavailable ...
render_unavailable": it found no tokenizer for the served id), so there the conversations carry
an X-Session-ID header that its consistent_hash routes by (docs/fleet.md).

Exits 77 (ctest SKIP) only when the gateway cannot be installed here; any other failure fails.

Usage: fleet_gateways_test.py --bin BUILD_DIR --source SOURCE_DIR --gateway smg|vllm-router
         [--api chat|completions|chat-session] [--policy NAME] [--conversations K] [--turns T]
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
ap.add_argument("--gateway", choices=["smg", "vllm-router"], required=True)
ap.add_argument("--conversations", type=int, default=6)
ap.add_argument("--turns", type=int, default=3)
ap.add_argument("--policy", default="cache_aware")
ap.add_argument("--api", choices=["chat", "completions", "chat-session"], default="chat",
                help="the conversations' endpoint; chat-session: chat with an X-Session-ID header")
args = ap.parse_args()
# vllm-router 0.1.17 routes a chat request by an empty text (ChatCompletionRequest's
# extract_text_for_routing in its src/protocols/spec.rs returns "" unless the request carries
# input_ids), so under cache_aware every chat turn goes to the least loaded worker, whichever
# holds the conversation; a completion is routed by its prompt.
API = args.api

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util  # noqa: E402
from serve_util import cached, check, failures, free_port, http, wait_for  # noqa: E402

B = os.path.abspath(args.bin)
SRC = os.path.abspath(args.source)
MODEL = os.path.join(SRC, "model", "kjv-moe-q8_0.gguf")
WORDS = os.path.join(SRC, "model", "kjv-words.txt")
QWEN3 = os.path.join(SRC, "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")
# The versions the test was written against (their CLIs move). The smg venv is the one
# serve.SGLangGateway makes.
PACKAGES = {"smg": ("sglang-router==0.3.2", "gateway-venv-sglang-router0.3.2", "smg"),
            "vllm-router": ("vllm-router==0.1.17", "gateway-venv-vllm-router0.1.17", "vllm-router")}


def chat(gw, messages, stream, max_tokens=16, session=None):
    """One chat completion through the gateway: (status, reply text, usage, complete). session: sent
    as X-Session-ID."""
    body = {"model": "kjv", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    st, text, _ = http(gw + "/v1/chat/completions", body, headers={"X-Session-ID": session} if session else None)
    if st != 200:
        return st, text, {}, False
    if not stream:
        r = json.loads(text)
        return st, r["choices"][0]["message"]["content"], r.get("usage") or {}, True
    reply, usage = "", {}
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for c in ev.get("choices") or []:
            reply += (c.get("delta") or {}).get("content") or ""
        usage = ev.get("usage") or usage
    return st, reply, usage, text.rstrip().endswith("data: [DONE]")


def complete(gw, prompt, stream, max_tokens=16):
    """One text completion through the gateway: (status, text, usage, complete)."""
    body = {"model": "kjv", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    st, text, _ = http(gw + "/v1/completions", body)
    if st != 200:
        return st, text, {}, False
    if not stream:
        r = json.loads(text)
        return st, r["choices"][0]["text"], r.get("usage") or {}, True
    reply, usage = "", {}
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            ev = json.loads(line[6:])
            reply += "".join(c.get("text") or "" for c in ev.get("choices") or [])
            usage = ev.get("usage") or usage
    return st, reply, usage, text.rstrip().endswith("data: [DONE]")


class Worker:
    """expert-serve on a fixed port (so it comes back at the same URL after a restart)."""

    def __init__(self, n, tmp, argv):
        self.n, self.tmp, self.argv = n, tmp, argv
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.tmp, f"worker{self.n}.{self.starts}.log"), "w")
        self.proc = subprocess.Popen([os.path.join(B, "serve", "expert-serve"), "--port", str(self.port),
                                      "--threads", "1"] + self.argv, stdout=log, stderr=subprocess.STDOUT)
        ok = wait_for(lambda: self.proc.poll() is None and http(self.url + "/health", timeout=2)[0] == 200, 60)
        check(ok, f"worker {self.n} up on :{self.port} (start {self.starts})")

    def served(self):
        """The generations this process answered 200 (its /metrics counters)."""
        st, m, _ = http(self.url + "/metrics", timeout=5)
        if st != 200:
            return None
        return sum(int(float(v)) for e, v in re.findall(
            r'^expert_serve_requests_total\{endpoint="([^"]+)",status="200"\} (\S+)$', m, re.M)
            if "complet" in e or "chat" in e or "messages" in e)


def gateway_healthy(gw, url):
    """The gateway's own view of one worker (its /workers list), or None where it has none."""
    st, b, _ = http(gw + "/workers", timeout=5)
    if st != 200:
        return None
    try:
        ws = json.loads(b)
    except ValueError:
        return None
    ws = ws.get("workers", []) if isinstance(ws, dict) else ws
    for w in ws:
        if isinstance(w, dict) and w.get("url") == url:
            return w.get("is_healthy")
    return None


class Load:
    """Steady concurrent requests through the gateway until stopped; every answer recorded."""

    def __init__(self, gw, clients, stream_every=0):
        self.gw, self.stop_flag, self.results, self.lock = gw, False, [], threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i, stream_every)) for i in range(clients)]

    def run(self, i, stream_every):
        n = 0
        while not self.stop_flag:
            n += 1
            stream = stream_every > 0 and n % stream_every == 0
            st, text, _, complete = chat(self.gw, [{"role": "user", "content": f"Client {i} request {n}: "
                                                    "And God said, Let there be light."}], stream, max_tokens=8,
                                         session=f"load-{i}-{n}" if API == "chat-session" else None)
            with self.lock:
                self.results.append((st, complete, "" if st == 200 else text[:200]))

    def __enter__(self):
        [t.start() for t in self.threads]
        return self

    def __exit__(self, *exc):
        self.stop_flag = True
        [t.join(180) for t in self.threads]

    def summary(self):
        bad = [r for r in self.results if r[0] != 200 or not r[1]]
        return len(self.results), bad


gateway_exe = serve_util.install_venv_package(os.path.join(B, PACKAGES[args.gateway][1]),
                                           PACKAGES[args.gateway][0], PACKAGES[args.gateway][2])
tmp = tempfile.mkdtemp(prefix=f"fleet-gw-{args.gateway}-", dir=B)
procs = []
workers = []
t_start = time.time()
try:
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")],
                   check=True, capture_output=True)
    sock = os.path.join(tmp, "d.sock")
    conf = sock + ".conf"
    open(conf, "w").write("# flags only\n")
    procs.append(subprocess.Popen([os.path.join(B, "daemon", "expertd"), "--manifest",
                                   os.path.join(tmp, "kjv.manifest.json"), "--socket", sock, "--config", conf,
                                   "--lock-memory", "false", "--reserve-mib", "64", "--cache-slots", "64"],
                                  stdout=open(sock + ".log", "w"), stderr=subprocess.STDOUT))
    check(wait_for(lambda: os.path.exists(sock), 20), "expertd up")
    argv = ["--model", os.path.join(tmp, "kjv.core.gguf"), "--socket", sock, "--parallel", "2", "--ctx", "4096",
            "--alias", "kjv", "--chat-template", QWEN3, "--drain-timeout-s", "60"]
    workers = [Worker(n, tmp, argv) for n in range(3)]
    for w in workers:
        w.start()

    port = free_port()
    gw = f"http://127.0.0.1:{port}"
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls"] + [w.url for w in workers] + [
        "--policy", args.policy, "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
        "--health-check-interval-secs", "1", "--health-failure-threshold", "1", "--health-success-threshold",
        "1", "--retry-max-retries", "6", "--retry-initial-backoff-ms", "200", "--retry-max-backoff-ms", "1000",
        "--cb-timeout-duration-secs", "3",
        "--log-level", "warn" if args.gateway == "smg" else os.environ.get("VLLM_ROUTER_LOG", "warning")]
    # A killed worker's failed requests open its circuit breaker, which then keeps the worker out for
    # cb-timeout-duration-secs after it is back (vllm-router 0.1.17 left a restarted worker unused
    # for the test's 30 s under load once: its default is far longer); 3 s here.
    # The retries' backoff (200 ms growing 1.5x to 1 s, 6 tries: ~4 s) outlasts the health checks'
    # 1 s: cache_aware sends a retry back to the worker holding its prefix until the health check
    # has marked it down, so with the default backoff (50 ms, ~0.7 s in all) a request that met a
    # killed worker ran out of retries on it (a 500 "error sending request").
    cmd = [gateway_exe, "launch"] + common if args.gateway == "smg" else [gateway_exe] + common
    procs.append(subprocess.Popen(cmd, stdout=open(os.path.join(tmp, "gateway.log"), "w"),
                                  stderr=subprocess.STDOUT))

    def models():
        st, body, _ = http(gw + "/v1/models", timeout=5)
        try:
            return [m["id"] for m in json.loads(body)["data"]] if st == 200 else None
        except (ValueError, KeyError, TypeError):
            return None

    up = wait_for(lambda: models() == ["kjv"], 60)
    check(up, f"{args.gateway}: /v1/models lists the served id ({models()})")
    if not up:
        raise SystemExit(f"the gateway is not serving; its log ends:\n"
                         f"{open(os.path.join(tmp, 'gateway.log')).read()[-3000:]}")

    # 1. Conversations. Turn 1 of all of them at once: a request matching no worker's prefix goes
    # to the least loaded worker (cache_aware in both gateways), so conversations arriving one at
    # a time on an idle fleet would all go to the same one. Later turns one request at a time, so
    # each worker's counters say which served it. Each conversation's text differs from its first
    # word (the cache-aware trees match on the request's text) and is most of its prompt.
    words = open(WORDS).read().split()
    convs = []
    for k in range(args.conversations):
        rng = random.Random(k)
        first = " ".join(rng.choice(words) for _ in range(120))
        convs.append({"messages": [{"role": "user", "content": f"{first}. Go on with it."}],
                      "stream": k % 2 == 1, "workers": [], "prev_prompt": 0, "session": f"conversation-{k}"})
    def say(c):
        if API.startswith("chat"):
            return chat(gw, c["messages"], c["stream"], session=c["session"] if API == "chat-session" else None)
        return complete(gw, "".join(f"{m['role']}: {m['content']}\n" for m in c["messages"]) + "assistant:",
                        c["stream"])

    def first_turn(c):
        c["answer"] = say(c)
    ts = [threading.Thread(target=first_turn, args=(c,)) for c in convs]
    [t.start() for t in ts]
    [t.join(180) for t in ts]
    for t in range(1, args.turns + 1):
        for k, c in enumerate(convs):
            if t == 1:
                st, reply, usage, done = c["answer"]
            else:
                before = [w.served() for w in workers]
                st, reply, usage, done = say(c)
                # A stream's counter moves when its handler returns, which may be just after the
                # client has read [DONE]: wait for it (a few seconds at most).
                def moved_now():
                    after = [w.served() for w in workers]
                    return [i for i in range(3)
                            if None not in (before[i], after[i]) and after[i] > before[i]]
                wait_for(lambda: len(moved_now()) > 0, 5)
                moved = moved_now()
                check(len(moved) == 1, f"conversation {k} turn {t}: one worker served it ({moved})")
                c["workers"] += moved
            kind = "streamed" if c["stream"] else "not streamed"
            check(st == 200 and done and usage.get("prompt_tokens", 0) > 0,
                  f"conversation {k} turn {t} ({kind}, {API}): 200, complete, usage ({st}, {usage})")
            if t > 1:
                need = 0.9 * c["prev_prompt"]
                check(cached(usage) >= need, f"conversation {k} turn {t}: cached_tokens {cached(usage)} >= 0.9 x "
                      f"turn {t - 1}'s prompt {c['prev_prompt']} (prompt {usage.get('prompt_tokens')})")
            c["prev_prompt"] = usage.get("prompt_tokens", 0)
            c["messages"] = c["messages"] + [{"role": "assistant", "content": reply},
                                             {"role": "user", "content": f"Turn {t + 1}: go on."}]
    placement = [sorted(set(c["workers"])) for c in convs]
    print(f"conversations' workers: {placement}", flush=True)
    check(all(len(p) == 1 for p in placement), "each conversation stayed on one worker")
    check(set(w for p in placement for w in p) == {0, 1, 2},
          f"the conversations spread over all three workers ({placement})")
    print(f"phase 1 done at {time.time() - t_start:.0f}s", flush=True)

    # 2. SIGKILL one worker under load; then restart it on its port: the gateway serves through it.
    # The victim is a worker the load reaches: the load's requests share their first words, so a
    # cache-aware gateway may keep all of them on one worker (smg sent 1631 in 30 s to the other
    # two once, never to worker 1), which one depends on the trees phase 1 left.
    base = [w.served() or 0 for w in workers]

    def serving():
        return [w for w, b in zip(workers, base) if (w.served() or 0) >= b + 2]
    with Load(gw, clients=3) as load:
        # Killed while it serves the load (its counter moved), requests likely in flight on it.
        check(wait_for(lambda: serving(), 30),
              f"a worker serves the load before the kill ({[(w.served() or 0) - b for w, b in zip(workers, base)]}"
              " requests each)")
        victim = (serving() or [workers[1]])[0]
        print(f"killing worker {victim.n}", flush=True)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        n_kill = len(load.results)
        wait_for(lambda: gateway_healthy(gw, victim.url) is False or args.gateway != "smg", 10)
        wait_for(lambda: len(load.results) >= n_kill + 12, 60)
    total, bad = load.summary()
    check(total >= 18 and not bad, f"worker killed under load: all {total} requests through the gateway answered "
          f"200 ({len(bad)} not: {bad[:3]})")
    victim.start()
    if args.gateway == "smg":
        check(wait_for(lambda: gateway_healthy(gw, victim.url) is True, 20),
              "the gateway's health checks take the restarted worker back")
    # New conversations, a few at once (an idle fleet sends them all to one worker, above).
    sent = []

    def new_conversation(i):
        sent.append(chat(gw, [{"role": "user", "content": f"{i} " + " ".join(
            random.Random(100 + i).choice(words) for _ in range(40))}], False, max_tokens=8,
            session=f"new-{i}" if API == "chat-session" else None)[0])

    def restarted_serves():
        ts = [threading.Thread(target=new_conversation, args=(len(sent) + i,)) for i in range(6)]
        [t.start() for t in ts]
        [t.join(120) for t in ts]
        return (victim.served() or 0) > 0
    check(wait_for(restarted_serves, 30) and sent.count(200) == len(sent),
          f"the restarted worker serves through the gateway again ({len(sent)} requests sent, "
          f"{sent.count(200)} answered 200; its counter {victim.served()})")
    print(f"phase 2 done at {time.time() - t_start:.0f}s", flush=True)

    # 3. Rolling restart of every worker under load, every third request streamed.
    with Load(gw, clients=3, stream_every=3) as load:
        wait_for(lambda: len(load.results) >= 3, 60)
        for w in workers:
            w.proc.send_signal(signal.SIGTERM)
            try:
                rc = w.proc.wait(90)
            except subprocess.TimeoutExpired:
                rc = None
            check(rc == 0, f"rolling restart: worker {w.n} drained and exited 0 ({rc})")
            w.start()
            if args.gateway == "smg":
                check(wait_for(lambda: gateway_healthy(gw, w.url) is True, 20),
                      f"rolling restart: the gateway takes worker {w.n} back")
            else:
                time.sleep(2)  # two of its 1 s health checks
            n = len(load.results)
            wait_for(lambda: len(load.results) >= n + 3, 60)
    total, bad = load.summary()
    check(total >= 12 and not bad, f"rolling restart under load: all {total} requests answered 200 and complete "
          f"({len(bad)} not: {bad[:3]})")
    print(f"phase 3 done at {time.time() - t_start:.0f}s", flush=True)
finally:
    for p in procs + [w.proc for w in workers if w.proc]:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    if not failures:
        shutil.rmtree(tmp, ignore_errors=True)

if failures:
    print(f"{len(failures)} check(s) failed (logs in {tmp})", flush=True)
    sys.exit(1)
print(f"fleet_gateways_test ({args.gateway}): all checks passed in {time.time() - t_start:.0f}s", flush=True)
