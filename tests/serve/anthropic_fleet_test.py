#!/usr/bin/env python3
"""Anthropic clients in front of a fleet (docs/fleet.md "Anthropic clients"), measured with the
official `anthropic` client against two real workers on one real expertd.

--proxy smg: the SGLang Model Gateway (sglang-router, pinned, a venv under the build directory)
  has no Messages route: POST /v1/messages through it is 404 (its fallback), while the same
  conversation through its /v1/chat/completions is routed and resumed. Skipped (77) only where the
  gateway cannot be installed.
--proxy nginx: a plain HTTP proxy (nginx, Debian's nginx-light: scripts/install-deps.sh) with
  `hash $http_x_session_id consistent`: a conversation's turns, keyed by a header the client sends,
  stay on one worker (turn 2 reads turn 1's prefix from the cache: cache_read_input_tokens), the
  sessions spread over both workers, a stream passes through whole, and a worker's drain (SIGTERM:
  503) is retried on the other (`proxy_next_upstream http_503 non_idempotent`). Skipped (77) only
  where nginx is not installed.

Usage: anthropic_fleet_test.py --bin BUILD_DIR --source SOURCE_DIR --proxy smg|nginx
"""
import argparse
import os
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
ap.add_argument("--proxy", required=True, choices=["smg", "nginx"])
args = ap.parse_args()

from serve_util import SKIP, check, failures, free_port, in_client_venv, wait_for  # noqa: E402
import serve_util  # noqa: E402

B = os.path.abspath(args.bin)
SRC = os.path.abspath(args.source)
GATEWAY = "sglang-router==0.3.2"  # as tests/serve/gateway_test.py
GW_VENV = os.path.join(B, "gateway-venv-sglang-router0.3.2")
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
if args.proxy == "nginx" and not NGINX:
    print("SKIP: nginx is not installed (Debian: apt-get install nginx-light; scripts/install-deps.sh does)")
    sys.exit(SKIP)

in_client_venv(args.bin)

import anthropic  # noqa: E402
import openai  # noqa: E402

MODEL = os.path.join(SRC, "model", "kjv-moe-q8_0.gguf")
QWEN3 = os.path.join(SRC, "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")


def up(url):
    try:
        return urllib.request.urlopen(url, timeout=2).status == 200
    except Exception:  # noqa: BLE001
        return False


TEXT = " ".join(["In the beginning God created the heaven and the earth."] * 12)
CONV = [{"role": "user", "content": "Read this and go on with it: " + TEXT}]

smg = serve_util.install_venv_package(GW_VENV, GATEWAY, "smg") if args.proxy == "smg" else None
tmp = tempfile.mkdtemp(prefix=f"anthropic-{args.proxy}-test-", dir=B)
procs = []
try:
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")],
                   check=True, capture_output=True)
    sock = os.path.join(tmp, "d.sock")
    open(sock + ".conf", "w").write("# flags only\n")
    procs.append(subprocess.Popen([os.path.join(B, "daemon", "expertd"), "--manifest",
                                   os.path.join(tmp, "kjv.manifest.json"), "--socket", sock, "--config",
                                   sock + ".conf", "--lock-memory", "false", "--reserve-mib", "64", "--cache-slots",
                                   "64"], stdout=open(sock + ".log", "w"), stderr=subprocess.STDOUT))
    check(wait_for(lambda: os.path.exists(sock), 20), "expertd up")
    worker_args = ["--model", os.path.join(tmp, "kjv.core.gguf"), "--socket", sock, "--parallel", "2", "--ctx",
                   "2048", "--alias", "kjv", "--chat-template", QWEN3, "--drain-timeout-s", "60"]
    workers = [serve_util.start_serve(B, tmp, procs, worker_args, threads=1) for _ in range(2)]
    port = free_port()
    gw = f"http://127.0.0.1:{port}"

    if args.proxy == "smg":
        procs.append(subprocess.Popen([smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls"]
                                      + [u for _, u in workers]
                                      + ["--policy", "cache_aware", "--prometheus-host", "127.0.0.1",
                                         "--prometheus-port", str(free_port()), "--log-level", "warn"],
                                      stdout=open(os.path.join(tmp, "smg.log"), "w"), stderr=subprocess.STDOUT))
        check(wait_for(lambda: up(gw + "/v1/models"), 60), "the gateway is up")
        # Each worker answers the Messages API itself (the control: the route exists behind it).
        direct = anthropic.Anthropic(base_url=workers[0][1], api_key="none", max_retries=0)
        d = direct.messages.create(model="kjv", max_tokens=8, messages=CONV, extra_body={"temperature": 0})
        check(d.content[0].text != "", "a worker answers POST /v1/messages directly")
        an = anthropic.Anthropic(base_url=gw, api_key="none", max_retries=0)
        status = None
        try:
            an.messages.create(model="kjv", max_tokens=8, messages=CONV, extra_body={"temperature": 0})
            status = 200
        except anthropic.APIStatusError as e:
            status = e.status_code
        check(status == 404, f"{GATEWAY}: POST /v1/messages through the gateway is {status} (404: no such route)")
        # What the gateway does route: the OpenAI chat API, a conversation kept on its worker.
        oa = openai.OpenAI(base_url=gw + "/v1", api_key="none", max_retries=0)
        r1 = oa.chat.completions.create(model="kjv", messages=CONV, max_tokens=16, temperature=0)
        conv2 = CONV + [{"role": "assistant", "content": r1.choices[0].message.content},
                        {"role": "user", "content": "Go on."}]
        r2 = oa.chat.completions.create(model="kjv", messages=conv2, max_tokens=16, temperature=0)
        c2 = r2.usage.prompt_tokens_details.cached_tokens
        check(c2 >= r1.usage.prompt_tokens * 0.9,
              f"the same conversation through the gateway's /v1/chat/completions: turn 2 resumes {c2} tokens "
              f"(turn 1's prompt: {r1.usage.prompt_tokens})")
    else:
        for d_ in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
            os.makedirs(os.path.join(tmp, "nginx", d_), exist_ok=True)
        access = os.path.join(tmp, "nginx", "access.log")
        conf = os.path.join(tmp, "nginx", "nginx.conf")
        servers = "\n".join(f"    server {u[len('http://'):]} max_fails=0;" for _, u in workers)
        t = os.path.join(tmp, "nginx")
        open(conf, "w").write(f"""worker_processes 1;
daemon off;
pid {t}/nginx.pid;
error_log {t}/error.log warn;
events {{ worker_connections 256; }}
http {{
  log_format up '$http_x_session_id|$upstream_addr|$upstream_status|$status';
  access_log {access} up;
  client_body_temp_path {t}/body;
  proxy_temp_path {t}/proxy;
  fastcgi_temp_path {t}/fastcgi;
  uwsgi_temp_path {t}/uwsgi;
  scgi_temp_path {t}/scgi;
  upstream workers {{
    hash $http_x_session_id consistent;
{servers}
    keepalive 16;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://workers;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_read_timeout 300s;
      proxy_next_upstream error timeout http_503 non_idempotent;
      proxy_next_upstream_tries 2;
    }}
  }}
}}
""")
        procs.append(subprocess.Popen([NGINX, "-c", conf, "-p", t], stdout=open(os.path.join(t, "out.log"), "w"),
                                      stderr=subprocess.STDOUT))
        check(wait_for(lambda: up(gw + "/health"), 20), f"nginx is up ({open(os.path.join(t, 'out.log')).read()})")

        def client(session):
            return anthropic.Anthropic(base_url=gw, api_key="none", max_retries=0,
                                       default_headers={"x-session-id": session})

        def log_lines():
            return [ln.split("|") for ln in open(access).read().splitlines() if ln.strip()]

        # A conversation's turns stay on one worker: turn 2 resumes turn 1's prefix.
        a = client("conversation-a")
        m1 = a.messages.create(model="kjv", max_tokens=16, messages=CONV, extra_body={"temperature": 0})
        conv2 = CONV + [{"role": "assistant", "content": m1.content[0].text}, {"role": "user", "content": "Go on."}]
        m2 = a.messages.create(model="kjv", max_tokens=16, messages=conv2, extra_body={"temperature": 0})
        n1 = m1.usage.input_tokens + (m1.usage.cache_read_input_tokens or 0)
        check(m2.usage.cache_read_input_tokens >= 0.9 * n1,
              f"through nginx, turn 2 of a session reads {m2.usage.cache_read_input_tokens} tokens from the cache "
              f"(turn 1's prompt: {n1})")
        # A stream passes through whole: the same text as the same request not streamed.
        with a.messages.stream(model="kjv", max_tokens=16, messages=conv2, extra_body={"temperature": 0}) as s:
            streamed = "".join(s.text_stream)
        check(streamed == m2.content[0].text, "a streamed answer through nginx equals the non-streamed one")
        # Sessions spread over both workers, each session on one.
        for k in range(12):
            for _ in range(2):
                client(f"s{k}").messages.create(model="kjv", max_tokens=2,
                                                messages=[{"role": "user", "content": f"Number {k}"}],
                                                extra_body={"temperature": 0})
        by_session = {}
        for ln in log_lines():
            by_session.setdefault(ln[0], set()).add(ln[1])
        check(all(len(v) == 1 for v in by_session.values()),
              f"each session's requests went to one worker ({len(by_session)} sessions)")
        used = {next(iter(v)) for k, v in by_session.items() if k.startswith("s")}
        check(len(used) == 2, f"12 sessions spread over both workers ({sorted(used)})")

        # A drain: SIGTERM to session a's worker while a stream runs on it. The stream completes;
        # session a's requests meanwhile get the draining worker's 503, retried on the other.
        holder = by_session["conversation-a"].pop()
        wp = next(p for p, u in workers if u.endswith(holder))
        done = {}
        started = threading.Event()

        def long_stream():
            with a.messages.stream(model="kjv", max_tokens=1600, messages=conv2,
                                   extra_body={"temperature": 0}) as s:
                parts = []
                for piece in s.text_stream:
                    parts.append(piece)
                    started.set()
                done["text"] = "".join(parts)
                done["stop"] = s.get_final_message().stop_reason
        th = threading.Thread(target=long_stream)
        th.start()
        check(started.wait(60), "a long stream runs on the session's worker")
        wp.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        answered = 0
        for k in range(4):
            r = a.messages.create(model="kjv", max_tokens=4, messages=[{"role": "user", "content": f"During {k}"}],
                                  extra_body={"temperature": 0})
            answered += r.content[0].text is not None
        th.join(timeout=300)
        retried = sum(1 for ln in log_lines() if ln[0] == "conversation-a" and ln[2].startswith("503,") and ln[3] == "200")
        check(answered == 4, f"4 requests of the session sent during the drain: all answered ({answered})")
        check(retried >= 1, f"the draining worker's 503 was retried on the other by nginx ({retried} retried)")
        check(done.get("stop") is not None and len(done.get("text", "")) > 0,
              f"the stream running on the draining worker completed (stop_reason {done.get('stop')})")
        check(wp.wait(timeout=120) == 0, "the drained worker exited 0")
finally:
    for q in procs:
        if q.poll() is None:
            q.kill()
        q.wait()

if failures:
    print(f"{len(failures)} check(s) failed; logs in {tmp}")
    sys.exit(1)
shutil.rmtree(tmp, ignore_errors=True)
print(f"all Anthropic-client checks through {args.proxy} passed")
