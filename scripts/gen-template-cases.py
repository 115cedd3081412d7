#!/usr/bin/python3
"""Renders every chat template in tests/data/templates (llama.cpp's models/templates, from
llama-cpp-python 0.3.36's sdist) with the conversations of tests/data/templates/conversations.json,
using Debian's python3-jinja2 in the environment Hugging Face's apply_chat_template builds
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the `generation` tag,
tojson without HTML escaping, raise_exception, strftime_now) plus llama.cpp's from_json filter.
Writes tests/data/templates/expected.json: per template and conversation, the text or the error.
expert-serve's renderer (chat/jinja.cpp) must produce the same text, byte for byte, and fail
where jinja2 fails.

Run with Debian's interpreter: /usr/bin/python3 scripts/gen-template-cases.py
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "templates")
NOW = datetime.datetime(2026, 3, 14, 15, 9, 26)  # the fixed clock strftime_now reads


class Generation(Extension):
    """{% generation %}...{% endgeneration %}: renders its body (Hugging Face's AssistantTracker)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, "jinja2.ext.loopcontrols"])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.filters["from_json"] = json.loads
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: NOW.strftime(fmt)
    return env


def main():
    convs = json.load(open(os.path.join(DATA, "conversations.json")))
    env = make_env()
    out = {"jinja2": jinja2.__version__, "now": NOW.isoformat(), "cases": {}}
    names = sorted(f for f in os.listdir(DATA) if f.endswith(".jinja"))
    n_ok = n_err = 0
    for name in names:
        src = open(os.path.join(DATA, name), encoding="utf-8").read()
        cases = {}
        try:
            tmpl = env.from_string(src)
        except Exception as e:  # noqa: BLE001 - any compile error is the expectation
            tmpl, compile_error = None, f"{type(e).__name__}: {e}"
        for conv in convs:
            ctx = dict(conv["context"])
            ctx.setdefault("bos_token", "<|bos|>")
            ctx.setdefault("eos_token", "<|eos|>")
            try:
                if tmpl is None:
                    raise RuntimeError(compile_error)
                cases[conv["name"]] = {"text": tmpl.render(**ctx)}
                n_ok += 1
            except Exception as e:  # noqa: BLE001
                cases[conv["name"]] = {"error": f"{type(e).__name__}: {e}"}
                n_err += 1
        out["cases"][name] = cases
    with open(os.path.join(DATA, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{len(names)} templates x {len(convs)} conversations: {n_ok} rendered, {n_err} errors",
          file=sys.stderr)


if __name__ == "__main__":
    main()
