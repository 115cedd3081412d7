#include "engine/engine.h"

#include <cassert>

#include "engine/cpu_ops.h"

namespace engine {

using expertd::make_error;

Engine::Engine(const Model& m, ExpertSource& experts, int n_threads, int n_ctx, int n_seq,
               KvType kv)
    : Engine(m, make_cpu_ops(n_threads), experts, n_ctx, n_seq, kv) {}

Engine::Engine(const Model& m, std::unique_ptr<Ops> ops, ExpertSource& experts, int n_ctx,
               int n_seq, KvType kv)
    : m_(m), ops_(std::move(ops)), experts_(experts), n_ctx_(n_ctx), kv_(kv) {
  init(n_seq);
}

Engine::Engine(const Model& m, std::unique_ptr<Ops> ops, std::unique_ptr<ExpertSource> experts,
               int n_ctx, int n_seq, KvType kv)
    : m_(m),
      ops_(std::move(ops)),
      owned_experts_(std::move(experts)),
      experts_(*owned_experts_),
      n_ctx_(n_ctx),
      kv_(kv) {
  init(n_seq);
}

Engine::~Engine() = default;

void Engine::init(int n_seq) {
  assert(n_seq >= 1);
  n_past_.assign(n_seq, 0);
  const int n_blocks = m_.hp.n_blocks();  // the NextN block's cache too, where it is loaded
  for (int d = 0; d < 2; ++d)
    predicted_[d].assign(n_blocks, {}), pred_stats_[d].assign(n_blocks, {});
  hashed_.assign(n_blocks, {});
  hashed_stats_.assign(n_blocks, {});
  hidden_.resize(size_t(n_seq));
  for (int slot = 0; slot < n_seq; ++slot) forget_hidden(slot);
  std::vector<KvRows> rows;
  for (int il = 0; il < n_blocks; ++il) {
    rows.push_back(m_.arch->kv_rows(m_.hp, il, n_ctx_));
    const KvRows& r = rows.back();
    if (r.state > 0 || r.kv_state > 0) can_cut_ = false;
    cache_bytes_ +=
        kv_type_size(kv_) * (uint64_t(n_ctx_) * uint64_t(r.k + r.v) + uint64_t(r.kv_state)) +
        sizeof(float) * uint64_t(r.state);
  }
  cache_bytes_ *= uint64_t(n_seq);
  if (!can_cut_) marks_.resize(size_t(n_seq));
  ops_->init_cache(rows, n_ctx_, n_seq, kv_);
}

expertd::Status Engine::save_state(int slot, SeqState& out) {
  if (slot < 0 || slot >= n_seq()) return make_error("no sequence " + std::to_string(slot));
  if (!ops_->save_slot(slot, n_past_[size_t(slot)], out.data))
    return make_error("this backend cannot copy a sequence's state out");
  out.n_past = n_past_[size_t(slot)];
  return {};
}

expertd::Status Engine::load_state(int slot, const SeqState& s, int n) {
  if (slot < 0 || slot >= n_seq()) return make_error("no sequence " + std::to_string(slot));
  if (n < 0 || n > s.n_past || (n != s.n_past && !can_cut_))
    return make_error("a state of " + std::to_string(s.n_past) + " positions cannot resume at " +
                      std::to_string(n) + (can_cut_ ? "" : " (this model keeps recurrent states)"));
  if (n > n_ctx_) return make_error("the state is longer than the context");
  if (!ops_->load_slot(slot, s.n_past, n, s.data))
    return make_error("the state does not fit this model's caches (or the backend cannot load it)");
  n_past_[size_t(slot)] = n;
  if (!marks_.empty()) marks_[size_t(slot)].n_past = -1;
  forget_hidden(slot);  // not in the state: the first drafts after it are the weaker
  return {};
}

expertd::Status Engine::cut(int slot, int n) {
  if (slot < 0 || slot >= n_seq()) return make_error("no sequence " + std::to_string(slot));
  if (!can_cut_) return make_error("this model keeps recurrent states: its caches cannot be cut");
  if (n < 0 || n > n_past_[size_t(slot)])
    return make_error("cannot cut a sequence of " + std::to_string(n_past_[size_t(slot)]) +
                      " positions to " + std::to_string(n));
  n_past_[size_t(slot)] = n;
  hidden_at(slot, n);
  return {};
}

expertd::Status Engine::mark(int slot) {
  if (slot < 0 || slot >= n_seq()) return make_error("no sequence " + std::to_string(slot));
  hidden_[size_t(slot)].marked = hidden_[size_t(slot)].pending;
  if (can_cut_) return {};
  Mark& m = marks_[size_t(slot)];
  // Positions 0 of the rows per position: the fixed-size parts alone.
  if (!ops_->save_slot(slot, 0, m.state))
    return make_error("this backend cannot copy a sequence's recurrent state out");
  m.n_past = n_past_[size_t(slot)];
  return {};
}

expertd::Status Engine::cut(int slot, int n, std::span<const int32_t> kept) {
  if (can_cut_) return cut(slot, n);
  if (slot < 0 || slot >= n_seq()) return make_error("no sequence " + std::to_string(slot));
  Mark& m = marks_[size_t(slot)];
  if (m.n_past < 0) return make_error("cut: no mark on sequence " + std::to_string(slot));
  if (n < m.n_past || n > n_past_[size_t(slot)] || int(kept.size()) != n - m.n_past)
    return make_error("cut: the " + std::to_string(kept.size()) +
                      " kept tokens do not take the mark at " + std::to_string(m.n_past) +
                      " to position " + std::to_string(n));
  const int from = m.n_past;
  m.n_past = -1;
  if (n == n_past_[size_t(slot)]) return {};  // everything kept
  if (!ops_->load_slot(slot, 0, 0, m.state))
    return make_error("the recurrent state could not be restored");
  n_past_[size_t(slot)] = from;
  hidden_[size_t(slot)].pending = hidden_[size_t(slot)].marked;  // the kept tokens' eval sets it
  if (kept.empty()) return {};
  std::vector<float> discard;
  const SeqTokens seq{slot, kept};
  return run({&seq, 1}, /*all_logits=*/false, discard);
}

void Engine::reset_prediction_stats() {
  for (auto& s : pred_stats_) s.assign(m_.hp.n_blocks(), {});
  hashed_stats_.assign(m_.hp.n_blocks(), {});
}

expertd::Status Engine::eval(std::span<const int32_t> tokens, bool all_logits,
                             std::vector<float>& logits) {
  const SeqTokens one{0, tokens};
  return run({&one, 1}, all_logits, logits);
}

expertd::Status Engine::eval(std::span<const SeqTokens> seqs, std::vector<float>& logits) {
  return run(seqs, /*all_logits=*/false, logits);
}

expertd::Status Engine::eval(std::span<const SeqTokens> seqs, bool all_logits,
                             std::vector<float>& logits) {
  return run(seqs, all_logits, logits);
}

expertd::Status Engine::run(std::span<const SeqTokens> seqs, bool all_logits,
                            std::vector<float>& logits) {
  const Hparams& hp = m_.hp;
  if (seqs.empty()) return make_error("no sequences to evaluate");
  tokens_.clear();
  rows_.clear();
  std::vector<bool> seen(n_past_.size());
  for (const SeqTokens& s : seqs) {
    if (s.slot < 0 || s.slot >= n_seq())
      return make_error("sequence " + std::to_string(s.slot) + " is not one of the " +
                        std::to_string(n_seq()) + " this engine holds");
    if (seen[s.slot])
      return make_error("sequence " + std::to_string(s.slot) + " appears twice in one batch");
    seen[s.slot] = true;
    const int T = static_cast<int>(s.tokens.size()), past = n_past_[s.slot];
    if (T == 0) return make_error("no tokens to evaluate");
    if (past + T > n_ctx_)
      return make_error("context full: " + std::to_string(past + T) +
                        " tokens exceed the context of " + std::to_string(n_ctx_));
    for (int32_t tok : s.tokens)
      if (tok < 0 || tok >= hp.n_vocab)
        return make_error("token id " + std::to_string(tok) + " is outside the vocabulary");
    rows_.push_back({s.slot, int64_t(tokens_.size()), T, past});
    tokens_.insert(tokens_.end(), s.tokens.begin(), s.tokens.end());
  }
  const int T = static_cast<int>(tokens_.size());
  if (auto st = ops_->status(); !st) return st;
  ops_->begin_eval(rows_);
  first_error_ = {};
  if (prefetch_) prefetch_hashed();
  Act emb = ops_->alloc(T, hp.n_embd);
  ops_->embed(m_.tok_embd, tokens_, emb);
  const int64_t cols = m_.arch->residual_cols(hp);
  x_ = cols == hp.n_embd ? emb : ops_->alloc(T, cols);
  routes_.assign(hp.n_blocks(), {});
  carried_.clear();
  m_.arch->begin_eval(*this, emb, x_);
  for (int il = 0; il < hp.n_layer; ++il) {
    const size_t mark = ops_->mark();
    m_.arch->block(*this, il, x_);
    ops_->release_to(mark);
    if (!first_error_) return first_error_;
    if (auto st = ops_->status(); !st) return st;
  }
  Act out = m_.arch->end_eval(*this, x_);
  if (auto st = ops_->status(); !st) return st;
  if (nextn_on_)
    if (auto st = nextn_catch_up(x_, out); !st) return st;
  for (const SeqRows& r : rows_) n_past_[r.slot] += int(r.n);
  Act last;
  if (all_logits) {
    last = out;
  } else if (rows_.size() == 1) {
    last = out.rows_from(T - 1);
  } else {  // each sequence's last row
    last = ops_->alloc(int64_t(rows_.size()), out.cols);
    for (size_t i = 0; i < rows_.size(); ++i)
      ops_->copy(Act{last.row(int64_t(i)), 1, out.cols},
                 Act{out.row(rows_[i].first + rows_[i].n - 1), 1, out.cols});
  }
  Act h = ops_->rms_norm(last, m_.output_norm, hp.eps);
  Act lg = ops_->matmul(m_.output, h);
  logits.resize(size_t(lg.rows) * hp.n_vocab);
  ops_->to_host(lg, logits.data());
  return ops_->status();
}

}  // namespace engine
