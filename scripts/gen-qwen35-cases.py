#!/usr/bin/env python3
"""Reference logits for Qwen3.5-MoE (qwen35moe) and Qwen3-Next (qwen3next) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset qwen3.5-397b-a17b |
qwen3-next-80b-a3b --dims ...`: gated delta-net layers three in four with 2 key heads for 4 value
heads, gated full attention every fourth layer, partial rotary, a gated shared expert) and
llama.cpp's teacher-forced logits on it, in the golden data's format (../shared/golden/README.md):
a 40-token prompt in one batch, then llama.cpp's greedy tokens one at a time. The tests
regenerate the model from the recipe in case.json (synth is deterministic) and compare, so CI
needs no llama.cpp.

Needs llama-cpp-python 0.3.36 (it knows both architectures) and a build of expert-pack:
    python3 scripts/gen-qwen35-cases.py build/pack/expert-pack tests/data/qwen35
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "q35-f32": ["--preset", "qwen3.5-397b-a17b", "--dims", "128,5,8,2,64,2,1,512", "--type", "F32",
                "--seed", "1"],
    "q35-f16": ["--preset", "qwen3.5-397b-a17b", "--dims", "128,5,8,2,64,2,1,512", "--type", "F16",
                "--seed", "3"],
    # Q4_K_M's mix: Q4_K, the experts' down Q6_K
    "q35-q4_k": ["--preset", "qwen3.5-397b-a17b", "--dims", "256,5,8,2,256,2,1,512", "--type",
                 "Q4_K", "--down-type", "Q6_K", "--seed", "4"],
    "next-f32": ["--preset", "qwen3-next-80b-a3b", "--dims", "128,5,8,2,64,2,1,512", "--type",
                 "F32", "--seed", "2"],
    "next-q8_0": ["--preset", "qwen3-next-80b-a3b", "--dims", "256,5,8,2,256,2,1,512", "--type",
                  "Q8_0", "--seed", "5"],
}
N_PROMPT, N_GEN = 40, 8


write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, only=set(sys.argv[3:]))
