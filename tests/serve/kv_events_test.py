#!/usr/bin/env python3
"""The prefix cache's block events (docs/fleet.md "KV events"): a real expert-serve with
--kv-events-endpoint on a real expertd, a real ZMQ subscriber (pyzmq) decoding each batch with
msgspec structs declared as vLLM declares them (vllm/distributed/kv_events.py: array_like,
tagged), the frames as vLLM's ZmqEventPublisher sends them (topic, 8-byte big-endian sequence,
payload).

Checked: every batch decodes as a KVEventBatch; the sequence numbers count up by one; each
BlockStored's hashes are the chained xxh3 of its tokens (seeded with its parent), its parent a
block stored before; each BlockRemoved names blocks stored and not yet removed; the events
predict the cache: a prompt whose first block the subscriber holds resumes (cached_tokens), one
whose blocks were removed does not; turn 2 of a conversation resumes at least the blocks its
turn 1 stored; SIGTERM ends with AllBlocksCleared. Bad uses are errors naming the flag. Skipped
(77) only where expert-serve was built without libzmq (it says so).

Usage: kv_events_test.py --bin BUILD_DIR --source SOURCE_DIR
"""
import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
args = ap.parse_args()

from serve_util import check, failures, free_port  # noqa: E402
import serve_util  # noqa: E402

B = os.path.abspath(args.bin)
SRC = os.path.abspath(args.source)
# The subscriber's packages, pinned (PyPI): pyzmq, msgspec (vLLM's encoder), xxhash, openai.
PKGS = ["pyzmq==27.3.0", "msgspec==0.23.0", "xxhash==4.1.0", "openai==3.57.0"]
VENV = os.path.join(B, "kv-events-venv-pyzmq27.3-msgspec0.23")


def in_venv():
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(os.path.join(VENV, ".ready")):
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.check_call([sys.executable, "-m", "venv", VENV])
        subprocess.check_call([py, "-m", "pip", "install", "-q", "--disable-pip-version-check"] + PKGS)
        open(os.path.join(VENV, ".ready"), "w").close()
    os.execv(py, [py] + sys.argv)


in_venv()

import msgspec  # noqa: E402
import openai  # noqa: E402
import xxhash  # noqa: E402
import zmq  # noqa: E402


# As vLLM declares them (vllm/distributed/kv_events.py), decoded the way its consumers do.
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
MODEL = os.path.join(SRC, "model", "kjv-moe-q8_0.gguf")
QWEN3 = os.path.join(SRC, "tests", "data", "templates", "Qwen-Qwen3-0.6B.jinja")
TOPIC = b"kv@expert-serve"
tmp = tempfile.mkdtemp(prefix="kv-events-test-", dir=B)
procs = []


def chain(parent, tokens, size):
    """The prefix cache's block hashes: xxh3 of each block's int32 tokens, seeded with the last."""
    out, seed = [], parent or 0
    for b in range(len(tokens) // size):
        seed = xxhash.xxh3_64_intdigest(b"".join(t.to_bytes(4, "little") for t in tokens[b * size:(b + 1) * size]),
                                        seed=seed)
        out.append(seed)
    return out


class Subscriber:
    def __init__(self, url):
        self.sock = zmq.Context.instance().socket(zmq.SUB)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(url)
        self.seq = None
        self.live = {}  # block hash -> parent
        self.removed = set()
        self.batches = 0
        self.bad = []

    def drain(self, quiet_s=0.6):
        """Every batch until none came for quiet_s: the events, in order."""
        got = []
        while self.sock.poll(int(quiet_s * 1000)):
            frames = self.sock.recv_multipart()
            if len(frames) != 3 or frames[0] != TOPIC or len(frames[1]) != 8:
                self.bad.append(f"frames {[len(f) for f in frames]}, topic {frames[0]!r}")
                continue
            seq = int.from_bytes(frames[1], "big")
            if self.seq is not None and seq != self.seq + 1:
                self.bad.append(f"sequence {seq} after {self.seq}")
            self.seq = seq
            batch = decoder.decode(frames[2])
            self.batches += 1
            if abs(batch.ts - time.time()) > 60:
                self.bad.append(f"ts {batch.ts}")
            for e in batch.events:
                self.apply(e)
                got.append(e)
        return got

    def apply(self, e):
        if isinstance(e, BlockStored):
            if e.block_size != 64 or len(e.token_ids) != 64 * len(e.block_hashes) or e.lora_id is not None:
                self.bad.append(f"BlockStored shape: {len(e.block_hashes)} blocks, {len(e.token_ids)} tokens")
            if chain(e.parent_block_hash, e.token_ids, 64) != e.block_hashes:
                self.bad.append("BlockStored hashes are not the chained xxh3 of its tokens")
            if e.parent_block_hash is not None and e.parent_block_hash not in self.live:
                self.bad.append(f"BlockStored parent {e.parent_block_hash:x} unknown")
            parent = e.parent_block_hash
            for h in e.block_hashes:
                self.live[h] = parent
                parent = h
        elif isinstance(e, BlockRemoved):
            for h in e.block_hashes:
                if h not in self.live:
                    self.bad.append(f"BlockRemoved {h:x} not stored")
                self.live.pop(h, None)
                self.removed.add(h)
        else:
            self.live.clear()

    def depth(self, h):
        n = 0
        while h is not None and h in self.live:
            n, h = n + 1, self.live[h]
        return n


def run_fail(extra):
    r = subprocess.run([os.path.join(B, "serve", "expert-serve"), "--port", "0"] + extra, capture_output=True,
                       text=True, timeout=60)
    return r.returncode, r.stderr


try:
    shutil.copy(MODEL, os.path.join(tmp, "kjv.gguf"))
    subprocess.run([os.path.join(B, "pack", "expert-pack"), "-q", "build", os.path.join(tmp, "kjv.gguf")], check=True,
                   capture_output=True)
    sock = os.path.join(tmp, "d.sock")
    open(sock + ".conf", "w").write("# flags only\n")
    procs.append(subprocess.Popen([os.path.join(B, "daemon", "expertd"), "--manifest",
                                   os.path.join(tmp, "kjv.manifest.json"), "--socket", sock, "--config",
                                   sock + ".conf", "--lock-memory", "false", "--reserve-mib", "64", "--cache-slots",
                                   "64"], stdout=open(sock + ".log", "w"), stderr=subprocess.STDOUT))
    for _ in range(500):
        if os.path.exists(sock):
            break
        time.sleep(0.02)
    base = ["--model", os.path.join(tmp, "kjv.core.gguf"), "--socket", sock, "--alias", "kjv", "--ctx", "1024",
            "--chat-template", QWEN3]

    # A build without libzmq says so for any endpoint: a visible skip, not a failure.
    rc, err = run_fail(base + ["--kv-events-endpoint", "bogus://probe"])
    if "built without libzmq" in err:
        print(f"SKIP: {err.strip()}")
        sys.exit(77)
    # Bad uses: errors that name the cause.
    taken = socket.socket()
    taken.bind(("0.0.0.0", 0))
    taken.listen()
    for endpoint, extra, words in [
            ("tcp://*:" + str(free_port()), ["--workers", "2"], "--workers"),
            ("tcp://*:" + str(free_port()), ["--prefix-cache-mib", "0"], "--prefix-cache-mib"),
            ("tcp://*:" + str(taken.getsockname()[1]), [], "cannot bind"),
            ("bogus://somewhere", [], "cannot connect")]:
        rc, err = run_fail(base + ["--kv-events-endpoint", endpoint] + extra)
        check(rc != 0 and "--kv-events-endpoint" in err and words in err,
              f"--kv-events-endpoint {endpoint} {' '.join(extra)}: exit {rc}, {err.strip()[-160:]!r}")
    taken.close()

    port = free_port()
    # A RAM tier of 4 MiB: a few prompts' states, so later ones evict earlier ones.
    p, u = serve_util.start_serve(B, tmp, procs, base + ["--parallel", "1", "--prefix-cache-mib", "4",
                                                         "--kv-events-endpoint", f"tcp://*:{port}",
                                                         "--kv-events-topic", TOPIC.decode()])
    sub = Subscriber(f"tcp://127.0.0.1:{port}")
    time.sleep(0.5)  # a SUB socket misses what was sent before it joined (ZMQ's slow joiner)
    oa = openai.OpenAI(base_url=u + "/v1", api_key="none", max_retries=0, timeout=300)

    def ask(messages, n=12):
        r = oa.chat.completions.create(model="kjv", messages=messages, max_tokens=n, temperature=0)
        return r, sub.drain()

    # A conversation: turn 1 stores its blocks, turn 2 resumes at least them.
    conv = [{"role": "system", "content": "You are a scribe of the old books. " * 20},
            {"role": "user", "content": "Tell me of Moses and the people."}]
    r1, ev1 = ask(conv)
    stored1 = [e for e in ev1 if isinstance(e, BlockStored)]
    check(len(stored1) >= 1 and stored1[0].parent_block_hash is None,
          f"turn 1 ({r1.usage.prompt_tokens} prompt tokens): BlockStored from the prompt's first block "
          f"({sum(len(e.block_hashes) for e in stored1)} blocks in {len(stored1)} events)")
    first_a = stored1[0].block_hashes[0] if stored1 else None
    deepest = max((e.block_hashes[-1] for e in stored1), key=sub.depth, default=None)
    held = sub.depth(deepest)
    conv2 = conv + [{"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": "And then?"}]
    r2, ev2 = ask(conv2)
    c2 = r2.usage.prompt_tokens_details.cached_tokens
    check(held >= 2 and c2 >= 64 * held,
          f"turn 2 resumes {c2} tokens, at least the {held} blocks the events said the worker holds")

    # Other prompts until the 4 MiB evict: every prompt's first block is tracked, and the events
    # predict each resend's resume.
    firsts = {"a": first_a}
    for k in range(8):
        _, ev = ask([{"role": "user", "content": f"Psalm {k}: " + "Praise ye the Lord, sing unto him. " * 20}])
        st = [e for e in ev if isinstance(e, BlockStored) and e.parent_block_hash is None]
        firsts[k] = st[0].block_hashes[0] if st else None
    check(all(v is not None for v in firsts.values()), "each new prompt stored its first block")
    check(len(sub.removed) > 0, f"the budget evicted: BlockRemoved for {len(sub.removed)} blocks")
    check(first_a in sub.removed, "conversation a's first block was among them (least recently used)")
    right = 0
    for key in ["a", 0, 7]:
        held_now = firsts[key] in sub.live
        msgs = conv2 if key == "a" else [{"role": "user", "content": f"Psalm {key}: " +
                                          "Praise ye the Lord, sing unto him. " * 20}]
        r, _ = ask(msgs)
        c = r.usage.prompt_tokens_details.cached_tokens
        ok = (c >= 64) == held_now
        right += ok
        check(ok, f"prompt {key}: the events say {'held' if held_now else 'evicted'}, it resumed {c} tokens")
    check(not sub.bad, f"every batch decoded as vLLM's and was consistent ({sub.batches} batches; {sub.bad[:3]})")

    # SIGTERM: the RAM tier goes with the process, the last batch says so.
    p.send_signal(signal.SIGTERM)
    check(p.wait(timeout=60) == 0, "SIGTERM: exit 0")
    last = sub.drain(1.0)
    check(len(last) >= 1 and isinstance(last[-1], AllBlocksCleared) and not sub.live,
          f"the last event is AllBlocksCleared ({[type(e).__name__ for e in last]})")
finally:
    for q in procs:
        if q.poll() is None:
            q.kill()
        q.wait()

if failures:
    print(f"{len(failures)} check(s) failed; logs in {tmp}")
    sys.exit(1)
shutil.rmtree(tmp, ignore_errors=True)
print("all KV-event checks passed")
