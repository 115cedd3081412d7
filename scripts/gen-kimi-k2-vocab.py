#!/usr/bin/env python3
"""Tokenizer vectors for the kimi-k2 pre-tokenizer (Kimi-K2, Kimi-K3), from llama.cpp.

The vocab is the golden data's tiny synthetic BPE vocab (ggml-vocab-synth-gpt-4o: 256 byte
tokens, 252 learned merges) with tokenizer.ggml.pre "kimi-k2", two merges that only a
pre-tokenizer keeping Han apart from other letters leaves unused ("o" + the first byte of a CJK
ideograph, and the ideograph's first two bytes) and Kimi's special tokens. The strings are the
golden ones plus mixed Latin/Han text; the ids are llama.cpp's (llama-cpp-python 0.3.36,
add_special = false, parse_special = false), in llama.cpp's test-tokenizer-0 format.

    python3 scripts/gen-kimi-k2-vocab.py ../shared/golden/tokenizer/synthetic tests/data/tokenizer
"""
import os, sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vocab_cases import field, golden_texts, write_vectors  # noqa: E402

SRC = "ggml-vocab-synth-gpt-4o.gguf"
OUT = "ggml-vocab-synth-kimi-k2.gguf"
EXTRA_MERGES = ["o ä", "ä ¸"]  # "世" is E4 B8 96: byte-level 'ä' '¸' ...
SPECIALS = ["[BOS]", "[EOS]", "<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>"]
EXTRA_TEXTS = ["hello世界", "Hello世界 world", "世界hello", "too世 so世界o", "abc's 世界's",
               "中文English混合text", "1234567 世界123", "HELLOworld ÄpfelWorld"]


def main():
    src_dir, out_dir = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(os.path.join(src_dir, SRC))
    arch = field(r, "general.architecture")
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    for m in EXTRA_MERGES:
        merges.append(m)
        tokens.append(m.replace(" ", ""))
        types.append(1)
    for s in SPECIALS:
        tokens.append(s)
        types.append(3)
    out = os.path.join(out_dir, OUT)
    w = gguf.GGUFWriter(out, arch)
    for name, f in r.fields.items():
        if name.startswith(("GGUF.", "tokenizer.", "general.architecture")):
            continue
        w.add_key_value(name, field(r, name), f.types[0])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("kimi-k2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tokens.index("[BOS]"))
    w.add_eos_token_id(tokens.index("<|end_of_msg|>"))
    w.add_add_bos_token(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    write_vectors(out, golden_texts(src_dir, SRC) + EXTRA_TEXTS)
    print(out, len(tokens), "tokens")


main()
