"""What the Python package's tests (and bench/torch_model.py) share: the venv the package is built
into (made under the build directory, the package reinstalled from this tree each run, then the
script re-runs itself in it), a check that records failures, the bundled model packed into a
temporary folder, and an expertd started on a socket once it listens."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time


def in_package_venv(build_dir, source, name, requirements, defines=()):
    """Re-runs the calling script in build_dir/NAME with REQUIREMENTS from PyPI (installed once)
    and the expertd package built from SOURCE/python (incrementally, in build_dir/NAME-build;
    DEFINES are CMake definitions such as EXPERTD_PY_CUDA=EMU)."""
    venv = os.path.join(build_dir, name)
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if not os.path.exists(os.path.join(venv, ".ready")):
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
        subprocess.check_call(pip + ["scikit-build-core>=0.10", "nanobind>=2.0", "numpy>=1.22"] +
                              list(requirements))
        open(os.path.join(venv, ".ready"), "w").close()
    cmake = [a for d in defines for a in ("-C", "cmake.define." + d)]
    subprocess.check_call(pip + ["--no-build-isolation", "--force-reinstall", "--no-deps", "-C",
                                 "build-dir=" + os.path.join(build_dir, name + "-build")] + cmake +
                          [os.path.join(source, "python")])
    os.execv(py, [py] + sys.argv)


failures = []


def check(cond, what):
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if not cond:
        failures.append(what)


def raises(error, fn, words, what):
    """Checks that fn() raises ERROR whose message holds every one of WORDS."""
    try:
        fn()
    except error as e:
        check(all(w in str(e) for w in words), f"{what}: {e}")
        return
    except Exception as e:  # noqa: BLE001
        check(False, f"{what}: raised {type(e).__name__}: {e}, not {error.__name__}")
        return
    check(False, f"{what}: did not raise")


def finish():
    if failures:
        print(f"{len(failures)} failed: " + "; ".join(failures))
        sys.exit(1)
    print("all checks passed")


class Packed:
    """The bundled model copied to DIR/m.gguf and packed: gguf, core, manifest_path, manifest."""

    def __init__(self, build_dir, source, tmp):
        self.gguf = os.path.join(tmp, "m.gguf")
        shutil.copy(os.path.join(source, "model", "kjv-moe-q8_0.gguf"), self.gguf)
        subprocess.run([os.path.join(build_dir, "pack", "expert-pack"), "-q", "build", self.gguf],
                       check=True, stdout=subprocess.DEVNULL)
        self.core = os.path.join(tmp, "m.core.gguf")
        self.manifest_path = os.path.join(tmp, "m.manifest.json")
        self.manifest = json.load(open(self.manifest_path))
        self.pack_file = os.path.join(tmp, self.manifest["pack_file"])


def start_expertd(build_dir, manifest_path, sock, flags, exe="expertd"):
    """build_dir/daemon/EXE on SOCK (no config file of its own, no locked memory) with FLAGS,
    returned once it accepts connections; its log is SOCK.log."""
    open(sock + ".conf", "w").write("# flags only\n")
    d = subprocess.Popen([os.path.join(build_dir, "daemon", exe), "--manifest", manifest_path,
                          "--socket", sock, "--config", sock + ".conf", "--lock-memory", "false",
                          "--reserve-mib", "16"] + list(flags),
                         stdout=open(sock + ".log", "w"), stderr=subprocess.STDOUT)
    for _ in range(1000):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            s.close()
            return d
        except OSError:
            if d.poll() is not None:
                raise RuntimeError(f"{exe} did not start: " + open(sock + ".log").read())
            time.sleep(0.02)
    d.terminate()
    raise RuntimeError(f"{exe} did not listen on {sock} in 20 s: " + open(sock + ".log").read())


def stop_all(procs, tmp):
    """Ends each started process of PROCS (None: not started) and removes the folder TMP."""
    for p in procs:
        if p is not None:
            p.terminate()
            p.wait(timeout=30)
    shutil.rmtree(tmp, ignore_errors=True)
