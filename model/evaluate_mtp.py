#!/usr/bin/python3
"""The MTP file through the project's engine: greedy text with --speculative mtp and ngram must
equal plain decoding's, with their acceptance; the trunk's held-out perplexity must equal the
original file's.

    /usr/bin/python3 model/evaluate_mtp.py --mtp model/kjv-moe-mtp-q8_0.gguf --orig model/kjv-moe-q8_0.gguf

Writes mtp-evaluation.json beside --heldout (default model/build/).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402

PROMPTS = ["And God said", "In the beginning God created", "And the LORD said unto Moses,",
           "The LORD is my shepherd;"]
SPEC = re.compile(r"speculative (\w+): (\d+) evals for (\d+) tokens \(([\d.]+) per eval\); (\d+) drafted, (\d+) accepted")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mtp", default="model/kjv-moe-mtp-q8_0.gguf")
    ap.add_argument("--orig", default="model/kjv-moe-q8_0.gguf")
    ap.add_argument("--expert-run", default="build/engine/expert-run")
    ap.add_argument("--heldout", default="model/build/heldout.txt")
    ap.add_argument("-n", type=int, default=200)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not os.path.exists(args.heldout):
        with open(args.heldout, "w") as f:
            f.write(train.load_text()[1])
    run = lambda *a: subprocess.run([args.expert_run, *a, "--local", "--threads", str(args.threads)],
                                    capture_output=True, text=True, check=True)
    result = {"prompts": {}, "totals": {}}
    ok = True
    for p in PROMPTS:
        texts, per = {}, {}
        for spec in ("none", "ngram", "mtp", "mtp-1"):  # mtp-1: one draft a step, the first draft's acceptance
            dmax = 1 if spec == "mtp-1" else args.draft_max
            r = run("generate", "--model", args.mtp, "--speculative", spec.split("-")[0], "--draft-max", str(dmax),
                    "--temp", "0", "-n", str(args.n), "--verbose", "--prompt", p)
            texts[spec] = r.stdout
            m = SPEC.search(r.stderr)
            if m:
                g = m.groups()
                per[spec] = {"evals": int(g[1]), "tokens": int(g[2]), "drafted": int(g[4]), "accepted": int(g[5])}
        same = all(t == texts["none"] for t in texts.values())
        ok &= same
        result["prompts"][p] = {"identical_text": same, **per}
        print(f"{p!r}: text {'identical' if same else 'DIFFERS'}; " + "; ".join(
            f"{s} {v['drafted']} drafted, {v['accepted']} accepted, {v['tokens'] / v['evals']:.2f} tokens/eval"
            for s, v in per.items()))
    for spec in ("ngram", "mtp", "mtp-1"):
        t = {k: sum(result["prompts"][p][spec][k] for p in PROMPTS) for k in ("evals", "tokens", "drafted", "accepted")}
        t["acceptance"] = t["accepted"] / max(1, t["drafted"])
        t["tokens_per_eval"] = t["tokens"] / t["evals"]
        result["totals"][spec] = t
        print(f"{spec}: {t['drafted']} drafted, {t['accepted']} accepted ({100 * t['acceptance']:.1f}%), "
              f"{t['tokens_per_eval']:.2f} tokens per eval ({t['tokens']} tokens, {t['evals']} evals)")
    ppl = {}
    for m in (args.orig, args.mtp):
        ppl[os.path.basename(m)] = json.loads(run("perplexity", "--model", m, "--file", args.heldout,
                                                  "--window", "128", "--json").stdout)
    same_ppl = len({v["mean_nll"] for v in ppl.values()}) == 1
    ok &= same_ppl
    result["perplexity"] = ppl
    print("held-out perplexity: " + ", ".join(f"{k} {v['perplexity']} (nll {v['mean_nll']})" for k, v in ppl.items())
          + (" - equal" if same_ppl else " - DIFFERENT"))
    with open(os.path.join(os.path.dirname(args.heldout), "mtp-evaluation.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
