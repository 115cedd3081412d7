#!/usr/bin/env python3
"""expert-serve as a worker behind a gateway (docs/fleet.md), against real servers on loopback with
the bundled model's pack served by a real expertd: /health 200 when ready; /server_info,
/model_info and /get_load in SGLang's shapes; the vLLM- and SGLang-named gauges in /metrics moving
with a running and a waiting request; unknown JSON fields (those gateways add) ignored; and
SIGTERM draining: the running stream completes, /health and new requests answer 503 (the latter
with Retry-After), the process exits 0, within --drain-timeout-s (a second signal: at once), in
one process and with --workers 2 (the signal sent to its whole process group, as systemd stops a
unit: the engine processes go with it). Plain urllib and http.client: no venv.

Usage: fleet_test.py --bin BUILD_DIR --source SOURCE_DIR
"""
import argparse
import http.client as httpclient
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import check, failures  # noqa: E402
import serve_util  # noqa: E402

B = os.path.abspath(args.bin)
MODEL = os.path.join(os.path.abspath(args.source), "model", "kjv-moe-q8_0.gguf")
tmp = tempfile.mkdtemp(prefix="fleet-test-", dir=B)
procs = []
# A reply this long runs for seconds (a few hundred tokens a second on one thread, fewer on a
# shared machine): long enough to signal, probe and refuse beside it.
LONG = 2500
CTX = 4096
# The drain's bound in the drain cases: generous, since the reply's own time depends on the
# machine's load; the "bound" case proves the cut with a short one.
DRAIN_S = 60


def http(url, body=None, method=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def gauges(url):
    """Every unlabelled-or-labelled series' value in one /metrics scrape, by its name."""
    _, text, _ = http(url + "/metrics")
    return {m.group(1): float(m.group(3))
            for m in re.finditer(r"^([a-z_:]+)(\{[^}]*\})? (\S+)$", text, re.M)}


def gauge(url, name):
    return gauges(url).get(name)


def start_expertd(sock, manifest):
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


class Stream:
    """A streamed completion read on a thread of its own, chunk by chunk."""

    def __init__(self, url, prompt, max_tokens):
        host, port = url.split("//")[1].split(":")
        self.conn = httpclient.HTTPConnection(host, int(port), timeout=120)
        self.body = {"model": "kjv", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                     "stream": True, "stream_options": {"include_usage": True}}
        self.status, self.chunks, self.done, self.error = None, [], False, None
        self.first = threading.Event()
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self):
        try:
            self.conn.request("POST", "/v1/completions", json.dumps(self.body),
                              {"Content-Type": "application/json"})
            r = self.conn.getresponse()
            self.status = r.status
            for line in r:
                line = line.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    self.done = True
                    break
                self.chunks.append(json.loads(line[6:]))
                self.first.set()
        except Exception as e:  # noqa: BLE001
            self.error = repr(e)
        self.first.set()

    def join(self, timeout):
        self.t.join(timeout)
        return not self.t.is_alive()

    def completion_tokens(self):
        usage = [c["usage"] for c in self.chunks if c.get("usage")]
        return usage[-1]["completion_tokens"] if usage else None

    def text(self):
        return "".join(c["choices"][0]["text"] for c in self.chunks if c.get("choices"))


def wait_for(pred, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return True
        time.sleep(0.02)
    return pred()


def drain_case(p, url, label, timeout_s, group=False):
    """SIGTERM beside a running stream: it completes, /health and new requests get 503, exit 0.
    group: to every process of its group (the engine processes of --workers too)."""
    s = Stream(url, "In the beginning", LONG)
    check(s.first.wait(30) and s.status == 200, f"{label}: a long stream runs")
    t0 = time.time()
    if group:
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)
    check(wait_for(lambda: http(url + "/health")[0] == 503, 5), f"{label}: /health 503 once draining")
    st, body, _ = http(url + "/health")
    check(st == 503 and json.loads(body)["status"] == "draining", f"{label}: /health says draining ({body})")
    st, body, hdr = http(url + "/v1/completions", {"model": "kjv", "prompt": "And God said",
                                                    "max_tokens": 4})
    check(st == 503 and hdr.get("Retry-After") == "1" and "draining" in body,
          f"{label}: a new request while draining: 503 with Retry-After ({st}, {hdr.get('Retry-After')})")
    check(p.poll() is None and not s.done, f"{label}: the server waits for the running stream")
    check(s.join(timeout_s + 10) and s.done and s.error is None and s.completion_tokens() == LONG,
          f"{label}: the running stream completes whole ({s.completion_tokens()} of {LONG} tokens, "
          f"{s.error})")
    try:
        rc = p.wait(timeout_s + 10)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.time() - t0
    check(rc == 0, f"{label}: exits 0 after the drain (rc {rc})")
    check(took < timeout_s, f"{label}: within --drain-timeout-s {timeout_s} ({took:.1f} s)")
    if group:
        def gone():
            try:
                os.killpg(p.pid, 0)
                return False
            except ProcessLookupError:
                return True
        check(wait_for(gone, 10), f"{label}: every process of the group has exited")


try:
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")],
                   check=True, capture_output=True)
    core = os.path.join(tmp, "kjv.core.gguf")
    sock = os.path.join(tmp, "d.sock")
    start_expertd(sock, os.path.join(tmp, "kjv.manifest.json"))
    common = ["--model", core, "--socket", sock, "--ctx", str(CTX), "--alias", "kjv"]

    # One engine process, one sequence: a second request waits in the queue.
    p, url = serve_util.start_serve(B, tmp, procs, common + ["--parallel", "1", "--drain-timeout-s",
                                                              str(DRAIN_S)], threads=1)
    st, body, _ = http(url + "/health")
    check(st == 200 and json.loads(body) == {"status": "ok"}, f"/health 200 when ready ({st} {body})")
    st, body, _ = http(url + "/v1/models")
    check(st == 200 and [m["id"] for m in json.loads(body)["data"]] == ["kjv"], "/v1/models lists the served id")

    # SGLang's shapes (sgl-model-gateway reads served_model_name, else model_path).
    for path in ("/server_info", "/get_server_info"):
        st, body, _ = http(url + path)
        j = json.loads(body) if st == 200 else {}
        check(st == 200 and j.get("served_model_name") == "kjv" and j.get("model_path") == core and
              j.get("dp_size") == 1 and j.get("max_running_requests") == 1 and
              j.get("context_length") == CTX and j.get("max_total_tokens") == CTX and
              j.get("draining") is False, f"{path}: {body}")
    for path in ("/model_info", "/get_model_info"):
        st, body, _ = http(url + path)
        j = json.loads(body) if st == 200 else {}
        check(st == 200 and j.get("model_path") == core and j.get("tokenizer_path") == core and
              j.get("is_generation") is True, f"{path}: {body}")
    st, body, _ = http(url + "/get_load")
    check(st == 200 and json.loads(body) == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0,
                                             "num_tokens": 0}], f"/get_load idle: {body}")
    check(http(url + "/get_load", {})[0] == 405, "/get_load: POST is 405")

    # The gauges: present, 0 when idle; the cache's shape in vllm:cache_config_info's labels.
    _, text, _ = http(url + "/metrics")
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage"):
        m = re.search(r"^" + re.escape(name) + r"\{([^}]*)\} (\S+)$", text, re.M)
        check(m is not None and 'model_name="kjv"' in m.group(1) and float(m.group(2)) == 0 and
              f"# TYPE {name} gauge" in text, f"{name} idle: a gauge of 0 for kjv")
    m = re.search(r'^vllm:cache_config_info\{([^}]*)\} 1$', text, re.M)
    check(m is not None and 'block_size="64"' in m.group(1) and
          f'num_gpu_blocks="{CTX // 64}"' in m.group(1), f"vllm:cache_config_info: {m and m.group(0)}")

    # Moving: one request running and one waiting, then none.
    a = Stream(url, "In the beginning", LONG)
    check(a.first.wait(30), "a long stream starts")
    b = Stream(url, "And God said", 8)
    check(wait_for(lambda: gauge(url, "vllm:num_requests_waiting") == 1, 5),
          "a second request waits: vllm:num_requests_waiting 1")
    g = gauges(url)  # one scrape: the KV usage moves with every token
    running, usage = g.get("vllm:num_requests_running"), g.get("vllm:kv_cache_usage_perc")
    sg = (g.get("sglang:num_running_reqs"), g.get("sglang:num_queue_reqs"), g.get("sglang:token_usage"))
    _, body, _ = http(url + "/get_load")
    load = json.loads(body)[0]
    check(running == 1, f"vllm:num_requests_running 1 while a request runs ({running})")
    check(usage is not None and 0 < usage <= 1, f"vllm:kv_cache_usage_perc in (0, 1] ({usage})")
    check(sg[0] == 1 and sg[1] == 1 and sg[2] == usage, f"sglang: names the same load ({sg})")
    check(load["num_reqs"] == 2 and load["num_waiting_reqs"] == 1 and load["num_tokens"] > 3,
          f"/get_load: one running, one waiting, their tokens ({load})")
    check(a.join(DRAIN_S) and b.join(DRAIN_S) and a.done and b.done, "both streams end")
    check(wait_for(lambda: gauge(url, "vllm:num_requests_running") == 0 and
                   gauge(url, "vllm:kv_cache_usage_perc") == 0, 5), "the gauges back to 0")

    # Unknown fields, as gateways add them: ignored, the same greedy text.
    base = {"model": "kjv", "prompt": "Blessed are the", "max_tokens": 16, "temperature": 0}
    extra = dict(base, rid="req-7", bootstrap_host="10.0.0.1", bootstrap_port=8998, bootstrap_room=42,
                 data_parallel_rank=0, lora_path=None, future_field={"nested": [1, "x"]})
    st0, b0, _ = http(url + "/v1/completions", base)
    st1, b1, _ = http(url + "/v1/completions", extra)
    t0 = json.loads(b0)["choices"][0]["text"] if st0 == 200 else None
    t1 = json.loads(b1)["choices"][0]["text"] if st1 == 200 else None
    check(st1 == 200 and t0 and t1 == t0, f"unknown fields ignored: 200, the same text ({st1})")

    drain_case(p, url, "SIGTERM", DRAIN_S)

    # The bound: a stream longer than --drain-timeout-s is cut there and the process exits 0.
    p, url = serve_util.start_serve(B, tmp, procs, common + ["--parallel", "1", "--drain-timeout-s", "0.5"],
                                    threads=1)
    s = Stream(url, "In the beginning", CTX - 8)
    check(s.first.wait(30), "bound: a stream runs")
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(15)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.time() - t0
    s.join(15)
    check(rc == 0 and took < 5, f"bound: exits 0 soon after --drain-timeout-s 0.5 ({rc}, {took:.1f} s)")
    check(s.completion_tokens() != CTX - 8, "bound: the longer stream was cut, not finished")

    # A second signal ends the drain at once, whatever its bound.
    p, url = serve_util.start_serve(B, tmp, procs, common + ["--parallel", "1", "--drain-timeout-s",
                                                              str(DRAIN_S)], threads=1)
    s = Stream(url, "In the beginning", CTX - 8)
    check(s.first.wait(30), "second signal: a stream runs")
    p.send_signal(signal.SIGTERM)
    check(wait_for(lambda: http(url + "/health")[0] == 503, 5), "second signal: draining")
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(15)
    except subprocess.TimeoutExpired:
        rc = None
    took = time.time() - t0
    s.join(15)
    check(rc == 0 and took < 5 and s.completion_tokens() != CTX - 8,
          f"second signal: exits 0 at once, the stream cut ({rc}, {took:.1f} s)")

    # --workers 2: the engine processes keep generating while the HTTP process drains.
    p, url = serve_util.start_serve(B, tmp, procs, common + ["--workers", "2", "--parallel", "2",
                                                              "--drain-timeout-s", str(DRAIN_S)], threads=1,
                                    new_session=True)
    check(wait_for(lambda: http(url + "/health")[0] == 200, 30), "--workers 2: /health 200 when ready")
    _, body, _ = http(url + "/server_info")
    check(json.loads(body).get("max_running_requests") == 4, f"--workers 2: 4 sequences in all ({body})")
    s = Stream(url, "In the beginning", LONG)
    check(s.first.wait(30) and wait_for(lambda: gauge(url, "vllm:num_requests_running") == 1, 5),
          "--workers 2: vllm:num_requests_running 1 while a request runs")
    check((gauge(url, "vllm:kv_cache_usage_perc") or 0) > 0, "--workers 2: KV usage above 0")
    check(s.join(DRAIN_S) and s.done, "--workers 2: the stream ends")
    drain_case(p, url, "--workers 2: SIGTERM to the process group", DRAIN_S, group=True)
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    if not failures:
        shutil.rmtree(tmp, ignore_errors=True)

if failures:
    print(f"{len(failures)} check(s) failed", flush=True)
    sys.exit(1)
print("fleet_test: all checks passed", flush=True)
