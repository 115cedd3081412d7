"""What the expert-serve tests share: the venv with the official clients they are written
against (made under the build directory, then the test re-runs itself in it), a check that
records failures, and starting a server on a free port once it answers /health."""
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

# The client versions the tests were written against (pinned: their APIs move).
CLIENTS = ["openai==3.57.0", "anthropic==2.15.0"]
VENV_NAME = "serve-venv-openai3.57-anthropic2.15"


def in_client_venv(build_dir):
    """Re-runs the calling script in the clients' venv (making it on first use)."""
    venv = os.path.join(build_dir, VENV_NAME)
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    if not os.path.exists(os.path.join(venv, ".ready")):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
        subprocess.check_call([py, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + CLIENTS)
        open(os.path.join(venv, ".ready"), "w").close()
    os.execv(py, [py] + sys.argv)


failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def start_serve(build_dir, log_dir, procs, extra, threads=2, new_session=False):
    """expert-serve --port 0 --threads THREADS EXTRA, its process kept in procs: (process, url).
    new_session: in a process group of its own (to signal it whole, as systemd signals a unit)."""
    log = os.path.join(log_dir, f"serve{len(procs)}.log")
    p = subprocess.Popen([os.path.join(build_dir, "serve", "expert-serve"), "--port", "0", "--threads",
                          str(threads)] + extra, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                         start_new_session=new_session)
    procs.append(p)
    for _ in range(500):
        m = re.search(r"on http://127\.0\.0\.1:(\d+)", open(log).read())
        if m:
            url = f"http://127.0.0.1:{m.group(1)}"
            for _ in range(200):
                try:
                    urllib.request.urlopen(url + "/health", timeout=2)
                    return p, url
                except Exception:  # noqa: BLE001
                    time.sleep(0.05)
        if p.poll() is not None:
            break
        time.sleep(0.02)
    raise RuntimeError("expert-serve did not start: " + open(log).read())
