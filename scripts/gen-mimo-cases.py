#!/usr/bin/env python3
"""Reference logits for MiMo-V2 (mimo2) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset mimo-v2 --dims ...`:
keys of the head size and values of half, 2 KV heads on global layers and 4 on sliding ones,
windows of 8 with sink biases, the value scale, a dense first layer, sigmoid routing, 3 MTP
blocks llama.cpp loads and skips) and llama.cpp's teacher-forced logits on it (see
scripts/synth_cases.py). Seven layers, so that a global layer follows the sliding ones; the Q4_K
mix 512 wide, so that attn_output (heads x value size) is Q4_K too.

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-mimo-cases.py build/pack/expert-pack tests/data/mimo [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "mimo-f32": ["--dims", "128,7,8,2,64,4,2,512", "--type", "F32", "--seed", "1"],
    "mimo-f16": ["--dims", "128,7,8,2,64,4,2,512", "--type", "F16", "--seed", "2"],
    "mimo-q4_k": ["--dims", "512,7,8,2,256,8,2,512", "--type", "Q4_K", "--down-type", "Q6_K",
                 "--seed", "5"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="mimo-v2",
            only=set(sys.argv[3:]))
