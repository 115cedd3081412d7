#!/usr/bin/env python3
"""Reference logits for the DeepSeek Sparse Attention architectures (DeepSeek-V3.2's deepseek32,
GLM-5's glm-dsa) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset deepseek-v3.2|glm-5 --dims
...`: MLA with a q LoRA, a dense lead layer, sigmoid routing with a shared expert, and the
lightning indexer of 4 heads of 64 picking 8 positions, so that a 40-token prompt attends
sparsely from its ninth token on) and llama.cpp's teacher-forced logits on it (see
scripts/synth_cases.py).

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-dsa-cases.py build/pack/expert-pack tests/data/dsa [case...]
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # preset -> name (its suffix is the golden variant) -> synth arguments
    "deepseek-v3.2": {
        "ds32-f32": ["--dims", "128,4,8,2,64,4,1,512", "--type", "F32", "--seed", "1"],
        "ds32-f16": ["--dims", "128,4,8,2,64,4,1,512", "--type", "F16", "--seed", "3"],
        "ds32-q4_k": ["--dims", "256,4,8,2,256,4,1,512", "--type", "Q4_K", "--down-type", "Q6_K",
                      "--seed", "6"],
    },
    "glm-5": {
        "glm5-f32": ["--dims", "128,4,8,2,64,4,1,512", "--type", "F32", "--seed", "4"],
        "glm5-q4_k": ["--dims", "256,4,8,2,256,4,1,512", "--type", "Q4_K", "--down-type", "Q6_K",
                      "--seed", "5"],
    },
}
N_PROMPT, N_GEN = 40, 8

for preset, cases in CASES.items():
    write_cases(sys.argv[1], sys.argv[2], cases, N_PROMPT, N_GEN, preset=preset,
                only=set(sys.argv[3:]))
