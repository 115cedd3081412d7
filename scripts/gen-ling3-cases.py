#!/usr/bin/env python3
"""Reference logits for Ling 3.0 (bailingmoe3) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset ling-3.0-flash --dims ...`:
KDA layers with the decay rate stored as exp(A_log), latent attention with RoPE and a sigmoid gate
per head every fourth layer and on the tail, a dense lead layer, sigmoid routing with the
selection bias in 2 of 4 expert groups beside a shared expert, SwiGLU clamps, a NextN block) and
llama.cpp's teacher-forced logits on it (see scripts/synth_cases.py).

Needs llama-cpp-python 0.3.36 (it knows bailingmoe3) and a build of expert-pack:
    python3 scripts/gen-ling3-cases.py build/pack/expert-pack tests/data/ling3 [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "ling3-f32": ["--dims", "64,5,8,2,32,4,1,512", "--type", "F32", "--seed", "1"],
    "ling3-f16": ["--dims", "128,5,8,2,64,4,1,512", "--type", "F16", "--seed", "2"],
    # Q4_K_M's mix: Q4_K, the experts' down projections Q6_K; Q8_0 where rows do not divide
    "ling3-q4_k": ["--dims", "256,5,8,2,256,4,1,512", "--type", "Q4_K", "--down-type", "Q6_K",
                   "--seed", "3"],
}
N_PROMPT, N_GEN = 24, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="ling-3.0-flash",
            only=set(sys.argv[3:]))
