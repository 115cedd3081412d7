"""What the expert-serve tests share: the venv with the official clients they are written
against (made under the build directory, then the test re-runs itself in it), a check that
records failures, and starting a server on a free port once it answers /health."""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
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


def start_expertd(build_dir, manifest, sock, procs, extra=()):
    """expertd serving MANIFEST on SOCK (a flags-only config beside it, its log at SOCK.log) with
    EXTRA flags, its process kept in procs, once it accepts connections."""
    conf = sock + ".conf"
    open(conf, "w").write("# flags only\n")
    p = subprocess.Popen([os.path.join(build_dir, "daemon", "expertd"), "--manifest", manifest, "--socket", sock,
                          "--config", conf, "--lock-memory", "false", "--reserve-mib", "64"] + list(extra),
                         stdout=open(sock + ".log", "a"), stderr=subprocess.STDOUT)
    procs.append(p)
    for _ in range(500):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            return p
        except OSError:
            if p.poll() is not None:
                break
            time.sleep(0.02)
    raise RuntimeError("expertd did not start: " + open(sock + ".log").read())


# --- Shared by the fleet tests (gateways, Anthropic through a proxy, KV events) ---

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests


def install_venv_package(venv, package, exe):
    """`package` from PyPI in its own venv (made once; a .ready file marks it whole); the path of
    its `exe`. A package that cannot be installed skips the test (exit SKIP), saying why."""
    path = os.path.join(venv, "bin", exe)
    if os.path.exists(os.path.join(venv, ".ready")):
        return path
    shutil.rmtree(venv, ignore_errors=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", venv], check=True, capture_output=True, text=True)
        subprocess.run([os.path.join(venv, "bin", "pip"), "install", "-q", "--disable-pip-version-check",
                        package], check=True, capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        out = getattr(e, "stderr", "") or ""
        print(f"SKIP: cannot install {package} into a venv: {e}\n{out[-2000:]}", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        sys.exit(SKIP)
    open(os.path.join(venv, ".ready"), "w").close()
    return path


def http(url, body=None, timeout=120, headers=None, method=None):
    """(status, text, headers) of one request, JSON `body` if given; status None where no answer
    came (refused, reset, timed out)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers=dict({"Content-Type": "application/json"} if data else {},
                                              **(headers or {})))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as e:
        return None, repr(e), {}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(pred, seconds, step=0.1):
    end = time.time() + seconds
    while time.time() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def cached(usage):
    """The prompt tokens an OpenAI usage object says came from the cache."""
    return ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
