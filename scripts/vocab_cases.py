"""Tokenizer vectors from llama.cpp, in its test-tokenizer-0 format: the shared part of
scripts/gen-kimi-k2-vocab.py and scripts/gen-pre-vocab.py. Needs llama-cpp-python 0.3.36 and
gguf (llama.cpp's gguf-py)."""
import os

import gguf
import llama_cpp

SEP = "\n__ggml_vocab_test__\n"


def field(r, name):
    """A GGUFReader field's value: a string, a number, or a list of either."""
    f = r.fields[name]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode() for i in f.data]
        return [int(f.parts[i][0]) for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]][0].item()


def golden_texts(src_dir, src):
    """The strings of a golden vocab's .inp file."""
    return open(os.path.join(src_dir, src + ".inp"), encoding="utf-8").read().split(SEP)[:-1]


def write_vectors(vocab_path, texts):
    """llama.cpp's ids for each text (add_special = false, parse_special = false) beside the
    vocab: VOCAB.inp (the texts) and VOCAB.out (the ids, a line each)."""
    mp = llama_cpp.llama_model_default_params()
    mp.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(vocab_path.encode(), mp)
    if not model:
        raise SystemExit("llama.cpp cannot load " + vocab_path)
    vocab = llama_cpp.llama_model_get_vocab(model)
    lines = []
    for t in texts:
        b = t.encode()
        buf = (llama_cpp.llama_token * (len(b) + 8))()
        n = llama_cpp.llama_tokenize(vocab, b, len(b), buf, len(buf), False, False)
        assert n >= 0
        lines.append("".join(" %d" % buf[i] for i in range(n)))
    llama_cpp.llama_model_free(model)
    with open(vocab_path + ".inp", "w", encoding="utf-8") as f:
        f.write("".join(t + SEP for t in texts))
    with open(vocab_path + ".out", "w") as f:
        f.write("\n".join(lines) + "\n")
