#!/usr/bin/env python3
"""Reference logits for Laguna (laguna) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset laguna-s-2.1 --dims ...`:
4 query heads on global layers and 8 on sliding ones, windows of 8, YaRN on the global layers over
half of each head and plain RoPE over all of it on the sliding ones, per-head softplus gates, a
dense lead layer, sigmoid routing beside a shared expert) and llama.cpp's teacher-forced logits on
it (see scripts/synth_cases.py). Six layers: two global ones.

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-laguna-cases.py build/pack/expert-pack tests/data/laguna [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "laguna-f32": ["--dims", "128,6,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "laguna-f16": ["--dims", "128,6,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "laguna-q4_k": ["--dims", "256,6,8,2,256,4,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                 "--seed", "3"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="laguna-s-2.1",
            only=set(sys.argv[3:]))
