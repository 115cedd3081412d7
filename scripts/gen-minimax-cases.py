#!/usr/bin/env python3
"""Reference logits for MiniMax-M3 (minimax-m3) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset minimax-m3 --dims ...`:
grouped-query attention with per-head q/k norms and partial rotary, a dense lead layer, sigmoid
routing beside a shared expert, swiglu_oai FFNs, and MiniMax Sparse Attention over blocks of 4
positions picking 4, one of them local, so that a 40-token prompt attends sparsely from its 17th
token) and llama.cpp's teacher-forced logits on it (see scripts/synth_cases.py), with flash
attention on: llama.cpp runs MSA only then (without it, dense attention and a warning).

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-minimax-cases.py build/pack/expert-pack tests/data/minimax [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "m3-f32": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "m3-f16": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "m3-q4_k": ["--dims", "256,4,8,2,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                "--seed", "7"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="minimax-m3",
            only=set(sys.argv[3:]), flash_attn=True)
