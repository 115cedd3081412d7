#!/usr/bin/env python3
"""Reference logits for Trinity (afmoe) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset trinity-large --dims
...`: muP-scaled embeddings, gated attention, sandwich norms, sliding windows of 8 on three layers
of four and no RoPE on the fourth, a dense lead layer, sigmoid routing beside a shared expert) and
llama.cpp's teacher-forced logits on it (see scripts/synth_cases.py).

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-trinity-cases.py build/pack/expert-pack tests/data/trinity [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "trinity-f32": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "trinity-f16": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "trinity-q4_k": ["--dims", "256,4,8,2,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                 "--seed", "3"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="trinity-large",
            only=set(sys.argv[3:]))
