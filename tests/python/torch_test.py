#!/usr/bin/env python3
"""A PyTorch model served from the pack (expertd.torch) against a real expertd whose cache holds
fewer experts than the bundled model has: transformers' Qwen3-MoE built from the core GGUF, its
sparse blocks taking their experts from expertd (ExpertdMoE), no expert weights held. Checked:

- its logits equal, bit for bit, transformers' own model holding every expert (dequantized from
  the original GGUF by the same dequantizer): the storage path changes nothing;
- they are within 1e-3 of the float64 reference on the same dequantized weights (the shared
  tools' ref_numpy.py): what dequantizing Q8_0 to float32 in torch allows;
- beside `expert-run logits --local` (which quantizes activations to Q8_0 as llama.cpp does): the
  difference is printed, the argmax agrees wherever expert-run's top-2 margin is >= 0.3, and the
  median row's largest difference is <= 0.25 (the bundled model's export limits for Q8_0);
- Lease.torch: a torch.Tensor over the slot without a copy, holding the lease; done() refused
  while it lives and the slot unreadable after;
- two Python processes running the model and one expert-run share the one expertd at once, each
  process's logits equal to the solo run's.

The venv (build dir, python-torch-venv) gets torch, transformers and gguf from PyPI."""
import argparse
import copy
import hashlib
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from py_util import Packed, check, finish, in_package_venv, start_expertd  # noqa: E402
import py_util  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin", required=True)
ap.add_argument("--source", required=True)
ap.add_argument("--shared", required=True, help="the shared/ folder (tools/ref_numpy.py)")
args = ap.parse_args()
B, SRC = os.path.abspath(args.bin), os.path.abspath(args.source)
REF = os.path.join(os.path.abspath(args.shared), "tools", "ref_numpy.py")
in_package_venv(B, SRC, "python-torch-venv", ["torch>=2.4", "transformers>=5.0", "gguf>=0.10"])

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import expertd  # noqa: E402
from expertd.torch import ExpertdMoE, load_qwen3moe  # noqa: E402

torch.set_num_threads(2)


def raises(fn, words, what):
    py_util.raises(expertd.Error, fn, words, what)


def held_model(model, full_gguf):
    """transformers' own Qwen3-MoE with model's dense weights and every expert held, dequantized
    from the original GGUF by expertd.dequantize."""
    from transformers import Qwen3MoeForCausalLM
    cfg = copy.deepcopy(model.config)
    cfg._experts_implementation = "eager"  # the experts loop ExpertdMoE computes as
    ref = Qwen3MoeForCausalLM(cfg).eval()
    state = {k: v for k, v in model.state_dict().items()}
    tensors = {t.name: t for t in gguf.GGUFReader(full_gguf).tensors}

    def experts(name):
        t = tensors[name]
        ne0, ne1, ne2 = (int(x) for x in t.shape)
        raw = np.asarray(t.data).reshape(ne2 * ne1, -1)
        return torch.from_numpy(expertd.dequantize(raw, int(t.tensor_type), (ne2 * ne1, ne0))
                                .reshape(ne2, ne1, ne0))
    for i in range(cfg.num_hidden_layers):
        g, u = experts(f"blk.{i}.ffn_gate_exps.weight"), experts(f"blk.{i}.ffn_up_exps.weight")
        state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.cat([g, u], dim=1)
        state[f"model.layers.{i}.mlp.experts.down_proj"] = experts(f"blk.{i}.ffn_down_exps.weight")
    ref.load_state_dict(state, strict=True)
    return ref


# (the solo run's thread count: torch splits its float sums by threads, so another count may round
# differently: on an AMD EPYC 1 thread and 2 did)
CHILD = """
import hashlib, sys, torch, expertd
from expertd.torch import load_qwen3moe
torch.set_num_threads(2)
c = expertd.Client.connect(sys.argv[1], 'torch-child')
m = load_qwen3moe(sys.argv[2], c)
ids = torch.tensor([[int(x) for x in sys.argv[3].split(',')]])
with torch.no_grad():
    for _ in range(3):
        lg = m(ids).logits[0].float().numpy()
print(hashlib.sha256(lg.tobytes()).hexdigest())
"""

tmp = tempfile.mkdtemp(prefix="torch-test-", dir=B)
procs = []
try:
    pk = Packed(B, SRC, tmp)
    model_path, core, manifest = pk.gguf, pk.core, pk.manifest
    n_all = manifest["n_experts"] * len(manifest["layers"])
    slots = 48
    sock = os.path.join(tmp, "s.sock")
    procs.append(start_expertd(B, pk.manifest_path, sock, ["--cache-slots", str(slots),
                                                           "--clients-max", "6"]))
    er_bin = os.path.join(B, "engine", "expert-run")
    text = ("In the beginning God created the heaven and the earth. And the earth was without "
            "form, and void; and darkness was upon the face of the deep.")
    tok = subprocess.run([er_bin, "tokenize", "--text", text], capture_output=True, text=True,
                         check=True).stdout.split()
    ids = [int(t) for t in tok]
    ids_arg = ",".join(tok)

    c = expertd.Client.connect(sock, "torch-test")
    model = load_qwen3moe(core, c)
    blocks = [m for m in model.modules() if isinstance(m, ExpertdMoE)]
    n_params = sum(p.numel() for p in model.parameters())
    check(len(blocks) == len(manifest["layers"]) and
          not any("experts" in n for n, _ in model.named_parameters()),
          f"{len(blocks)} sparse blocks served by expertd, no expert weights held "
          f"({n_params / 1e6:.2f} M parameters held of the model's 14.45 M)")
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float().numpy()
    st = c.stats()
    check(slots < n_all and st["cache_misses"] > slots,
          f"the cache ({slots} slots) is smaller than the model ({n_all} experts): "
          f"{int(st['cache_misses'])} misses read from the pack in one forward")

    # transformers' own model holding every expert: the same bits.
    ref = held_model(model, model_path)
    with torch.no_grad():
        held = ref(torch.tensor([ids])).logits[0].float().numpy()
    check(np.array_equal(logits, held),
          f"logits equal transformers' own model holding the experts, bit for bit "
          f"(max |d| {np.abs(logits - held).max():.3g})")
    del ref

    # expert-run --local quantizes activations to Q8_0 (as llama.cpp): a larger, stated gap.
    er_path = os.path.join(tmp, "er.bin")
    subprocess.run([er_bin, "logits", "--model", model_path, "--local", "--tokens", ids_arg,
                    "--out", er_path], check=True, capture_output=True)
    er = np.fromfile(er_path, dtype=np.float32).reshape(len(ids), -1)
    d = np.abs(logits - er)
    top2 = np.sort(er, axis=1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) >= 0.3
    same = (logits.argmax(1) == er.argmax(1))
    check(bool(same[sure].all()) and np.median(d.max(1)) <= 0.25,
          f"beside expert-run --local: max |d| {d.max():.3g}, median row {np.median(d.max(1)):.3g}, "
          f"argmax equal {int(same.sum())}/{len(ids)} ({int(same[sure].sum())}/{int(sure.sum())} "
          "where the top-2 margin >= 0.3)")

    # float64 on the same dequantized weights (the shared tools; without them, said and skipped).
    if not os.path.exists(REF):
        print(f"skipped: the float64 checks ({REF} is not here)")
    else:
        ref64_path = os.path.join(tmp, "ref64.bin")
        subprocess.run([sys.executable, REF, model_path, "--tokens", ids_arg, "--out", ref64_path],
                       check=True, stdout=subprocess.DEVNULL)
        ref64 = np.fromfile(ref64_path, dtype=np.float64).reshape(len(ids), -1)
        d64 = np.abs(logits - ref64)
        check(d64.max() <= 1e-3, f"within 1e-3 of float64 on the dequantized weights: max |d| "
              f"{d64.max():.3g}, median row {np.median(d64.max(1)):.3g}")

        # ... and that gap is the activation quantization: expert-run against float64 that quantizes
        # activations as llama.cpp does (ref_numpy.py --mimic).
        mim_path = os.path.join(tmp, "mimic.bin")
        subprocess.run([sys.executable, REF, model_path, "--tokens", ids_arg, "--mimic", "--out",
                        mim_path], check=True, stdout=subprocess.DEVNULL)
        dm = np.abs(er - np.fromfile(mim_path, dtype=np.float64).reshape(len(ids), -1))
        check(dm.max() <= 1e-4, f"expert-run --local vs float64 with Q8_0 activations: max |d| "
              f"{dm.max():.3g} (the gap above is activation quantization)")

    # Lease.torch: the slot's memory, no copy.
    with c.acquire(0, [4, 7]) as lease:
        t = lease.torch(1)
        v = lease.view(1)
        check(isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and
              t.data_ptr() == v.ctypes.data and t.numel() == v.size,
              f"Lease.torch is the slot's memory ({t.numel()} bytes at the view's address)")
        g = lease.torch(0, "gate")
        role = c.info["layers"][0]["roles"][0]
        check(tuple(g.shape) == (role["shape"][0], role["shape"][1] // 32 * 34),
              f"Lease.torch(i, 'gate') is the role's rows {tuple(g.shape)}")
        del v
        raises(lambda: lease.done(1), ["array"], "done() while a tensor of the expert lives")
        del t
        lease.done(1)
        raises(lambda: lease.torch(1), ["done()"], "a handed-back expert's slot")
    kept = g  # a tensor holds the lease past the block
    raises(lambda: c.acquire(0, [1]), ["still held"], "a tensor holds its lease past the with block")
    del kept, g
    with c.acquire(0, [1]) as lease:
        check(len(lease) == 1, "acquire once the tensor is gone")

    # Bad input: a model of another architecture, a pack layer that is not there.
    other = os.path.join(os.path.abspath(args.shared), "golden", "cases", "gpt-oss-A-s1-f32",
                         "model.gguf")
    if os.path.exists(other):
        raises(lambda: load_qwen3moe(other, c), ["gpt-oss", "serve_experts"], "another architecture")
    raises(lambda: ExpertdMoE(c, len(manifest["layers"]), blocks[0].gate), ["no pack layer"],
           "a pack layer past the pack")

    # Two Python processes and expert-run on the one expertd at once.
    solo = hashlib.sha256(logits.tobytes()).hexdigest()
    kids = [subprocess.Popen([sys.executable, "-c", CHILD, sock, core, ids_arg],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    gen = subprocess.run([er_bin, "generate", "--model", core, "--socket", sock, "--prompt",
                          "And God said", "-n", "32", "--threads", "1"], capture_output=True,
                         text=True)
    outs = [k.communicate(timeout=600) for k in kids]
    check(gen.returncode == 0 and len(gen.stdout.strip()) > 0,
          f"expert-run beside them: {gen.stdout.strip()[:40]!r}")
    check([o[0].strip() for o in outs] == [solo, solo],
          "two Python processes' logits equal the solo run's: " +
          ", ".join(o[0].strip()[:12] or o[1].strip()[-200:] for o in outs))
    c.close()
finally:
    py_util.stop_all(procs, tmp)

finish()
