#!/usr/bin/env python3
"""Tokenizer vectors for the pre-tokenizers the 2026 MoE GGUFs name, from llama.cpp.

GLM-4.5/4.6/4.7 and GLM-5 (`glm4`, `glm5`), Mistral Large 3 (`tekken`), Solar-Open-100B
(`solar-open`), MiniMax-M2/M3 (`minimax-m2`), Ling 2.0 (`bailingmoe2`), K-EXAONE (`exaone-moe`)
Tencent's Hunyuan, Hunyuan dense / Hy3 and Hy4 (`hunyuan`, `hunyuan-dense`, `hy_v4`), Trinity
(`afmoe`: digits grouped in threes from the right) and Laguna (`laguna`): the golden data's tiny synthetic BPE vocab
(ggml-vocab-synth-gpt-4o: 256 byte tokens, 252 learned merges) with tokenizer.ggml.pre set to
each and merges that only some of the regexes leave usable ("1"+"2" and "12"+"3": digits in runs
of three or one at a time; "l"+"W": a split at a case change; "e"+U+0301: combining marks with
their letter), plus two whole-word tokens no merge makes ("zebra", " zebra": taken whole only
where llama.cpp ignores merges, glm4 and tekken). The strings are the golden ones plus ones that
exercise those. The ids are llama.cpp's
(llama-cpp-python 0.3.36, add_special = false, parse_special = false), in llama.cpp's
test-tokenizer-0 format.

    python3 scripts/gen-pre-vocab.py ../shared/golden/tokenizer/synthetic tests/data/tokenizer
"""
import os, sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vocab_cases import field, golden_texts, write_vectors  # noqa: E402

SRC = "ggml-vocab-synth-gpt-4o.gguf"
PRES = ["glm4", "glm5", "tekken", "solar-open", "minimax-m2", "bailingmoe2", "exaone-moe", "hunyuan",
        "hunyuan-dense", "hy_v4", "afmoe", "laguna"]
EXTRA_MERGES = [b"1 2", b"12 3", b"123 4", b"l W", b"e \xcc", b"e\xcc \x81"]
WHOLE_WORDS = [b"zebra", b" zebra"]
EXTRA_TEXTS = ["zebra zebra zebras", "1234567 12 123456", "HELLOworld ÄpfelWorld camelCaseWord", "abc's DON'T we'll",
               "e\u0301te\u0301 cafe\u0301s", "path/to/file/\nnext/\r\nline", "x=1;y=22;z=333",
               "  leading and trailing  ", "ΑΒΓ αβγ Ωmega", "tab\there\n\n\nthree",
               "中文文本和日本語のテキスト, 12345!", "abc12345def 7 (99) v1.2.3 ٣٤٥٦"]


def byte_chars():  # GPT-2's byte-to-unicode map, as the vocab's tokens are written
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b), cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_vocab(r, pre, out):
    bc = byte_chars()
    enc = lambda b: "".join(bc[x] for x in b)
    tokens = field(r, "tokenizer.ggml.tokens")
    types = field(r, "tokenizer.ggml.token_type")
    merges = field(r, "tokenizer.ggml.merges")
    for m in EXTRA_MERGES:
        a, b = m.split(b" ")
        merges.append(enc(a) + " " + enc(b))
        tokens.append(enc(a + b)), types.append(1)
    for wd in WHOLE_WORDS:
        tokens.append(enc(wd)), types.append(1)
    w = gguf.GGUFWriter(out, field(r, "general.architecture"))
    for name, f in r.fields.items():
        if name.startswith(("GGUF.", "general.architecture")):
            continue
        if name in ("tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                    "tokenizer.ggml.merges"):
            continue
        w.add_key_value(name, field(r, name), f.types[0],
                        sub_type=f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    src_dir, out_dir = sys.argv[1], sys.argv[2]
    r = gguf.GGUFReader(os.path.join(src_dir, SRC))
    texts = golden_texts(src_dir, SRC) + EXTRA_TEXTS
    for pre in PRES:
        out = os.path.join(out_dir, "ggml-vocab-synth-%s.gguf" % pre)
        write_vocab(r, pre, out)
        write_vectors(out, texts)
        print(out, len(texts), "strings")


main()
