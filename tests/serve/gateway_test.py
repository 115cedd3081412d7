#!/usr/bin/env python3
"""The real SGLang Model Gateway (`smg` from PyPI's sglang-router, pinned, in a venv this test makes
under the build directory) in front of two expert-serve workers on one expertd, its cache-aware
policy on: the gateway's /v1/models lists the served id (read from the workers' /server_info); a
conversation re-sent through it resumes its prefix on turn 2 (cached_tokens > 0); and a rolling
restart loses no request: SIGTERM to the worker serving a stream, the gateway's health checks
take it out of rotation while the stream completes, and requests sent through the gateway from
the signal on are all answered (those reaching the draining worker first get its 503 and are
retried by the gateway; how many is printed, not asserted: it depends on timing).

Exits 77 (ctest SKIP) when the gateway cannot be installed here (no PyPI, no wheel for the
platform); any other failure is a failure.

Usage: gateway_test.py --bin BUILD_DIR --source SOURCE_DIR
"""
import argparse
import json
import os
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
args = ap.parse_args()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import cached, check, failures, free_port, http, wait_for  # noqa: E402
import serve_util  # noqa: E402

B = os.path.abspath(args.bin)
SRC = os.path.abspath(args.source)
MODEL = os.path.join(SRC, "model", "kjv-moe-q8_0.gguf")
QWEN3 = os.path.join(SRC, "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")
# The gateway's version the test was written against (its CLI and discovery move).
GATEWAY = "sglang-router==0.3.2"
VENV = os.path.join(B, "gateway-venv-sglang-router0.3.2")


smg = serve_util.install_venv_package(VENV, GATEWAY, "smg")
tmp = tempfile.mkdtemp(prefix="gateway-test-", dir=B)
procs = []
try:
    # Two workers on one expertd, as the setup.
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")],
                   check=True, capture_output=True)
    core = os.path.join(tmp, "kjv.core.gguf")
    sock = os.path.join(tmp, "d.sock")
    conf = sock + ".conf"
    open(conf, "w").write("# flags only\n")
    procs.append(subprocess.Popen([os.path.join(B, "daemon", "expertd"), "--manifest",
                                   os.path.join(tmp, "kjv.manifest.json"), "--socket", sock, "--config",
                                   conf, "--lock-memory", "false", "--reserve-mib", "64", "--cache-slots",
                                   "64"], stdout=open(sock + ".log", "w"), stderr=subprocess.STDOUT))
    check(wait_for(lambda: os.path.exists(sock), 20), "expertd up")
    worker_args = ["--model", core, "--socket", sock, "--parallel", "2", "--ctx", "4096", "--alias", "kjv",
                   "--chat-template", QWEN3, "--drain-timeout-s", "60"]
    workers = [serve_util.start_serve(B, tmp, procs, worker_args, threads=1) for _ in range(2)]

    port = free_port()
    gw = f"http://127.0.0.1:{port}"
    log = os.path.join(tmp, "smg.log")
    procs.append(subprocess.Popen([smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls"]
                                  + [u for _, u in workers]
                                  + ["--policy", "cache_aware", "--prometheus-host", "127.0.0.1",
                                     "--prometheus-port", str(free_port()), "--health-check-interval-secs", "1",
                                     "--health-failure-threshold", "1", "--log-level", "warn"],
                                  stdout=open(log, "w"), stderr=subprocess.STDOUT))

    def models():
        st, body, _ = http(gw + "/v1/models", timeout=5)
        return [m["id"] for m in json.loads(body)["data"]] if st == 200 else None

    check(wait_for(lambda: models() == ["kjv"], 60),
          f"the gateway's /v1/models lists the served id ({models()})")

    # A conversation, turn 2 re-sending turn 1: the gateway keeps it on the worker holding the
    # prefix, which resumes it.
    text = " ".join(["In the beginning God created the heaven and the earth."] * 12)
    msgs = [{"role": "user", "content": "Read this and go on with it: " + text}]
    body = {"model": "kjv", "messages": msgs, "max_tokens": 24, "temperature": 0}
    st, b1, _ = http(gw + "/v1/chat/completions", body)
    r1 = json.loads(b1) if st == 200 else {}
    check(st == 200 and r1.get("usage", {}).get("prompt_tokens", 0) > 64,
          f"turn 1 through the gateway: 200 ({st}, {r1.get('usage')})")
    reply = r1["choices"][0]["message"]["content"] if r1 else ""
    msgs2 = msgs + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Go on."}]
    st, b2, _ = http(gw + "/v1/chat/completions", dict(body, messages=msgs2))
    r2 = json.loads(b2) if st == 200 else {}
    check(st == 200 and cached(r2.get("usage")) >= 64,
          f"turn 2 through the gateway resumes turn 1's prefix (cached_tokens {cached(r2.get('usage'))})")

    # A rolling restart: SIGTERM to the worker serving a stream. The stream completes; requests
    # sent through the gateway meanwhile are all answered; the worker exits 0.
    host, wport = workers[0][1].split("//")[1].split(":")
    import http.client as httpclient
    conn = httpclient.HTTPConnection(host, int(wport), timeout=120)
    conn.request("POST", "/v1/completions", json.dumps({"model": "kjv", "prompt": "In the beginning",
                                                        "max_tokens": 3500, "temperature": 0,
                                                        "stream": True}),
                 {"Content-Type": "application/json"})
    resp = conn.getresponse()
    first = resp.readline()
    check(resp.status == 200 and first.startswith(b"data: "), "a long stream runs on worker 1")
    workers[0][0].send_signal(signal.SIGTERM)
    # Requests through the gateway from the signal on: before its health check has seen the
    # drain, some reach the draining worker (503, Retry-After) and the gateway retries them.
    answered = []

    def client(i):
        st, b, _ = http(gw + "/v1/completions", {"model": "kjv", "prompt": f"And God said {i}",
                                                  "max_tokens": 8, "temperature": 0})
        answered.append(st)
    ts = []
    for i in range(8):
        ts.append(threading.Thread(target=client, args=(i,)))
        ts[-1].start()
        time.sleep(0.1)

    def out_of_rotation():  # the gateway's view: its health checks see /health 503
        st, b, _ = http(gw + "/workers", timeout=5)
        ws = json.loads(b).get("workers", []) if st == 200 else []
        return any(w.get("url") == workers[0][1] and w.get("is_healthy") is False for w in ws)
    check(wait_for(out_of_rotation, 10) and workers[0][0].poll() is None,
          "the gateway takes the draining worker out of rotation while it still serves its stream")
    _, wm, _ = http(workers[0][1] + "/metrics", timeout=5)
    refused = sum(int(float(v)) for v in re.findall(
        r'^expert_serve_requests_total\{endpoint="completions",status="503"\} (\S+)$', wm, re.M))
    print(f"requests the draining worker answered 503 (the gateway retried them): {refused}")
    [t.join(120) for t in ts]
    rest = resp.read().decode()
    check(answered.count(200) == 8, f"requests through the gateway during the drain: all answered ({answered})")
    check(rest.rstrip().endswith("data: [DONE]"), "the stream on the draining worker completes")
    try:
        rc = workers[0][0].wait(60)
    except subprocess.TimeoutExpired:
        rc = None
    check(rc == 0, f"the drained worker exits 0 ({rc})")
    check(wait_for(lambda: models() == ["kjv"], 10), "the gateway still serves kjv with one worker")
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    if not failures:
        shutil.rmtree(tmp, ignore_errors=True)

if failures:
    print(f"{len(failures)} check(s) failed (logs in {tmp})", flush=True)
    sys.exit(1)
print("gateway_test: all checks passed", flush=True)
