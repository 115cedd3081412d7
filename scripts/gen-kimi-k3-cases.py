#!/usr/bin/env python3
"""Reference logits for Kimi-K3 (kimi-k3) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset kimi-k3 --dims ...`: KDA,
MLA, attention residuals, latent MoE, situ, a dense lead layer) and llama.cpp's teacher-forced
logits on it, in the golden data's format (../shared/golden/README.md): the prompt in one batch,
then llama.cpp's greedy tokens one at a time. The tests regenerate the model from the recipe in
case.json (synth is deterministic) and compare, so CI needs no llama.cpp.

Needs llama-cpp-python 0.3.36 (it knows kimi-k3) and a build of expert-pack:
    python3 scripts/gen-kimi-k3-cases.py build/pack/expert-pack tests/data/kimi-k3
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "k3-f32": ["--dims", "64,5,8,2,32,4,1,512", "--type", "F32", "--seed", "1"],
    "k3-q8_0": ["--dims", "512,5,8,2,256,8,1,512", "--type", "Q8_0", "--seed", "2"],
    # Kimi-K3's expert mix (Q2_K gate/up, Q3_K down); the rest Q2_K where rows allow, else Q8_0
    "k3-q2_k": ["--dims", "512,5,8,2,256,8,1,512", "--type", "Q2_K", "--down-type", "Q3_K",
                "--seed", "6"],
}
N_PROMPT, N_GEN = 12, 8


write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="kimi-k3", seed=11)
