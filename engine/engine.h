// The forward pass, once for every architecture and backend: embeddings, the architecture's
// blocks (engine/arch.h) over the backend's ops (engine/ops.h), the output. The MoE block is
// shared (engine/moe.cpp): routing, one fetch of each unique expert per layer through the
// ExpertSource (local or expertd), hits computed while misses load, next-layer hints.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/arch.h"
#include "engine/expert_source.h"
#include "engine/model.h"
#include "engine/ops.h"

namespace engine {

// The experts worth prefetching for a layer: the union over T tokens of the top-k of that
// layer's raw router logits (T x n_expert), ascending ids.
std::vector<uint32_t> likely_experts(const float* logits, int T, int n_expert, int k);

// How well the next layers' routers, applied early, predict the experts a layer then uses
// (per layer, summed over evals): experts used, predicted, and predicted that were used.
struct PredictionStats {
  uint64_t used = 0, predicted = 0, correct = 0;
  double recall() const { return used ? double(correct) / double(used) : 0.0; }
  // predicted experts that were not used, per predicted one that was
  double waste() const { return correct ? double(predicted - correct) / double(correct) : 0.0; }
};

// A sequence's state after its first n_past positions (every layer's cache rows and recurrent
// state): saved from one slot, loaded into any slot of an engine of the same model, it resumes
// there exactly as if those positions had been evaluated in it.
struct SeqState {
  int n_past = 0;
  std::vector<uint8_t> data;  // the backend's copy (Ops::save_slot), in the engine's KvType
  size_t bytes() const { return data.size(); }
};

// One sequence's tokens in a batched eval: appended to the cache of sequence `slot`.
struct SeqTokens {
  int slot = 0;
  std::span<const int32_t> tokens;
};

class Engine {
 public:
  // The CPU backend with n_threads threads; experts from `experts`. n_seq sequences (slots),
  // each with its own cache of n_ctx positions, kept in `kv`.
  Engine(const Model& m, ExpertSource& experts, int n_threads, int n_ctx, int n_seq = 1,
         KvType kv = KvType::F32);
  // Any backend; the engine may own its expert source.
  Engine(const Model& m, std::unique_ptr<Ops> ops, ExpertSource& experts, int n_ctx, int n_seq = 1,
         KvType kv = KvType::F32);
  Engine(const Model& m, std::unique_ptr<Ops> ops, std::unique_ptr<ExpertSource> experts, int n_ctx,
         int n_seq = 1, KvType kv = KvType::F32);
  ~Engine();

  // Evaluates tokens at positions n_past().. of sequence 0 and appends them to its cache.
  // Writes the logits of every token (all_logits) or of the last one to `logits` (row-major).
  expertd::Status eval(std::span<const int32_t> tokens, bool all_logits,
                       std::vector<float>& logits);
  // Several sequences (distinct slots) in one pass: their rows go through every matmul together
  // and each MoE layer fetches the union of their experts once; attention reads each one's own
  // cache. Writes the logits of each sequence's last token, in the order given. A sequence's
  // logits are the same as when it is evaluated alone.
  expertd::Status eval(std::span<const SeqTokens> seqs, std::vector<float>& logits);
  // The same with every token's logits (all_logits: the sequences' rows in the order given).
  expertd::Status eval(std::span<const SeqTokens> seqs, bool all_logits,
                       std::vector<float>& logits);
  int n_past(int slot = 0) const { return n_past_[slot]; }
  int n_ctx() const { return n_ctx_; }
  int n_seq() const { return int(n_past_.size()); }
  void reset(int slot = 0) {
    n_past_[slot] = 0;
    if (!marks_.empty()) marks_[size_t(slot)].n_past = -1;
    forget_hidden(slot);
  }
  // Sequence `slot`'s state now (an error where the backend cannot copy its caches).
  expertd::Status save_state(int slot, SeqState& out);
  // Sequence `slot` resumes from `s` at position n: n == s.n_past, or any n <= s.n_past where
  // can_cut() (no layer keeps a recurrent state: its cache is rows per position).
  expertd::Status load_state(int slot, const SeqState& s, int n);
  bool can_cut() const { return can_cut_; }
  // Sequence `slot` goes back to its first n positions (n <= n_past) where can_cut(): the
  // rejected drafts of a speculative step (engine/speculative.h) leave its cache.
  expertd::Status cut(int slot, int n);
  // The same on any model, for a speculative step: mark(slot) before the verify eval keeps a
  // copy of the slot's fixed-size state (every layer's recurrent state and kv_state: delta-rule
  // states, convolution windows, DeepSeek-V4's window ring and compressors) where the model has
  // one (a no-op otherwise); cut(slot, n, kept) then takes the slot back to position n, where
  // `kept` are the tokens evaluated since the mark that stay (n - the marked position of them).
  // A recurrent state cannot be cut, so it is restored from the copy and `kept` is evaluated
  // again (its experts were just acquired: hits, compute only): every layer then holds exactly
  // what evaluating those tokens alone would have left (the CPU and CUDA backends run the
  // recurrences token by token, so batch size does not change their bits).
  expertd::Status mark(int slot);
  expertd::Status cut(int slot, int n, std::span<const int32_t> kept);
  // NextN drafting, on a model loaded with its NextN block (hp.n_nextn > 0; llama.cpp's MTP
  // drafting). With it on, every eval also runs the block over the eval's tokens, token p with
  // the trunk's hidden row at p - 1 (its output-normed final row, llama.cpp's h_nextn): the
  // block's own cache follows the trunk's positions, as llama.cpp's MTP context is caught up on
  // every target batch. It costs one more MoE block per eval and never changes the trunk's math.
  expertd::Status set_nextn(bool on);
  bool nextn_on() const { return nextn_on_; }
  // Up to `max` drafts to follow `pending` (sequence `slot`'s next token, not evaluated yet): the
  // block's argmax from (pending, the trunk's hidden row before it), then from each draft and the
  // block's own hidden row, one position further each; chained blocks (Arch::nextn_chain): at
  // most one draft per block, block i's from the pending token and the drafts before it. The
  // trunk's caches are untouched; the blocks' rows at those positions are rewritten by the next
  // eval's catch-up. logits: each draft's row (drafts x n_vocab), when given.
  expertd::Status draft_nextn(int slot, int32_t pending, int max, std::vector<int32_t>& out,
                              std::vector<float>* logits = nullptr);
  KvType kv_type() const { return kv_; }
  // Before a layer's experts run, hint the next MoE layer's likely experts to the source: the
  // next router applied to the current residual stream (DESIGN.md, "Overlap").
  // two_ahead: also predict two layers ahead (scored only, never hinted: an extra router per
  // layer, for expert-run bench's report).
  void set_prefetch(bool on, bool two_ahead = false) { prefetch_ = on, two_ahead_ = two_ahead; }
  // With prefetch on: for each MoE layer, the predictions made 1 and 2 layers ahead (depth 1 is
  // what is hinted) scored against the experts it used; [depth - 1][layer].
  // Hash-routed layers (DeepSeek-V4's ffn_gate_tid2eid): their experts follow from the tokens
  // alone, so with prefetch on they are hinted as the eval starts, before the first layer, and
  // never mispredicted; scored apart from the routers' predictions (per layer).
  const std::vector<PredictionStats>& hashed_stats() const { return hashed_stats_; }
  const std::vector<PredictionStats>& prediction_stats(int depth) const {
    return pred_stats_[depth - 1];
  }
  void reset_prediction_stats();
  std::string experts_name() const { return experts_.name(); }
  std::vector<expertd::proto::Metric> daemon_metrics() { return experts_.daemon_metrics(); }
  const SourceStats& source_stats() const { return experts_.stats(); }
  std::string device_name() const { return ops_->name(); }
  uint64_t weight_copy_bytes() const { return ops_->weight_copy_bytes(); }
  // A hint that these experts of layer il will be wanted soon (the source sends it after the
  // eval's next acquire): for callers that know more than the routers, as speculative drafts'
  // copied routing (engine/draft_hints.h). Never changes the math.
  bool wants_hints() const { return experts_.wants_hints(); }
  void hint(int il, std::span<const uint32_t> experts) {
    if (experts_.wants_hints()) experts_.prefetch(il, experts);
  }
  // Speculative decoding's counts since the last report, to expertd (expertctl stats).
  void report_drafts(uint64_t steps, uint64_t drafted, uint64_t accepted) {
    experts_.report_drafts(steps, drafted, accepted);
  }
  // Routing of the last eval: [layer][token] (empty for dense layers).
  const std::vector<std::vector<Route>>& routes() const { return routes_; }

  // For the architectures' blocks.
  Ops& ops() { return *ops_; }
  // The shared MoE block on the normalised input h: returns the routed experts' weighted sum
  // plus the shared expert. A failed fetch is recorded and ends the eval after the block.
  Act moe(int il, const MoeWeights& w, Act h) { return moe(il, w, h, h); }
  // The same with the router reading h and the experts x (Kimi-K3's latent experts: x is h
  // projected to w.n_embd; the result has that width).
  Act moe(int il, const MoeWeights& w, Act h, Act x);
  std::vector<Act>& carried() { return carried_; }             // see Arch::begin_eval
  std::span<const int32_t> tokens() const { return tokens_; }  // of the eval in progress
  // Bytes of every layer's attention cache at this context, all sequences (reported at start-up).
  uint64_t cache_bytes() const { return cache_bytes_; }

 private:
  void init(int n_seq);
  Act shared_expert(const MoeWeights& w, Act h, Act out);  // out += the shared expert's, if any
  expertd::Status run(std::span<const SeqTokens> seqs, bool all_logits, std::vector<float>& logits);
  void prefetch_next(int il);
  void score_predictions(int il, const std::vector<uint32_t>& used);

  const Model& m_;
  std::unique_ptr<Ops> ops_;
  std::unique_ptr<ExpertSource> owned_experts_;
  ExpertSource& experts_;
  int n_ctx_;
  KvType kv_ = KvType::F32;
  std::vector<int> n_past_;  // per sequence
  bool prefetch_ = false, two_ahead_ = false;
  Act x_;                        // the residual stream of the eval in progress
  std::vector<int32_t> tokens_;  // of every sequence of the eval in progress, in row order
  std::vector<SeqRows> rows_;
  uint64_t cache_bytes_ = 0;
  bool can_cut_ = true;
  struct Mark {
    int n_past = -1;  // -1: none
    std::vector<uint8_t> state;
  };
  std::vector<Mark> marks_;  // per sequence, where !can_cut_
  // NextN drafting: per sequence, the trunk's hidden row before its pending token (zeros where
  // unknown: a new sequence, a loaded state), and the last eval's last hidden rows (a cut's new
  // pending row is among them), from position pos0; at a mark, the row then.
  struct Hidden {
    std::vector<float> pending, rows, marked;
    int64_t pos0 = 0;
  };
  bool nextn_on_ = false;
  std::vector<Hidden> hidden_;
  void forget_hidden(int slot);
  void hidden_at(int slot, int n);  // the pending row after a cut to n positions
  expertd::Status nextn_catch_up(Act x, Act out);
  // NextN block `head` over the eval's tokens_ (rows_), h their hidden rows.
  Act nextn_block(Act h, int head);
  expertd::Status chain(int slot, int32_t pending, int max, std::vector<float>& h,
                        std::vector<float>& row, std::vector<int32_t>& out,
                        std::vector<float>* logits);  // draft_nextn's drafts
  std::vector<Act> carried_;     // the architecture's activations across the eval's blocks
  expertd::Status first_error_;  // the first error of the eval in progress
  std::vector<std::vector<Route>> routes_;
  MoeRoutes moe_routes_;                             // kept across layers (their buffers)
  std::vector<std::vector<uint32_t>> predicted_[2];  // [depth - 1][layer]: awaiting the layer
  std::vector<PredictionStats> pred_stats_[2];
  std::vector<std::vector<uint32_t>> hashed_;  // [layer]: the hash-routed layers' experts
  std::vector<PredictionStats> hashed_stats_;
  void prefetch_hashed();
};

using Forward = Engine;  // what expert-run drives, whatever the backend

}  // namespace engine
