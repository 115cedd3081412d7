#!/usr/bin/env python3
"""Reference logits for Mistral Large 3 (deepseek2 with the Llama 4 query temperature) test models,
from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset mistral-large-3 --dims ...`:
MLA with a q LoRA, YaRN, softmax routing renormalised, a shared expert, a dense lead layer, the
tekken vocabulary, and attention.temperature_scale 0.1 over temperature_length 8, so a 40-token
prompt spans five temperature steps) and llama.cpp's teacher-forced logits on it (see
scripts/synth_cases.py).

Needs llama-cpp-python 0.3.36 and a build of expert-pack:
    python3 scripts/gen-mistral3-cases.py build/pack/expert-pack tests/data/mistral3
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "ml3-f32": ["--dims", "128,4,8,2,64,4,1,512", "--type", "F32", "--seed", "1"],
    "ml3-q4_k": ["--dims", "256,4,8,2,256,4,1,512", "--type", "Q4_K", "--down-type", "Q6_K",
                 "--seed", "2"],
}
N_PROMPT, N_GEN = 40, 8

write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="mistral-large-3",
            only=set(sys.argv[3:]))
