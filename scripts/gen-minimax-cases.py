#!/usr/bin/env python3
"""Reference logits for MiniMax-M2 (minimax-m2) and MiniMax-M3 (minimax-m3) test models, from
llama.cpp.

MiniMax-M2's cases: test-size synthetic models (`expert-pack synth --preset minimax-m2 --dims
...`: q/k norms over all heads, partial rotary, sigmoid routing with the selection bias).
MiniMax-M3's: each a test-size synthetic model (`expert-pack synth --preset minimax-m3 --dims ...`:
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

M2_CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "m2-f32": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "m2-f16": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "m2-q4_k": ["--dims", "256,4,8,2,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                "--seed", "3"],
}
CASES = {
    "m3-f32": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "m3-f16": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "m3-q4_k": ["--dims", "256,4,8,2,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                "--seed", "7"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], M2_CASES, N_PROMPT, N_GEN, preset="minimax-m2",
            only=set(sys.argv[3:]))
write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="minimax-m3",
            only=set(sys.argv[3:]), flash_attn=True)
