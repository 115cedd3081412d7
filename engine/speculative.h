// Speculative decoding: draft tokens verified in one batched eval.
//
// A step has one pending token x (drawn, not yet evaluated) and k drafts d1..dk guessed to follow
// it. The engine evaluates [x, d1..dk] as one batch (every MoE layer acquires the union of their
// experts in one request: one read serves all k + 1 tokens) with every row's logits; row i is the
// distribution after d_i (after x for i = 0). Walking the rows, a draft is kept while the target
// agrees with it; the first disagreement gives the corrected token, and when every draft is kept
// the last row gives one more. The cache is then cut back to the kept tokens.
//
// Greedy decoding emits exactly the tokens, and computes exactly the logits, that decoding one
// token at a time would: every row of a batched eval is bit for bit the row of a one-token eval
// (kernels' tiles and panels compute each (row, token) value the same way; attention reads each
// query's own keys; the MoE block sums each token's experts in its own route order), checked on
// every architecture (tests/engine/speculative_test.cpp). A recurrent state (delta-rule layers,
// DeepSeek-V4's compressors and window ring) cannot be cut back to the kept drafts: it is copied
// aside before the verify (Engine::mark) and, after a rejection, restored and the kept tokens
// evaluated again (Engine::cut); the recurrences run token by token, so the bits are the same
// (checked on Kimi-K3, Qwen3.5, DeepSeek-V4 and Ling 3.0). With temperature, the
// standard acceptance rule for a draft that is one token (a point mass q): keep d with probability
// p(d), else draw from p with d removed; the output has the target's distribution (Leviathan et
// al. 2023, Chen et al. 2023).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "common/result.h"
#include "engine/sampler.h"

namespace engine {

class Engine;

enum class DraftKind { None, Ngram, Mtp };
expertd::Result<DraftKind> parse_draft_kind(const std::string& name);  // none|ngram|mtp
const char* draft_kind_name(DraftKind k);

// Prompt lookup (n-gram drafting, no model): the longest suffix of the history, n_max down to
// n_min tokens, that occurred earlier in it; the drafts are the tokens that followed its latest
// earlier occurrence. Agents' output repeats its input (code edits, tool arguments, quoted
// text), where this guesses long runs right.
struct NgramDrafter {
  int n_max = 4, n_min = 2;
  // Up to `max` drafts to follow `history` (its last token the pending one); none when no suffix
  // recurs. from: where they were copied from (the history index of the first), -1 when none.
  std::vector<int32_t> draft(std::span<const int32_t> history, int max,
                             int64_t* from = nullptr) const;
};

// Where a step's drafts come from: prompt lookup, or (Mtp) the model's own NextN block
// (Engine::draft_nextn: the engine must have it on, Engine::set_nextn).
struct Drafter {
  DraftKind kind = DraftKind::Ngram;
  NgramDrafter ngram;
};

// How many drafts to ask for at each step: doubles (up to max) while every draft is kept, falls to
// one more than were kept when one is rejected, and pauses after `patience` steps in a row kept
// none (for as many steps, then tries one again): drafts the target rejects cost their rows (in
// a small model's compute, in the experts read for them), and a text that does not repeat itself
// should cost nothing.
class DraftLength {
 public:
  explicit DraftLength(int max, int patience = 4) : max_(max), patience_(patience), now_(max) {}
  int max() const { return max_; }
  int next() const { return pause_ > 0 ? 0 : now_; }  // drafts to ask for now
  void update(int drafted, int kept);                 // after each step

 private:
  int max_, patience_, now_, fruitless_ = 0, pause_ = 0;
};

// Drafted and accepted counts (per step: drafted k, accepted a <= k; a + 1 tokens emitted).
struct DraftStats {
  uint64_t steps = 0, drafted = 0, accepted = 0, emitted = 0;
  double acceptance() const { return drafted ? double(accepted) / double(drafted) : 0.0; }
  double tokens_per_step() const { return steps ? double(emitted) / double(steps) : 0.0; }
};

// The token that follows a row of a verify eval, given the draft guessed there (draft < 0: none,
// a plain draw): greedy, the argmax (the draft is kept iff it is the argmax); with temperature,
// the acceptance rule above (Sampler::verify). The draft is kept iff the result equals it.
inline int32_t verify_row(Sampler& s, std::span<const float> row, int32_t draft) {
  return draft < 0 ? s.sample(row) : s.verify(row, draft);
}

// One step's outcome for one sequence.
struct DraftStep {
  std::vector<int32_t> drafts;   // guessed
  std::vector<int32_t> emitted;  // the kept drafts, then the corrected (or extra) token
  int accepted = 0;              // drafts kept
  std::vector<float> logits;     // the eval's rows: emitted[i] was drawn from row i
  int64_t from = -1;             // the history index the drafts were copied from (-1: none)
};

// Called with the step's drafts (and where they came from) before the verify eval starts: the
// drafts' routing hinted as the eval's prefetch (engine/draft_hints.h).
using BeforeVerify = std::function<void(const DraftStep&)>;

// One speculative step for sequence `slot`, whose history ends with its pending token (drawn,
// not yet evaluated: the engine holds history.size() - 1 positions): drafts from `drafter` (at
// most len.next(), and what the context has room for), one batched eval of the pending token and
// the drafts, the walk, and the cache cut back to the pending token and the kept drafts; len is
// updated. The last emitted token is the new pending one. A DraftLength of max 0 is plain
// decoding (one token per eval). On a model with a recurrent state the step marks it before the
// verify and, after a rejection, restores it and evaluates the kept tokens again (Engine::mark,
// Engine::cut): Engine::routes() then holds that second eval's rows (the same tokens, the same
// routing) rather than the verify's.
expertd::Status speculative_step(Engine& e, int slot, std::span<const int32_t> history,
                                 const Drafter& drafter, DraftLength& len, Sampler& sampler,
                                 DraftStats& stats, DraftStep& out,
                                 const BeforeVerify& before_verify = {});

}  // namespace engine
