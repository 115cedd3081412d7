#!/usr/bin/env python3
"""Reference logits for DeepSeek-V4 (deepseek4) test models, from llama.cpp.

Each case is a test-size synthetic model (`expert-pack synth --preset deepseek-v4-flash --dims
...`: hyper-connections, a sliding-window layer, compressed-by-4 layers with the lightning
indexer, a compressed-by-128 layer, a hash-routed layer, limited SwiGLU, and one trailing NextN
(multi-token prediction) block, which llama.cpp loads, with or without load_mtp, and neither engine
runs for these logits) and llama.cpp's
teacher-forced logits on it, in the golden data's format (../shared/golden/README.md): the prompt
in one batch, then llama.cpp's greedy tokens one at a time. The prompt is long enough for every
mechanism to act: past the 8-position window, past the indexer's top-3 of the compressed
entries, and past 128 positions (the first entry of the compressed-by-128 layer). The tests
regenerate the model from the recipe in case.json (synth is deterministic) and compare, so CI
needs no llama.cpp.

Needs llama-cpp-python 0.3.36 (it knows deepseek4) and a build of expert-pack:
    python3 scripts/gen-deepseek4-cases.py build/pack/expert-pack tests/data/deepseek4
"""
import os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from synth_cases import write_cases  # noqa: E402

CASES = {  # name (its suffix is the golden variant) -> synth arguments
    "v4-f32": ["--dims", "128,4,8,2,64,4,1,512", "--type", "F32", "--seed", "1"],
    "v4-q8_0": ["--dims", "256,4,8,2,128,4,1,512", "--type", "Q8_0", "--seed", "2"],
    # the seed's GGUF: MXFP4 routed experts, Q8_0 elsewhere
    "v4-mxfp4": ["--dims", "256,4,8,2,128,4,1,512", "--type", "Q8_0", "--gate-type", "MXFP4",
                 "--up-type", "MXFP4", "--down-type", "MXFP4", "--seed", "3"],
}
N_PROMPT, N_GEN = 140, 8


write_cases(sys.argv[1], sys.argv[2], CASES, N_PROMPT, N_GEN, preset="deepseek-v4-flash", seed=11)
