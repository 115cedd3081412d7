#!/usr/bin/env python3
"""Reference logits for Hy3 (hy_v3) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset hy3 --dims ...`:
per-head q/k norms, a dense lead layer, sigmoid routing with the selection bias beside a shared
expert, an MTP block llama.cpp loads and skips) and llama.cpp's teacher-forced logits on it (see scripts/synth_cases.py).

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-hy3-cases.py build/pack/expert-pack tests/data/hy3 [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "hy3-f32": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "hy3-f16": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "hy3-q4_k": ["--dims", "256,4,8,2,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                 "--seed", "3"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="hy3",
            only=set(sys.argv[3:]))
