"""Byte-level BPE for the bundled model, stored the way llama.cpp reads tokenizer.ggml.model = gpt2.

Pre-tokenizer: GPT-2's regex (tokenizer.ggml.pre = "gpt-2"). The training text is ASCII, where
\\p{L} is [A-Za-z] and \\p{N} is [0-9], so Python's re gives exactly llama.cpp's split.
"""
from __future__ import annotations

import collections
import re

GPT2_SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")
SPECIALS = ["<|endoftext|>"]


def bytes_to_unicode() -> dict[int, str]:
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return out


B2U = bytes_to_unicode()


def encode_word(w: str) -> str:
    return "".join(B2U[b] for b in w.encode("utf-8"))


def train(text: str, vocab_size: int) -> tuple[list[str], list[str]]:
    """Returns (tokens, merges): 256 byte tokens, then one token per merge, then the specials."""
    words = collections.Counter(encode_word(w) for w in GPT2_SPLIT.findall(text))
    seqs = {w: list(w) for w in words}
    pairs: collections.Counter = collections.Counter()
    where: dict[tuple[str, str], set[str]] = collections.defaultdict(set)
    for w, f in words.items():
        s = seqs[w]
        for a, b in zip(s, s[1:]):
            pairs[(a, b)] += f
            where[(a, b)].add(w)
    tokens = [B2U[b] for b in range(256)]
    merges = []
    n_merges = vocab_size - len(tokens) - len(SPECIALS)
    for _ in range(n_merges):
        if not pairs:
            break
        (a, b), count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if count < 2:
            break
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        for w in list(where.pop((a, b), ())):
            f, s = words[w], seqs[w]
            for x, y in zip(s, s[1:]):  # remove this word's old pairs
                pairs[(x, y)] -= f
                if pairs[(x, y)] <= 0:
                    del pairs[(x, y)]
                where[(x, y)].discard(w)
            i, out = 0, []
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            seqs[w] = out
            for x, y in zip(out, out[1:]):
                pairs[(x, y)] += f
                where[(x, y)].add(w)
    return tokens + SPECIALS, merges


class Tokenizer:
    def __init__(self, tokens: list[str], merges: list[str]):
        self.tokens = tokens
        self.id = {t: i for i, t in enumerate(tokens)}
        self.rank = {tuple(m.split(" ")): i for i, m in enumerate(merges)}
        self.cache: dict[str, list[int]] = {}
        self.u2b = {u: b for b, u in B2U.items()}

    def _word(self, w: str) -> list[int]:
        if w in self.cache:
            return self.cache[w]
        s = list(encode_word(w))
        while len(s) > 1:
            best = min(((self.rank.get((s[i], s[i + 1]), 1 << 30), i) for i in range(len(s) - 1)))
            if best[0] == 1 << 30:
                break
            i = best[1]
            s = s[:i] + [s[i] + s[i + 1]] + s[i + 2:]
        ids = [self.id[t] for t in s]
        self.cache[w] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        out = []
        for w in GPT2_SPLIT.findall(text):
            out += self._word(w)
        return out

    def decode(self, ids: list[int]) -> str:
        data = bytes(self.u2b[c] for i in ids if self.tokens[i] not in SPECIALS for c in self.tokens[i])
        return data.decode("utf-8", errors="replace")
