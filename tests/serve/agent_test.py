#!/usr/bin/env python3
"""Agents against expert-serve with the official `openai` and `anthropic` clients: a real expertd
serving the bundled model's pack, a real expert-serve with a tool-calling family's real template.
A full tool loop in both APIs (tools -> a forced call whose arguments validate against the
tool's schema -> the result sent back -> an answer), streamed and not (the streamed pieces
assemble to exactly the non-streamed reply); a named tool; json_schema output; reasoning split
off and switched per request (GLM-4.7's template, which opens the reasoning block); bad input.
The bundled model is trained on the KJV and knows nothing of tools: every call it makes is the
grammar's doing, which is the point (any model, random weights included).

Usage: agent_test.py --bin BUILD_DIR --source SOURCE_DIR
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
import time
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
TEMPLATES = os.path.join(args.source, "tests", "data", "templates")
tmp = tempfile.mkdtemp(prefix="agent-test-", dir=B)
procs = []


def start_serve(extra, ctx=1024):
    return serve_util.start_serve(B, tmp, procs, ["--ctx", str(ctx), "--parallel", "2"] + extra)[1]


# Tools whose arguments a call must satisfy; bounded so that any model ends them.
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "enum": ["Paris", "London", "Rome"]},
                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
        "required": ["zone"]}
OA_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast",
                                              "parameters": WEATHER}},
            {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]


def valid_weather(a):
    return (isinstance(a, dict) and set(a) == {"city", "days"} and a["city"] in ("Paris", "London", "Rome")
            and isinstance(a["days"], int) and 1 <= a["days"] <= 7)


try:
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")],
                   check=True)
    sock = os.path.join(tmp, "d.sock")
    open(sock + ".conf", "w").write("# flags only\n")
    procs.append(subprocess.Popen([os.path.join(B, "daemon", "expertd"), "--manifest",
                                   os.path.join(tmp, "kjv.manifest.json"), "--socket", sock, "--config",
                                   sock + ".conf", "--lock-memory", "false", "--reserve-mib", "64",
                                   "--cache-slots", "64"], stdout=open(sock + ".log", "w"),
                                  stderr=subprocess.STDOUT))
    for _ in range(500):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            break
        except OSError:
            time.sleep(0.02)
    url = start_serve(["--model", os.path.join(tmp, "kjv.core.gguf"), "--socket", sock, "--alias", "kjv",
                       "--chat-template", os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")])
    oa = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    an = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)

    # ---- OpenAI: the tool loop ----
    msgs = [{"role": "user", "content": "What is the weather in Paris for three days?"}]
    r = oa.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS, tool_choice="required",
                                   max_tokens=300, temperature=0)
    ch = r.choices[0]
    calls = ch.message.tool_calls or []
    check(ch.finish_reason == "tool_calls" and len(calls) == 1, f"required: one call, finish tool_calls ({ch.finish_reason})")
    call = calls[0]
    a = json.loads(call.function.arguments) if calls else None
    check(call.function.name in ("get_weather", "get_time") and call.id.startswith("call_"),
          f"the call names a listed tool ({call.function.name}) with an id")
    check((call.function.name == "get_weather" and valid_weather(a)) or
          (call.function.name == "get_time" and a in ({"zone": "UTC"}, {"zone": "CET"})),
          f"its arguments validate against the tool's schema ({call.function.arguments})")

    # Streamed: the pieces assemble to exactly the same reply.
    name, arg_text, ids, finish = "", "", set(), None
    for chunk in oa.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS, tool_choice="required",
                                            max_tokens=300, temperature=0, stream=True):
        d = chunk.choices[0].delta
        for tc in d.tool_calls or []:
            name += tc.function.name or "" if tc.function else ""
            arg_text += tc.function.arguments or "" if tc.function else ""
            if tc.id:
                ids.add(tc.id)
        finish = chunk.choices[0].finish_reason or finish
    check(name == call.function.name and arg_text == call.function.arguments and len(ids) == 1 and
          finish == "tool_calls", "streamed delta.tool_calls assemble to the non-streamed call")

    # The result goes back in (role tool, with the call's id) and the model answers.
    msgs2 = msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": call.function.name,
                                                           "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny", "high_c": 24}'}]
    r2 = oa.chat.completions.create(model="kjv", messages=msgs2, tools=OA_TOOLS, max_tokens=12, temperature=0)
    check(r2.choices[0].message.content and not r2.choices[0].message.tool_calls and
          r2.choices[0].finish_reason in ("length", "stop"), "after the tool result: an answer")
    check(r2.usage.prompt_tokens > r.usage.prompt_tokens + 20,
          f"the call and its result are in the prompt ({r.usage.prompt_tokens} -> {r2.usage.prompt_tokens})")

    # A named tool.
    r = oa.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS, max_tokens=200, temperature=0,
                                   tool_choice={"type": "function", "function": {"name": "get_time"}})
    c = (r.choices[0].message.tool_calls or [None])[0]
    check(c is not None and c.function.name == "get_time" and
          json.loads(c.function.arguments) in ({"zone": "UTC"}, {"zone": "CET"}), "a named tool is the one called")

    # json_schema output: content parses and validates.
    schema = {"type": "object", "properties": {"answer": {"type": "boolean"},
                                               "count": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["answer", "count"]}
    r = oa.chat.completions.create(model="kjv", messages=[{"role": "user", "content": "Is it so?"}], max_tokens=200,
                                   temperature=0, response_format={"type": "json_schema", "json_schema": {
                                       "name": "verdict", "schema": schema}})
    try:
        v = json.loads(r.choices[0].message.content)
    except ValueError:
        v = None
    check(isinstance(v, dict) and set(v) == {"answer", "count"} and isinstance(v["answer"], bool) and
          0 <= v["count"] <= 99 and r.choices[0].finish_reason == "stop",
          f"response_format json_schema: content validates ({r.choices[0].message.content!r})")

    # A call cut by max_tokens: returned unfinished, finish_reason length.
    r = oa.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS, tool_choice="required",
                                   max_tokens=20, temperature=0)
    check(r.choices[0].finish_reason == "length", "a call cut by max_tokens: finish_reason length")

    # ---- Anthropic: the tool loop ----
    AN_TOOLS = [{"name": "get_weather", "description": "Forecast", "input_schema": WEATHER}]
    amsgs = [{"role": "user", "content": "What is the weather in Rome?"}]
    m = an.messages.create(model="kjv", max_tokens=300, tools=AN_TOOLS, tool_choice={"type": "any"},
                           messages=amsgs, extra_body={"temperature": 0})
    uses = [b for b in m.content if b.type == "tool_use"]
    check(m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather" and
          valid_weather(uses[0].input) and uses[0].id.startswith("toolu_"),
          f"anthropic tool_choice any: a tool_use block that validates ({m.stop_reason})")
    with an.messages.stream(model="kjv", max_tokens=300, tools=AN_TOOLS, tool_choice={"type": "any"},
                            messages=amsgs, extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    fuses = [b for b in final.content if b.type == "tool_use"]
    check(final.stop_reason == "tool_use" and len(fuses) == 1 and fuses[0].name == uses[0].name and
          fuses[0].input == uses[0].input, "anthropic stream (input_json_delta) == messages.create")
    m2 = an.messages.create(model="kjv", max_tokens=12, tools=AN_TOOLS, extra_body={"temperature": 0},
                            messages=amsgs + [{"role": "assistant", "content": m.content},
                                              {"role": "user", "content": [
                                                  {"type": "tool_result", "tool_use_id": uses[0].id,
                                                   "content": [{"type": "text", "text": "sunny, 24 C"}]},
                                                  {"type": "text", "text": "Thanks."}]}])
    check(m2.content[0].type == "text" and m2.content[0].text and m2.stop_reason in ("max_tokens", "end_turn") and
          m2.usage.input_tokens + m2.usage.cache_read_input_tokens >
          m.usage.input_tokens + m.usage.cache_read_input_tokens + 10, "anthropic: tool_result in, an answer out")
    m3 = an.messages.create(model="kjv", max_tokens=300, tools=AN_TOOLS + [
        {"name": "get_time", "input_schema": TIME}], tool_choice={"type": "tool", "name": "get_time"},
        messages=amsgs, extra_body={"temperature": 0})
    check([b.name for b in m3.content if b.type == "tool_use"] == ["get_time"], "anthropic tool_choice tool: that tool")

    # ---- Bad input ----
    def bad(fn, *needles):
        try:
            fn()
            return False
        except (openai.BadRequestError, anthropic.BadRequestError) as e:
            return all(n in str(e) for n in needles)
    check(bad(lambda: oa.chat.completions.create(model="kjv", messages=msgs, tools=[
        {"type": "function", "function": {"parameters": WEATHER}}]), "tools[0].function.name"),
        "a tool without a name: 400 naming the field")
    check(bad(lambda: oa.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS,
                                                 tool_choice={"type": "function", "function": {"name": "nope"}}),
              "nope", "not in tools"), "tool_choice naming an absent tool: 400")
    check(bad(lambda: oa.chat.completions.create(model="kjv", messages=msgs, tools=[
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "not": {}}}}],
        tool_choice="required"), "'not'", "tools[0].function.parameters"),
        "an unsupported schema keyword: 400 naming it")
    check(bad(lambda: an.messages.create(model="kjv", max_tokens=8, messages=amsgs, tools=[{"name": "x"}]),
              "tools[0].input_schema"), "anthropic: a tool without input_schema: 400 naming it")

    # ---- logprobs: what evaluation harnesses score with ----
    text = "And God said, Let there be light"
    ids = [int(x) for x in subprocess.run([os.path.join(B, "engine", "expert-run"), "tokenize", "--model", MODEL,
                                           "--text", text], capture_output=True, text=True,
                                          check=True).stdout.split()]
    out = os.path.join(tmp, "logits.f32")
    subprocess.run([os.path.join(B, "engine", "expert-run"), "logits", "--model", MODEL, "--local", "--threads",
                    "2", "--tokens", ",".join(map(str, ids)), "--out", out], check=True, capture_output=True)
    import array
    import math
    lg = array.array("f")
    lg.frombytes(open(out, "rb").read())
    V = len(lg) // len(ids)

    def logsoftmax(row, t):
        m = max(row)
        return row[t] - m - math.log(sum(math.exp(v - m) for v in row))
    want = [logsoftmax(lg[i * V:(i + 1) * V], ids[i + 1]) for i in range(len(ids) - 1)]
    r = oa.completions.create(model="kjv", prompt=ids, max_tokens=1, logprobs=3, echo=True, temperature=0)
    lp = r.choices[0].logprobs
    got = lp.token_logprobs[1:len(ids)]
    check(lp.token_logprobs[0] is None and len(got) == len(want) and
          all(abs(g - w) < 1e-3 for g, w in zip(got, want)),
          f"echo + logprobs: the prompt's log-probabilities are the model's (max |diff| "
          f"{max(abs(g - w) for g, w in zip(got, want)):.2e} against expert-run logits)")
    check(r.choices[0].text.startswith(text) and lp.text_offset[0] == 0 and
          "".join(lp.tokens) == r.choices[0].text, "echo: the prompt's text first, offsets into it")
    last = lp.top_logprobs[-1]
    check(len(last) == 3 and max(last.values()) == lp.token_logprobs[-1],
          "greedy: the drawn token is the most likely of its top_logprobs")
    # A prompt long enough to be cached, scored twice: the second is not cut short by the cache.
    long_text = "And the LORD spake unto Moses, saying, Speak unto the children of Israel. " * 6
    scored = [oa.completions.create(model="kjv", prompt=long_text, max_tokens=1, logprobs=0, echo=True,
                                    temperature=0) for _ in range(2)]
    check(len(scored[0].choices[0].logprobs.token_logprobs) > 64 and
          scored[1].choices[0].logprobs.token_logprobs == scored[0].choices[0].logprobs.token_logprobs,
          "echo + logprobs of a cached prompt: every prompt token scored again")
    r = oa.chat.completions.create(model="kjv", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                   temperature=0, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    check(len(content) == 6 and "".join(t.token for t in content) == r.choices[0].message.content and
          all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob == t.logprob for t in content),
          "chat logprobs: one entry per token, top_logprobs led by the greedy token")
    streamed = []
    for chunk in oa.chat.completions.create(model="kjv", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                            temperature=0, logprobs=True, top_logprobs=2, stream=True):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += [(t.token, t.logprob) for t in chunk.choices[0].logprobs.content]
    check(streamed == [(t.token, t.logprob) for t in content], "streamed chat logprobs == non-streamed")
    check(bad(lambda: oa.chat.completions.create(model="kjv", messages=msgs, top_logprobs=2), "top_logprobs"),
          "top_logprobs without logprobs: 400 naming it")

    # ---- Long conversations: the prompt's prefix resumed, never changing the text ----
    url_nc = start_serve(["--model", MODEL, "--local", "--alias", "kjv", "--prefix-cache-mib", "0",
                          "--chat-template", os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")])
    oa_nc = openai.OpenAI(base_url=url_nc + "/v1", api_key="none", max_retries=0)
    conv = [{"role": "system", "content": "You are a scribe of the old books. " * 12},
            {"role": "user", "content": "Tell me of Moses and the people."}]
    cached, same = [], True
    for turn in range(3):
        a = oa.chat.completions.create(model="kjv", messages=conv, max_tokens=16, temperature=0)
        b = oa_nc.chat.completions.create(model="kjv", messages=conv, max_tokens=16, temperature=0)
        same = same and a.choices[0].message.content == b.choices[0].message.content
        cached.append(a.usage.prompt_tokens_details.cached_tokens)
        check(b.usage.prompt_tokens_details.cached_tokens == 0, f"turn {turn}: no reuse with --prefix-cache-mib 0")
        conv += [{"role": "assistant", "content": a.choices[0].message.content},
                 {"role": "user", "content": "And then what happened in the land?"}]
    check(same, "prefix reuse never changes the text (3 turns, through expertd vs --local without reuse)")
    check(cached[0] == 0 and all(c > 64 for c in cached[1:]),
          f"from turn 2 on the history is resumed (cached_tokens {cached})")
    m = an.messages.create(model="kjv", max_tokens=8, extra_body={"temperature": 0},
                           system="You are a scribe of the old books. " * 12,
                           messages=[{"role": "user", "content": "Tell me of Moses and the people."}])
    check(m.usage.cache_read_input_tokens > 64 and m.usage.input_tokens + m.usage.cache_read_input_tokens > 100,
          f"anthropic: usage.cache_read_input_tokens ({m.usage.cache_read_input_tokens})")
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    reused = float(re.search(r"^expert_serve_prefix_reused_tokens_total (\S+)$", text, re.M).group(1))
    check(reused >= sum(cached) + m.usage.cache_read_input_tokens, f"/metrics counts the reused tokens ({reused:.0f})")

    # ---- Every family's own syntax, forced and read back, and the result rendered back in ----
    for fam in ["Qwen3-Coder.jinja", "Qwen3.5-4B.jinja", "moonshotai-Kimi-K2.jinja", "Kimi-K2-Thinking.jinja",
                "Kimi-K3.jinja", "deepseek-ai-DeepSeek-V3.1.jinja", "deepseek-ai-DeepSeek-V3.2.jinja",
                "deepseek-ai-DeepSeek-V4.jinja", "GLM-4.6.jinja", "openai-gpt-oss-120b.jinja",
                "MiniMax-M2.jinja", "MiniMax-M3.jinja", "tencent-Hy3.jinja",
                "poolside-Laguna-XS.2.jinja", "poolside-Laguna-S-2.1.jinja", "inclusionai-ling-3.0-flash.jinja",
                "StepFun3.5-Flash.jinja"]:
        uf = start_serve(["--model", MODEL, "--local", "--alias", "kjv", "--chat-template", os.path.join(TEMPLATES, fam)],
                         ctx=2048)
        of = openai.OpenAI(base_url=uf + "/v1", api_key="none", max_retries=0)
        r = of.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS[:1], tool_choice="required",
                                       max_tokens=300, temperature=0)
        c = (r.choices[0].message.tool_calls or [None])[0]
        check(r.choices[0].finish_reason == "tool_calls" and c is not None and c.function.name == "get_weather" and
              valid_weather(json.loads(c.function.arguments)), f"{fam}: a forced call in its syntax, read back valid")
        back = msgs + [{"role": "assistant", "content": None, "tool_calls": [c.model_dump()] if c else []},
                       {"role": "tool", "tool_call_id": c.id if c else "x", "name": "get_weather", "content": "sunny"}]
        if fam != "Kimi-K2-Thinking.jinja":  # its template appends to a list: Jinja2's sandbox refuses
            r = of.chat.completions.create(model="kjv", messages=back, tools=OA_TOOLS[:1], max_tokens=4, temperature=0)
            check(r.choices[0].finish_reason in ("length", "stop"), f"{fam}: the call and its result rendered back in")
        procs[-1].send_signal(signal.SIGTERM)
        procs[-1].wait(timeout=20)

    # ---- Laguna's turn end spelled out as text ends the reply, as its end-of-turn token would ----
    # (llama.cpp makes </assistant> a stop string too). The bundled model is made to write it: a
    # JSON answer whose first value is "</assistant>", which would go on to "b" were it not the end.
    ul = start_serve(["--model", MODEL, "--local", "--alias", "kjv", "--chat-template",
                      os.path.join(TEMPLATES, "poolside-Laguna-XS.2.jinja")], ctx=2048)
    ol = openai.OpenAI(base_url=ul + "/v1", api_key="none", max_retries=0)
    ends = {"type": "object", "properties": {"a": {"const": "</assistant>"}, "b": {"type": "integer"}},
            "required": ["a", "b"]}
    r = ol.chat.completions.create(model="kjv", messages=msgs, max_tokens=60, temperature=0, logprobs=True,
                                   response_format={"type": "json_schema",
                                                    "json_schema": {"name": "ends", "schema": ends}})
    gen = "".join(t.token for t in r.choices[0].logprobs.content)
    check(r.choices[0].finish_reason == "stop" and "</assistant>" in gen and '"b"' not in gen
          and "</assistant>" not in (r.choices[0].message.content or ""),
          f"Laguna: </assistant> written as text ends the turn ({gen!r})")
    procs[-1].send_signal(signal.SIGTERM)
    procs[-1].wait(timeout=20)

    # ---- --workers: the grammar and the logprobs travel to the engine processes ----
    uw = start_serve(["--model", os.path.join(tmp, "kjv.core.gguf"), "--socket", sock, "--alias", "kjv",
                      "--workers", "2", "--chat-template", os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")])
    for _ in range(100):
        try:
            if urllib.request.urlopen(uw + "/health", timeout=2).status == 200:
                break
        except Exception:  # noqa: BLE001
            time.sleep(0.05)
    ow = openai.OpenAI(base_url=uw + "/v1", api_key="none", max_retries=0)
    r = ow.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS, tool_choice="required",
                                   max_tokens=300, temperature=0, logprobs=True)
    c = (r.choices[0].message.tool_calls or [None])[0]
    check(c is not None and c.function.name == call.function.name and c.function.arguments == call.function.arguments
          and r.choices[0].logprobs and len(r.choices[0].logprobs.content) == r.usage.completion_tokens,
          "--workers 2: the same forced call, with its logprobs")
    procs[-1].send_signal(signal.SIGTERM)
    procs[-1].wait(timeout=20)

    # ---- The SSD tier: a restart resumes what was written before it; damage is a miss ----
    pdir = os.path.join(tmp, "prefix-tier")
    tier = ["--model", MODEL, "--local", "--alias", "kjv", "--prefix-cache-mib", "64", "--prefix-cache-dir",
            pdir, "--chat-template", os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")]

    def metric_of(u, name):
        t = urllib.request.urlopen(u + "/metrics").read().decode()
        m_ = re.search(r"^" + re.escape(name) + r" (\S+)$", t, re.M)
        return float(m_.group(1)) if m_ else None

    def stop_last():
        procs[-1].send_signal(signal.SIGTERM)
        procs[-1].wait(timeout=20)
    conv = [{"role": "system", "content": "You are a scribe of the old books. " * 12},
            {"role": "user", "content": "Tell me of Moses and the people."}]
    u = start_serve(tier)
    c1 = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0)
    first = c1.chat.completions.create(model="kjv", messages=conv, max_tokens=16, temperature=0)
    for _ in range(100):
        if (metric_of(u, "expert_serve_prefix_disk_writes_total") or 0) >= 2:
            break
        time.sleep(0.05)
    check(metric_of(u, "expert_serve_prefix_disk_writes_total") >= 2, "the prompt and reply states are written to the SSD tier")
    stop_last()
    conv2 = conv + [{"role": "assistant", "content": first.choices[0].message.content},
                    {"role": "user", "content": "And then what happened in the land?"}]
    want2 = oa_nc.chat.completions.create(model="kjv", messages=conv2, max_tokens=16, temperature=0)
    u = start_serve(tier)
    c2 = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0)
    r = c2.chat.completions.create(model="kjv", messages=conv2, max_tokens=16, temperature=0)
    check(r.usage.prompt_tokens_details.cached_tokens > 64 and metric_of(u, "expert_serve_prefix_disk_hits_total") == 1,
          f"after a restart the SSD tier resumes the history ({r.usage.prompt_tokens_details.cached_tokens} tokens)")
    check(r.choices[0].message.content == want2.choices[0].message.content, "a resume from the SSD tier changes nothing")
    stop_last()
    for f in os.listdir(pdir):  # every state damaged: one byte of it, past the header and tokens
        with open(os.path.join(pdir, f), "r+b") as fh:
            fh.seek(3 * 4096)
            b = fh.read(1)
            fh.seek(3 * 4096)
            fh.write(bytes([b[0] ^ 0x40]))
    u = start_serve(tier)
    c3 = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0)
    r = c3.chat.completions.create(model="kjv", messages=conv2, max_tokens=16, temperature=0)
    check(r.usage.prompt_tokens_details.cached_tokens == 0 and
          metric_of(u, "expert_serve_prefix_disk_damaged_total") >= 1 and
          r.choices[0].message.content == want2.choices[0].message.content,
          "damaged SSD-tier states: a counted miss, the same text")
    stop_last()

    # ---- Reasoning (GLM-4.7: its prompt opens <think>) and a template without tools ----
    url2 = start_serve(["--model", MODEL, "--local", "--alias", "kjv",
                        "--chat-template", os.path.join(TEMPLATES, "GLM-4.7-Flash.jinja")])
    oa2 = openai.OpenAI(base_url=url2 + "/v1", api_key="none", max_retries=0)
    an2 = anthropic.Anthropic(base_url=url2, api_key="none", max_retries=0)
    r = oa2.chat.completions.create(model="kjv", messages=[{"role": "user", "content": "hi"}], max_tokens=10,
                                    temperature=0)
    msg = r.choices[0].message
    check(getattr(msg, "reasoning_content", None) and not msg.content,
          "thinking on: the text is reasoning_content, not content")
    r = oa2.chat.completions.create(model="kjv", messages=[{"role": "user", "content": "hi"}], max_tokens=10,
                                    temperature=0, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    check(r.choices[0].message.content and not getattr(r.choices[0].message, "reasoning_content", None),
          "thinking off (chat_template_kwargs): the text is content")
    rs = ""
    for chunk in oa2.chat.completions.create(model="kjv", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=10, temperature=0, stream=True):
        rs += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
    check(rs == msg.reasoning_content, "delta.reasoning_content assembles to message.reasoning_content")
    m = an2.messages.create(model="kjv", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
                            thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 0})
    check(m.content[0].type == "thinking" and m.content[0].thinking, "anthropic thinking enabled: a thinking block")
    # A forced call from inside the reasoning block: closed first, then GLM's own call syntax.
    r = oa2.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS, tool_choice="required",
                                    max_tokens=300, temperature=0)
    c = (r.choices[0].message.tool_calls or [None])[0]
    check(c is not None and r.choices[0].finish_reason == "tool_calls" and
          (c.function.name != "get_weather" or valid_weather(json.loads(c.function.arguments))),
          "GLM (XML arguments, reasoning open): a forced call parses and validates")

    url3 = start_serve(["--model", MODEL, "--local", "--alias", "kjv",
                        "--chat-template", os.path.join(TEMPLATES, "google-gemma-2-2b-it.jinja")])
    oa3 = openai.OpenAI(base_url=url3 + "/v1", api_key="none", max_retries=0)
    check(bad(lambda: oa3.chat.completions.create(model="kjv", messages=msgs, tools=OA_TOOLS),
              "no tool-call format"), "a template without tool support asked for tools: 400 saying so")

    # The grammar's cost per step, as the server measured it.
    text = urllib.request.urlopen(url + "/metrics").read().decode()
    s = float(re.search(r"^expert_serve_grammar_mask_seconds_sum (\S+)$", text, re.M).group(1))
    n = float(re.search(r"^expert_serve_grammar_mask_seconds_count (\S+)$", text, re.M).group(1))
    ts = float(re.search(r"^expert_serve_time_per_token_seconds_sum (\S+)$", text, re.M).group(1))
    tn = float(re.search(r"^expert_serve_time_per_token_seconds_count (\S+)$", text, re.M).group(1))
    print(f"grammar mask: {1e6 * s / n:.1f} us per constrained step over {n:.0f} steps; "
          f"a step: {1e3 * ts / tn:.2f} ms ({100 * (s / n) / (ts / tn):.2f}%)")
    check(n > 100, "the constrained steps were counted in /metrics")
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
