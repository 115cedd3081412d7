#!/usr/bin/env python3
"""Writes the HTTP fuzz corpus (tests/data/fuzz/http/): the exact bytes the official openai and
anthropic Python clients send for the requests expert-serve answers, captured by a socket that
answers each with a minimal reply. Run in the clients' venv (build/serve-venv-*/bin/python):

  python tests/fuzz/capture_http_corpus.py tests/data/fuzz/http
"""
import json
import os
import socket
import sys
import threading

import anthropic
import openai

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
KEY = "fuzz-key"  # the key the fuzz target's server requires
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
port = srv.getsockname()[1]
captured = []


def read_request(c):
    data = b""
    while b"\r\n\r\n" not in data:
        d = c.recv(65536)
        if not d:
            raise EOFError
        data += d
    head, _, body = data.partition(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            n = int(v)
    while len(body) < n:
        body += c.recv(65536)
    return head + b"\r\n\r\n" + body


def answer(c):
    try:
        while True:
            req = read_request(c)
            captured.append(req)
            body = b'{"error":{"message":"captured","type":"x"}}'
            c.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    except Exception:  # noqa: BLE001
        c.close()


def serve():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=answer, args=(c,), daemon=True).start()


threading.Thread(target=serve, daemon=True).start()
oa = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=10)
an = anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key=KEY, max_retries=0, timeout=10)
TOOL = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                         "days": {"type": "integer", "minimum": 1}},
        "required": ["city"]}
OA_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL}}]
MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
calls = [
    lambda: oa.chat.completions.create(model="m", messages=MSGS, max_tokens=8),
    lambda: oa.chat.completions.create(model="m", messages=MSGS, max_tokens=8, stream=True,
                                       stream_options={"include_usage": True}),
    lambda: oa.chat.completions.create(model="m", messages=MSGS, tools=OA_TOOLS, tool_choice="required"),
    lambda: oa.chat.completions.create(
        model="m", tools=OA_TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=MSGS + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]),
    lambda: oa.chat.completions.create(model="m", messages=MSGS, response_format={
        "type": "json_schema", "json_schema": {"name": "w", "schema": TOOL}}, logprobs=True, top_logprobs=3,
        temperature=0.5, top_p=0.9, seed=7, stop=["\n\n"]),
    lambda: oa.chat.completions.create(model="m", messages=MSGS, response_format={"type": "json_object"},
                                       reasoning_effort="low", max_completion_tokens=16),
    lambda: oa.completions.create(model="m", prompt="In the beginning", max_tokens=4),
    lambda: oa.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=4, echo=True, logprobs=2),
    lambda: oa.completions.create(model="m", prompt="And God said", max_tokens=4, stream=True, stop="."),
    lambda: oa.models.list(),
    lambda: an.messages.create(model="m", max_tokens=8, system="Be brief.",
                               messages=[{"role": "user", "content": "Weather in Paris?"}],
                               stop_sequences=["\n"], extra_body={"temperature": 0.2}),
    lambda: an.messages.create(
        model="m", max_tokens=64, tools=[{"name": "get_weather", "input_schema": TOOL}],
        tool_choice={"type": "any"}, messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Rome"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [{"type": "text", "text": "rain"}], "is_error": False}]}]),
    lambda: an.messages.create(model="m", max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024},
                               messages=[{"role": "user", "content": [{"type": "text", "text": "Think."}]}],
                               stream=True),
]
for call in calls:
    try:
        r = call()
        if hasattr(r, "__iter__"):
            for _ in r:
                pass
    except (openai.BadRequestError, anthropic.BadRequestError):  # the 400 every request gets
        pass
for i, req in enumerate(captured):
    with open(os.path.join(out_dir, f"client-{i:02d}.http"), "wb") as f:
        f.write(req)
# And what clients that are not these send: curl's health check, a bare HTTP/1.0 request.
extra = [b"GET /health HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n",
         b"GET /metrics HTTP/1.0\r\n\r\n",
         b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer fuzz-key\r\n"
         b"Transfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
         b"1a\r\n{\"prompt\":\"x\",\"max_tokens\"\r\n4\r\n: 2}\r\n0\r\n\r\n"]
for i, req in enumerate(extra):
    with open(os.path.join(out_dir, f"other-{i:02d}.http"), "wb") as f:
        f.write(req)
print(f"{len(captured)} client requests and {len(extra)} others written to {out_dir}")
