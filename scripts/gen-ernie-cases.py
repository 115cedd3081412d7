#!/usr/bin/env python3
"""Reference logits for ERNIE 4.5 MoE (ernie4_5-moe) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset ernie-4.5-300b-a47b --dims
...`: Llama-style attention, a dense lead layer, softmax routing beside two shared experts) and
llama.cpp's teacher-forced logits on it (see scripts/synth_cases.py).

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-ernie-cases.py build/pack/expert-pack tests/data/ernie [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "ernie-f32": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "ernie-f16": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "ernie-q4_k": ["--dims", "256,4,8,2,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                   "--seed", "3"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="ernie-4.5-300b-a47b",
            only=set(sys.argv[3:]))
