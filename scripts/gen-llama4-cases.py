#!/usr/bin/env python3
"""Reference logits for Llama 4 (llama4) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset llama-4-maverick --dims
...`: MoE every second layer, one expert a token whose sigmoid weight scales its input, beside a
shared expert; three chunked layers in four, the fourth unrotated with the attention
temperature; below 128 experts the per-head QK norm) and llama.cpp's teacher-forced logits on
it (see scripts/synth_cases.py).

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-llama4-cases.py build/pack/expert-pack tests/data/llama4 [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "l4-f32": ["--dims", "128,4,8,1,64,4,2,512", "--type", "F32", "--seed", "1"],
    "l4-f16": ["--dims", "128,4,8,1,64,4,2,512", "--type", "F16", "--seed", "2"],
    # two experts a token (the published models route one; llama.cpp runs any count): each
    # route's input scaled by its own weight, the outputs summed
    "l4-k2-f32": ["--dims", "128,4,8,2,64,4,2,512", "--type", "F32", "--seed", "4"],
    "l4-q4_k": ["--dims", "256,4,8,1,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                "--seed", "3"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="llama-4-maverick",
            only=set(sys.argv[3:]))
