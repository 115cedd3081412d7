#!/usr/bin/python3
"""Exports the trained model (checkpoint.pt + tokenizer.json) to GGUF, F16 or Q8_0, with the
metadata llama.cpp needs to load a qwen3moe model.

    /usr/bin/python3 model/export_gguf.py --build model/build --type Q8_0 --out model/kjv-moe-q8_0.gguf
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

GGML = {"F32": 0, "F16": 1, "Q8_0": 8}
FILE_TYPE = {"F16": 1, "Q8_0": 7}


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """Rows of float32 -> Q8_0 blocks (fp16 d = amax/127, int8 q = round(x/d)), as raw bytes."""
    rows = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(rows).max(axis=1, keepdims=True)
    d = (amax / 127.0).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d > 0, np.round(rows / d), 0).clip(-127, 127).astype(np.int8)
    out = np.empty((rows.shape[0], 34), dtype=np.uint8)
    out[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    out[:, 2:] = q.view(np.uint8)
    return out


def dequantize(kind: str, x: np.ndarray) -> np.ndarray:
    """What a reader of the GGUF gets back (for checking the export against PyTorch)."""
    if kind == "F32":
        return x.astype(np.float32)
    if kind == "F16":
        return x.astype(np.float16).astype(np.float32)
    blocks = quantize_q8_0(x)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
    return (q * d).reshape(x.shape)


GGML_NAMES = {v: k for k, v in GGML.items()}
BLOCK = {"F32": (1, 4), "F16": (1, 2), "Q8_0": (32, 34)}  # (elements, bytes) per block
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    """A GGUF file as written here (v3, F32 / F16 / Q8_0 tensors): kv maps each key to its value,
    raw_kv to its encoded entry (to copy it verbatim); tensors maps each name to (type, ne, bytes)."""

    def __init__(self, path: str):
        data = open(path, "rb").read()
        magic, version, n_t, n_kv = struct.unpack_from("<4sIQQ", data, 0)
        assert magic == b"GGUF" and version == 3, path
        self.kv, self.raw_kv, self.tensors = {}, {}, {}
        self._d, pos = data, 24
        for _ in range(n_kv):
            start = pos
            key, pos = self._str(pos)
            (t,), pos = struct.unpack_from("<I", data, pos), pos + 4
            self.kv[key], pos = self._val(t, pos)
            self.raw_kv[key] = data[start:pos]
        infos = []
        for _ in range(n_t):
            name, pos = self._str(pos)
            (nd,) = struct.unpack_from("<I", data, pos)
            ne = list(struct.unpack_from(f"<{nd}Q", data, pos + 4))
            t, off = struct.unpack_from("<IQ", data, pos + 4 + 8 * nd)
            pos += 4 + 8 * nd + 12
            infos.append((name, GGML_NAMES[t], ne, off))
        align = self.kv.get("general.alignment", 32)
        base = (pos + align - 1) // align * align
        for name, t, ne, off in infos:
            per, nbytes = BLOCK[t]
            size = int(np.prod(ne)) // per * nbytes
            self.tensors[name] = (t, ne, data[base + off:base + off + size])

    def _str(self, pos):
        (n,) = struct.unpack_from("<Q", self._d, pos)
        return self._d[pos + 8:pos + 8 + n].decode("utf-8"), pos + 8 + n

    def _val(self, t, pos):
        if t == 8:
            return self._str(pos)
        if t == 9:
            et, n = struct.unpack_from("<IQ", self._d, pos)
            pos += 12
            out = []
            for _ in range(n):
                v, pos = self._val(et, pos)
                out.append(v)
            return out, pos
        f = _SCALAR[t]
        (v,) = struct.unpack_from(f, self._d, pos)
        return (bool(v) if t == 7 else v), pos + struct.calcsize(f)

    def array(self, name: str) -> np.ndarray:
        """A tensor as float32 in PyTorch layout (..., out, in): what llama.cpp computes with."""
        t, ne, raw = self.tensors[name]
        shape = tuple(reversed(ne))
        if t == "F32":
            return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
        if t == "F16":
            return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(shape)


class Writer:
    def __init__(self):
        self.kv = bytearray()
        self.n_kv = 0
        self.tensors = []  # (name, ggml_type, ne, bytes)

    def raw_kv(self, entry: bytes):
        """An entry as Reader.raw_kv holds it, copied verbatim."""
        self.kv += entry
        self.n_kv += 1

    def _s(self, s: str) -> bytes:
        b = s.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    def key(self, k, t):
        self.kv += self._s(k) + struct.pack("<I", t)
        self.n_kv += 1

    def u32(self, k, v):
        self.key(k, 4)
        self.kv += struct.pack("<I", v)

    def f32(self, k, v):
        self.key(k, 6)
        self.kv += struct.pack("<f", v)

    def bool(self, k, v):
        self.key(k, 7)
        self.kv += struct.pack("<B", 1 if v else 0)

    def string(self, k, v):
        self.key(k, 8)
        self.kv += self._s(v)

    def strings(self, k, vs):
        self.key(k, 9)
        self.kv += struct.pack("<IQ", 8, len(vs)) + b"".join(self._s(v) for v in vs)

    def i32s(self, k, vs):
        self.key(k, 9)
        self.kv += struct.pack("<IQ", 5, len(vs)) + np.asarray(vs, dtype="<i4").tobytes()

    def tensor(self, name, kind, arr: np.ndarray):
        """arr in PyTorch layout (..., out, in); GGUF ne is the reverse."""
        ne = list(reversed(arr.shape))
        if kind == "F32":
            data = arr.astype("<f4").tobytes()
        elif kind == "F16":
            data = arr.astype("<f2").tobytes()
        else:
            data = quantize_q8_0(arr).tobytes()
        self.tensors.append((name, GGML[kind], ne, data))

    def raw_tensor(self, name, kind, ne, data: bytes):
        """A tensor as Reader.tensors holds it (type name, ne, bytes), copied bit for bit."""
        self.tensors.append((name, GGML[kind], list(ne), data))

    def write(self, path, alignment=32):
        info = bytearray()
        offset = 0
        offsets = []
        for name, t, ne, data in self.tensors:
            offsets.append(offset)
            info += self._s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
            info += struct.pack("<IQ", t, offset)
            offset += (len(data) + alignment - 1) // alignment * alignment
        head = b"GGUF" + struct.pack("<IQQ", 3, len(self.tensors), self.n_kv) + bytes(self.kv) + bytes(info)
        pad = (alignment - len(head) % alignment) % alignment
        with open(path + ".tmp", "wb") as f:
            f.write(head + b"\0" * pad)
            for (_, _, _, data), off in zip(self.tensors, offsets):
                f.write(data)
                f.write(b"\0" * ((alignment - len(data) % alignment) % alignment))
        os.replace(path + ".tmp", path)


def export(build: str, kind: str, out: str):
    ck = torch.load(os.path.join(build, "checkpoint.pt"), map_location="cpu")
    c, st = ck["config"], ck["state"]
    tok = json.load(open(os.path.join(build, "tokenizer.json")))
    a = "qwen3moe"
    w = Writer()
    w.string("general.architecture", a)
    w.string("general.name", "expertd KJV MoE 14M")
    w.u32("general.file_type", FILE_TYPE[kind])
    w.u32("general.alignment", 32)
    w.u32(f"{a}.context_length", c["n_ctx"])
    w.u32(f"{a}.embedding_length", c["n_embd"])
    w.u32(f"{a}.block_count", c["n_layer"])
    w.u32(f"{a}.feed_forward_length", c["n_ff_exp"])
    w.u32(f"{a}.expert_feed_forward_length", c["n_ff_exp"])
    w.u32(f"{a}.attention.head_count", c["n_head"])
    w.u32(f"{a}.attention.head_count_kv", c["n_head_kv"])
    w.u32(f"{a}.attention.key_length", c["head_dim"])
    w.u32(f"{a}.attention.value_length", c["head_dim"])
    w.f32(f"{a}.rope.freq_base", c["rope_base"])
    w.f32(f"{a}.attention.layer_norm_rms_epsilon", c["eps"])
    w.u32(f"{a}.expert_count", c["n_expert"])
    w.u32(f"{a}.expert_used_count", c["n_expert_used"])
    tokens = tok["tokens"]
    eot = tokens.index("<|endoftext|>")
    w.string("tokenizer.ggml.model", "gpt2")
    w.string("tokenizer.ggml.pre", tok["pre"])
    w.strings("tokenizer.ggml.tokens", tokens)
    w.i32s("tokenizer.ggml.token_type", [3 if t == "<|endoftext|>" else 1 for t in tokens])
    w.strings("tokenizer.ggml.merges", tok["merges"])
    w.u32("tokenizer.ggml.bos_token_id", eot)
    w.u32("tokenizer.ggml.eos_token_id", eot)
    w.bool("tokenizer.ggml.add_bos_token", False)
    n = lambda t: t.detach().float().numpy()
    mat = kind  # weight matrices in the chosen type; norms and the router stay F32 (as llama.cpp does)
    w.tensor("token_embd.weight", mat, n(st["tok"]))
    w.tensor("output_norm.weight", "F32", n(st["out_norm"]))
    w.tensor("output.weight", mat, n(st["tok"]))
    for i in range(c["n_layer"]):
        p, q = f"blk.{i}.", f"layers.{i}."
        w.tensor(p + "attn_norm.weight", "F32", n(st[q + "attn_norm"]))
        w.tensor(p + "attn_q.weight", mat, n(st[q + "wq"]))
        w.tensor(p + "attn_k.weight", mat, n(st[q + "wk"]))
        w.tensor(p + "attn_v.weight", mat, n(st[q + "wv"]))
        w.tensor(p + "attn_q_norm.weight", "F32", n(st[q + "q_norm"]))
        w.tensor(p + "attn_k_norm.weight", "F32", n(st[q + "k_norm"]))
        w.tensor(p + "attn_output.weight", mat, n(st[q + "wo"]))
        w.tensor(p + "ffn_norm.weight", "F32", n(st[q + "ffn_norm"]))
        w.tensor(p + "ffn_gate_inp.weight", "F32", n(st[q + "router"]))
        w.tensor(p + "ffn_gate_exps.weight", mat, n(st[q + "gate"]))
        w.tensor(p + "ffn_up_exps.weight", mat, n(st[q + "up"]))
        w.tensor(p + "ffn_down_exps.weight", mat, n(st[q + "down"]))
    w.write(out)
    print(f"wrote {out} ({os.path.getsize(out)} bytes, {kind})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="model/build")
    ap.add_argument("--type", choices=["F16", "Q8_0"], default="Q8_0")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    export(args.build, args.type, args.out)


if __name__ == "__main__":
    main()
