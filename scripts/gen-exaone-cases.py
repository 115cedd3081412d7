#!/usr/bin/env python3
"""Reference logits for K-EXAONE (exaone-moe) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset k-exaone-236b-a23b --dims
...`: sliding-window layers of 8 positions, rotated, and every 4th layer global with no position
encoding, a dense lead layer, sigmoid routing beside a shared expert, the MTP layer) and
llama.cpp's teacher-forced logits on it (see scripts/synth_cases.py).

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-exaone-cases.py build/pack/expert-pack tests/data/exaone [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "exaone-f32": ["--dims", "128,5,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "exaone-f16": ["--dims", "128,5,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "exaone-q4_k": ["--dims", "256,5,8,2,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                    "--seed", "3"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="k-exaone-236b-a23b",
            only=set(sys.argv[3:]))
