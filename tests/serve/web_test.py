#!/usr/bin/env python3
"""expert-serve's page (serve/web, docs/web.md) in a real browser: Debian's Chromium driven by
Playwright (from PyPI, in a venv this test makes under the build directory; its own browser
download is never used), headless, on loopback. A real expertd serves the bundled model's pack
behind an API key; a second expert-serve reads the experts itself (--local).

Checks: the page loads with no console error; a wrong key shows a visible error, the right one is
kept; a message typed and sent with the keyboard alone gets the model's streamed reply (the same
text as the API gives); Shift+Enter is a new line; stop cancels the generation on the server (its
sequences and tokens stop); with a chat template the reply comes through /v1/chat/completions,
its reasoning folded, and a forced tool call's stream (the server's own, replayed into the page)
is shown as a call; the dashboard's heat map and hit rate change while a generation runs;
with --local the page says that residency needs expertd and still draws the routers' choices;
nothing overflows horizontally at 1280x800 or at 390 px. EXPERTD_SCREENSHOTS=1 writes
docs/img/web-chat.png and docs/img/web-dashboard.png.

Exit 77 (skipped, with the reason) where Chromium is not installed or Playwright cannot be.

Usage: web_test.py --bin BUILD_DIR --source SOURCE_DIR
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()

from serve_util import SKIP, check, failures, http, install_venv_package, wait_for  # noqa: E402
import serve_util  # noqa: E402

B = os.path.abspath(args.bin)
SRC = os.path.abspath(args.source)
CHROMIUM = os.environ.get("EXPERTD_CHROMIUM", "/usr/bin/chromium")
PLAYWRIGHT = "playwright==1.65.3"  # pinned: its API moves
VENV = os.path.join(B, "web-venv-playwright1.65.3")

if not os.access(CHROMIUM, os.X_OK):
    print(f"SKIP: no Chromium at {CHROMIUM} (Debian: apt-get install chromium; "
          "scripts/install-deps.sh installs it)", flush=True)
    sys.exit(SKIP)
if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
    py = install_venv_package(VENV, PLAYWRIGHT, "python")
    os.execv(py, [py] + sys.argv)

from playwright.sync_api import sync_playwright  # noqa: E402

MODEL = os.path.join(SRC, "model", "kjv-moe-q8_0.gguf")
GLM = os.path.join(SRC, "tests", "data", "templates", "GLM-4.7-Flash.jinja")
QWEN3 = os.path.join(SRC, "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")
KEY = "sekrit"
SHOTS = os.environ.get("EXPERTD_SCREENSHOTS") == "1"
tmp = tempfile.mkdtemp(prefix="web-test-", dir=B)
procs = []


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def metric(url, name):
    _, text, _ = http(url + "/metrics")
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def overflow(page):
    """The widest right edge of any element past the window's width (0: none)."""
    return page.evaluate("""() => {
        let worst = 0;
        for (const e of document.querySelectorAll('body *')) {
            const r = e.getBoundingClientRect();
            if (r.width > 0 && r.right - window.innerWidth > worst) worst = r.right - window.innerWidth;
        }
        return Math.max(worst, document.documentElement.scrollWidth - window.innerWidth);
    }""")


def until(page, js, timeout):
    """Waits for the expression js to be true in the page (page.evaluate, which the page's
    Content-Security-Policy allows, where wait_for_function's string evaluation is refused)."""
    end = time.time() + timeout / 1000
    while time.time() < end:
        if page.evaluate("() => Boolean(" + js + ")"):
            return
        time.sleep(0.1)
    raise TimeoutError("the page never had " + js)


def attr(page, sel, name):
    return page.eval_on_selector(sel, f"e => e.dataset.{name}")


class Background:
    """Streamed completions one after another in a thread until stopped (the dashboard watches)."""

    def __init__(self, url, prompt, headers=None):
        self.done = threading.Event()

        def loop():
            while not self.done.is_set():
                http(url + "/v1/completions", {"prompt": prompt, "max_tokens": 400, "temperature": 0.8,
                                               "stream": True}, headers=headers, timeout=300)
        self.t = threading.Thread(target=loop)
        self.t.start()

    def stop(self):
        self.done.set()
        self.t.join()


try:
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")])
    sock = os.path.join(tmp, "d.sock")
    # 64 slots for the 128 experts: misses go on while text streams (the heat map moves).
    serve_util.start_expertd(B, os.path.join(tmp, "kjv.manifest.json"), sock, procs, ["--cache-slots", "64"])
    _, url = serve_util.start_serve(B, tmp, procs, ["--model", os.path.join(tmp, "kjv.core.gguf"), "--socket", sock,
                                                    "--parallel", "2", "--ctx", "8192", "--api-key", KEY,
                                                    "--alias", "kjv"], threads=1)
    _, local_url = serve_util.start_serve(B, tmp, procs, ["--model", MODEL, "--local", "--parallel", "2",
                                                          "--ctx", "1024"], threads=1)
    _, glm_url = serve_util.start_serve(B, tmp, procs, ["--model", MODEL, "--local", "--alias", "kjv",
                                                        "--chat-template", GLM], threads=1)
    _, qwen_url = serve_util.start_serve(B, tmp, procs, ["--model", MODEL, "--local", "--alias", "kjv",
                                                         "--chat-template", QWEN3], threads=1)
    st, page_html, hdrs = http(url + "/")
    check(st == 200 and "<canvas id=\"heat\"" in page_html and "text/html" in hdrs.get("Content-Type", ""),
          "GET / is the page, without the key (it asks for it)")
    st, _, _ = http(url + "/dashboard/info")
    check(st == 401, "the dashboard's data needs the key (401 without it)")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])

        # --- A wrong key: a visible error, not a blank page; the right one is kept. ---
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        page = ctx.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url + "/")
        page.wait_for_selector("#banner:not([hidden])", timeout=10000)
        check("API key" in page.inner_text("#banner") and page.is_visible("#key-input"),
              "no key: the page says it needs one and shows the key field")
        page.fill("#key-input", "wrong")
        page.press("#key-input", "Enter")
        until(page, "document.querySelector('#banner').textContent.includes('refused')", timeout=10000)
        check(page.is_visible("#banner") and page.is_visible("#composer"),
              "a wrong key: a visible error (" + page.inner_text("#banner") + "), the page still there")
        page.fill("#key-input", KEY)
        page.press("#key-input", "Enter")
        until(page, "document.querySelector('#model-name').textContent.includes('kjv')", timeout=10000)
        check(page.is_hidden("#banner"), "the right key: the error goes, the model is named")
        page.reload()
        until(page, "document.querySelector('#model-name').textContent.includes('kjv')", timeout=10000)
        check(page.is_hidden("#banner"), "the key is kept in the browser across a reload")
        check(page.is_hidden("#key-form") and page.is_visible("#view-chat") and page.is_hidden("#view-dash"),
              "the chat alone is shown (the key form and the dashboard hidden)")
        check(not errors, f"no script error on the way ({errors})")
        ctx.close()

        # --- The chat, keyboard only, in a fresh browser profile with the key given once. ---
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        ctx.add_init_script(f"localStorage.setItem('expertd.key', '{KEY}')")
        page = ctx.new_page()
        console = []
        page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: console.append(str(e)))
        page.goto(url + "/")
        until(page, "document.querySelector('#model-name').textContent.includes('kjv')", timeout=10000)
        page.wait_for_timeout(300)
        check(not console, f"the page loads with no console error ({console})")
        check(page.evaluate("document.activeElement.id") == "input", "the message box has the focus at load")
        page.click(".settings summary")  # the settings, opened
        page.fill("#temperature", "0")
        page.fill("#max_tokens", "24")
        page.dispatch_event("#max_tokens", "change")
        page.focus("#input")
        page.keyboard.type("And God said")
        page.keyboard.press("Shift+Enter")
        check(page.input_value("#input") == "And God said\n" and page.locator(".msg").count() == 0,
              "Shift+Enter: a new line, nothing sent")
        page.keyboard.press("Backspace")
        page.keyboard.press("Tab")
        check(page.evaluate("document.activeElement.id") == "send", "Tab from the message box reaches Send")
        page.keyboard.press("Shift+Tab")
        page.keyboard.press("Enter")
        page.wait_for_selector(".msg.assistant[data-done='1']", timeout=60000)
        reply = page.inner_text(".msg.assistant .text")
        st, body, _ = http(url + "/v1/completions", {"prompt": "And God said", "max_tokens": 24, "temperature": 0},
                           headers={"Authorization": "Bearer " + KEY})
        want = json.loads(body)["choices"][0]["text"] if st == 200 else None
        check(bool(reply) and reply == want,
              f"Enter sends; the streamed reply is the model's text ({reply!r} vs {want!r})")
        check(page.inner_text(".msg.user .text") == "And God said" and "/v1/completions" in
              page.inner_text("#mode-note"), "a model without a chat template: plain completion from the same box")
        if SHOTS:
            page.keyboard.type("In the beginning")
            page.keyboard.press("Enter")
            until(page, "document.querySelectorAll(\".msg.assistant[data-done='1']\").length == 2",
                                   timeout=60000)
            os.makedirs(os.path.join(SRC, "docs", "img"), exist_ok=True)
            page.screenshot(path=os.path.join(SRC, "docs", "img", "web-chat.png"))

        # --- Stop cancels the generation on the server. ---
        page.fill("#max_tokens", "8000")
        page.fill("#temperature", "0.8")
        page.focus("#input")
        page.keyboard.type("And the LORD spake unto Moses")
        gen0 = metric(url, "expert_serve_generated_tokens_total")
        page.keyboard.press("Enter")
        until(page, "document.querySelector('.msg.assistant:last-child .text').textContent.length > 20",
                               timeout=60000)
        running = metric(url, "expert_serve_active_sequences")
        page.focus("#stop")
        page.keyboard.press("Enter")  # the stop button, from the keyboard
        page.wait_for_selector(".msg.assistant:last-child[data-done='1']", timeout=10000)
        stopped = wait_for(lambda: metric(url, "expert_serve_active_sequences") == 0, 5)
        g1 = metric(url, "expert_serve_generated_tokens_total")
        time.sleep(1.0)
        g2 = metric(url, "expert_serve_generated_tokens_total")
        check(running == 1 and stopped and g1 == g2 and g2 - gen0 < 8000,
              f"stop: the server's sequence ends and its tokens stop ({g2 - gen0:.0f} of 8000 made, "
              f"running {running} -> 0)")
        check("(stopped)" in page.inner_text(".msg.assistant:last-child"), "the stopped reply says so")

        # --- The dashboard while a generation runs. ---
        page.click("#tab-dash")
        until(page, "Number(document.querySelector('#heat').dataset.ticks) >= 2", timeout=15000)
        check(page.is_hidden("#view-chat") and page.is_visible("#view-dash"), "the dashboard tab: the chat hidden")
        total0 = float(attr(page, "#heat", "total"))
        hits_seen = {attr(page, "#hit-rate", "value")}
        bg = Background(url, "And it came to pass", {"Authorization": "Bearer " + KEY})
        totals = []
        for _ in range(16):
            page.wait_for_timeout(500)
            hits_seen.add(attr(page, "#hit-rate", "value"))
            totals.append(float(attr(page, "#heat", "total")))
        numbers = [v for v in hits_seen if v]
        check(totals[-1] > total0 and float(attr(page, "#heat", "recent")) > 0,
              f"the heat map moves while text streams (experts used: {total0:.0f} -> {totals[-1]:.0f})")
        check(len(hits_seen) >= 2 and numbers and all(0 <= float(v) <= 1 for v in numbers),
              f"the hit rate changes while text streams ({sorted(hits_seen)})")
        check(page.inner_text("#tok-s") not in ("–", "0.0"), "tokens/s shown: " + page.inner_text("#tok-s"))
        check("/ token" in page.inner_text("#bytes-tok") or page.inner_text("#bytes-tok") == "–",
              "bytes per token: " + page.inner_text("#bytes-tok") + "; " + page.inner_text("#drive-line"))
        check(page.is_hidden("#dash-note"), "through expertd: no 'needs expertd' note")
        check(page.inner_text("#heat-legend").startswith("Hue: where the expert is"),
              "through expertd: the heat map shows residency (expertd's per-expert snapshot)")
        check(page.locator("#misses .bar").count() == 4, "misses per layer: one bar per MoE layer (4)")
        engines = page.inner_text("#engines")
        check("engine" in engines and "monitor" in engines,
              "the connections to expertd: the engine and the dashboard's monitor")
        check(page.locator("#whatif tr").count() >= 3, "the what-if table has rows: " +
              page.inner_text("#whatif").replace("\n", " | "))
        if SHOTS:
            page.screenshot(path=os.path.join(SRC, "docs", "img", "web-dashboard.png"), full_page=True)
        bg.stop()
        check(not console, f"no console error through chat, stop and dashboard ({console})")

        # --- Nothing overflows horizontally, wide and phone-wide, both views. ---
        for w, h in ((1280, 800), (390, 844)):
            page.set_viewport_size({"width": w, "height": h})
            for tab in ("tab-chat", "tab-dash"):
                page.click("#" + tab)
                page.wait_for_timeout(1200)
                over = overflow(page)
                if SHOTS:  # for a look, not committed
                    page.screenshot(path=os.path.join(B, f"web-{w}-{tab}.png"), full_page=True)
                check(over <= 1, f"{w}x{h}, {tab}: nothing wider than the window (overflow {over:.0f} px)")
        ctx.close()

        # --- A chat template (GLM-4.7's, whose prompt opens the reasoning block): the chat endpoint, the
        # reasoning folded; a forced tool call's real stream, replayed into the page, shown as a call. ---
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        page = ctx.new_page()
        console = []
        page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
        page.goto(glm_url + "/")
        until(page, "document.querySelector('#mode-note').textContent.includes('chat/completions')", timeout=10000)
        page.click(".settings summary")
        page.fill("#temperature", "0")
        page.fill("#max_tokens", "10")
        page.focus("#input")
        page.keyboard.type("hi")
        page.keyboard.press("Enter")
        page.wait_for_selector(".msg.assistant[data-done='1']", timeout=60000)
        st, body, _ = http(glm_url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                              "max_tokens": 10, "temperature": 0})
        want = json.loads(body)["choices"][0]["message"].get("reasoning_content") if st == 200 else None
        shown = page.text_content(".msg.assistant details .reasoning")
        check(bool(want) and shown == want and not page.eval_on_selector(".msg.assistant details", "d => d.open"),
              f"a chat template: the reply through /v1/chat/completions, its reasoning folded ({shown!r})")
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        # (Qwen3's template: JSON arguments; GLM's forced call came back with empty ones here)
        st, stream, _ = http(qwen_url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "weather?"}],
                                                                 "tools": tools, "tool_choice": "required",
                                                                 "max_tokens": 60, "temperature": 0, "stream": True})
        page.route("**/v1/chat/completions", lambda route: route.fulfill(
            status=200, headers={"Content-Type": "text/event-stream"}, body=stream))
        page.keyboard.type("weather?")
        page.keyboard.press("Enter")
        until(page, "document.querySelectorAll(\".msg.assistant[data-done='1']\").length == 2", timeout=10000)
        page.unroute("**/v1/chat/completions")
        call = page.text_content(".msg.assistant:last-child .call") or ""
        check(st == 200 and '"tool_calls"' in stream and call.startswith("call get_weather({") and "city" in call,
              f"a tool call's stream (the server's own, replayed): shown as a call ({call!r})")
        check(not console, f"a chat template: no console error ({console})")
        ctx.close()

        # --- --local: the routers' choices, and a note that residency needs expertd. ---
        ctx = browser.new_context(viewport={"width": 1280, "height": 800})
        page = ctx.new_page()
        console = []
        page.on("console", lambda m: console.append(m.text) if m.type == "error" else None)
        page.goto(local_url + "/#dashboard")
        until(page, "Number(document.querySelector('#heat').dataset.ticks) >= 2", timeout=15000)
        total0 = float(attr(page, "#heat", "total"))
        bg = Background(local_url, "And")
        page.wait_for_timeout(3000)
        check("needs expertd" in page.inner_text("#dash-note") or "need expertd" in page.inner_text("#dash-note"),
              "--local: the page says residency needs expertd")
        check(float(attr(page, "#heat", "total")) > total0, "--local: the heat map counts the routers' choices")
        bg.stop()
        check(not console, f"--local: no console error ({console})")
        ctx.close()
        browser.close()
finally:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()

if failures:
    print(f"FAILED: {len(failures)} check(s): {failures}", flush=True)
    sys.exit(1)
shutil.rmtree(tmp, ignore_errors=True)
print("PASS", flush=True)
