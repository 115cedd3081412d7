#!/usr/bin/env python3
"""A learned eviction policy in FlashMoE's style, trained and judged offline on an expertd trace
(--trace-path; .gz accepted): the lab prototype for issue 15, before any of it goes into the
daemon.

The model is a table: for an expert, the chance that its layer's next acquire uses it, indexed
by (acquires of its layer since it was last used, its exponentially decayed use count, its
popularity quartile in the training part). It is counted on the first part of the trace
(--train, default half) and evicts the resident expert with the lowest chance (ties: least
recently used) on the rest. Printed next to it, on the same held-out part and with the same
simulator (which follows Cache::grant's order: resident experts pinned first, then the misses):
lru, per-layer staleness (SpecMD's "least stale": the expert its layer has gone longest without),
decayed frequency, lfru (the daemon's) and lfru+affinity: lfru whose count of an expert of a
layer still to come in the current step (token) is raised by 8x the chance that this step uses
it, a naive-Bayes estimate from the experts the step used at its earlier layers (cross-layer
co-occurrence counted on the training part). expert-bench policy has the queue policies, the
knowledge horizons (lfru+hH) and Belady in C++.

  bench/policy_learned.py model/trace/kjv-2000-tokens.trace.gz --slots 32
"""
import argparse
import collections
import gzip
import math
import struct

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--slots", type=int, required=True)
ap.add_argument("--train", type=float, default=0.5, help="share of the acquires to train on")
ap.add_argument("--decay", type=float, default=0.9, help="use count decay per acquire of a layer")
a = ap.parse_args()

raw = (gzip.open if a.trace.endswith(".gz") else open)(a.trace, "rb").read()
if raw[:8] != b"XPRTTRC1":
    raise SystemExit(f"{a.trace}: not an expertd trace")
L, X = struct.unpack_from("<II", raw, 8)
recs, o = [], 16
while o < len(raw):
    _, _, layer, n = struct.unpack_from("<QIHH", raw, o)
    o += 16
    recs.append((layer, list(struct.unpack_from(f"<{n}H", raw, o))))
    o += 2 * n
cut = int(len(recs) * a.train)
train_part, test_part = recs[:cut], recs[cut:]


class State:
    """What an online policy may know: per layer acquires so far, when each expert was last
    used (in its layer's acquires and on a global clock), decayed use counts."""

    def __init__(self):
        self.visits = [0] * L
        self.last = {}
        self.clock = {}
        self.t = 0
        self.freq = collections.defaultdict(float)
        self.lfru = collections.Counter()  # the daemon's counts: halved every 8 x slots accesses
        self.accesses = 0
        self.step = {}  # layer -> experts the current step (token) used there
        self.prev_layer = -1
        self.now = None  # the acquire being served: (layer, experts)

    def begin(self, layer, experts):
        if layer < self.prev_layer:
            self.step = {}
        self.prev_layer = layer
        self.now = (layer, experts)

    def after(self, layer, experts):
        self.step.setdefault(layer, set()).update(experts)
        for e in experts:
            self.lfru[(layer, e)] += 1
            self.accesses += 1
            if self.accesses % (8 * a.slots) == 0:
                for k in self.lfru:
                    self.lfru[k] //= 2
        self.visits[layer] += 1
        for e in range(X):
            self.freq[(layer, e)] *= a.decay
        for e in experts:
            k = (layer, e)
            self.t += 1
            self.clock[k] = self.t
            self.last[k] = self.visits[layer]
            self.freq[k] += 1

    def staleness(self, k):
        return self.visits[k[0]] - self.last.get(k, -10**9)


pop = collections.Counter((layer, e) for layer, es in train_part for e in es)
quartile = {}
for layer in range(L):
    for r, e in enumerate(sorted(range(X), key=lambda e: -pop[(layer, e)])):
        quartile[(layer, e)] = r * 4 // X


def features(k, st):
    return (min(st.staleness(k), 30), min(int(st.freq[k] * 2), 12), quartile[k])


def train(part):
    st, seen, pending = State(), collections.defaultdict(lambda: [0, 0]), {}
    for layer, es in part:
        used = set(es)
        for e, f in pending.get(layer, []):
            seen[f][0] += 1
            seen[f][1] += e in used
        st.after(layer, es)
        pending[layer] = [(e, features((layer, e), st)) for e in range(X)]
    return {f: (u + 0.5) / (n + 1) for f, (n, u) in seen.items()}


def train_affinity(part):
    steps, cur, prev = [], {}, -1
    for layer, es in part:
        if layer < prev and cur:
            steps.append(cur)
            cur = {}
        cur.setdefault(layer, set()).update(es)
        prev = layer
    steps.append(cur)
    base, seen, co = collections.Counter(), collections.Counter(), collections.Counter()
    for step in steps:
        for layer, used in step.items():
            base.update((layer, e) for e in used)
            for later, used_later in step.items():
                if later > layer:
                    for e in used:
                        seen[(layer, e, later)] += 1
                        co.update((layer, e, later, f) for f in used_later)
    prior = {(l, e): (base[(l, e)] + 0.5) / (len(steps) + 1) for l in range(L) for e in range(X)}
    return prior, seen, co


def affinity_chance(model, k, st):
    # P(the current step uses k at its layer, still to come), naive Bayes over the experts the
    # step used at earlier layers (the acquire being served included)
    prior, seen, co = model
    later, f = k
    p0 = prior[k]
    odds0 = math.log(p0 / (1 - p0))
    logit = odds0
    layer, experts = st.now
    known = dict(st.step)
    known.setdefault(layer, set())
    known[layer] = known[layer] | set(experts)
    for l, used in known.items():
        if l >= later:
            continue
        for e in used:
            n = seen[(l, e, later)]
            if n:
                p = min(max((co[(l, e, later, f)] + 2 * p0) / (n + 2), 1e-4), 1 - 1e-4)
                logit += math.log(p / (1 - p)) - odds0
    return 1 / (1 + math.exp(-logit))


def simulate(part, score):
    st, cache, hits, misses = State(), set(), 0, 0
    for layer, es in part:
        st.begin(layer, es)
        keys = [(layer, e) for e in es]
        pinned = set(keys)
        hits += sum(k in cache for k in keys)
        for k in keys:
            if k in cache:
                continue
            misses += 1
            if len(cache) >= a.slots:
                cache.remove(min((q for q in cache if q not in pinned),
                                 key=lambda q: (score(q, st), st.clock.get(q, 0))))
            cache.add(k)
        st.after(layer, es)
    return hits / max(1, hits + misses)


table = train(train_part)
affinity = train_affinity(train_part)
policies = {
    "lru": lambda k, st: st.clock.get(k, 0),
    "least-stale": lambda k, st: -st.staleness(k),
    "decayed-lfu": lambda k, st: st.freq[k],
    "learned": lambda k, st: table.get(features(k, st), 0.0),
    "lfru": lambda k, st: st.lfru[k],
    "lfru+affinity": lambda k, st: st.lfru[k] + (
        8 * affinity_chance(affinity, k, st) if k[0] > st.now[0] else 0.0),
}
print(f"{a.trace}: {L} layers x {X} experts, {len(recs)} acquires; trained on {cut}, "
      f"judged on {len(test_part)}; {a.slots} slots ({a.slots / (L * X):.0%} of the experts)")
print("  ".join(f"{n} {simulate(test_part, p):.3f}" for n, p in policies.items()))
