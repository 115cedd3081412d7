#!/usr/bin/env python3
"""Reference logits for Step 3.5 (step35) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset step-3.7-flash --dims
...`: 4 query heads on global layers and 8 on sliding ones, windows of 8, half of each head rotated
on global layers and all of it on sliding ones at their own bases, per-head sigmoid gates, a dense
lead layer, sigmoid routing beside a shared expert with SwiGLU clamps, 3 MTP blocks llama.cpp
loads and skips) and llama.cpp's teacher-forced logits on it (see scripts/synth_cases.py). Six
layers: two global ones.

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-step-cases.py build/pack/expert-pack tests/data/step [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "step-f32": ["--dims", "128,6,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "step-f16": ["--dims", "128,6,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "step-q4_k": ["--dims", "256,6,8,2,256,4,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                 "--seed", "3"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="step-3.7-flash",
            only=set(sys.argv[3:]))
