// NextN (multi-token prediction) drafting: the model's own draft head run beside the trunk
// (engine/engine.h, Engine::set_nextn), as llama.cpp's draft-mtp runs it (common/speculative.cpp):
// a row is the architecture's input from the token's embedding and the trunk's hidden row
// (Arch::nextn_input), the decoder block of layer n_layer, then its head (Arch::nextn_head) and
// shared_head_head (or the output). The defaults here are GLM-4.5's (src/models/glm4-moe.cpp,
// graph_mtp); DeepSeek-V4's, MiMo-V2's and Step 3.5's are in their files. Where the architecture
// chains its blocks (Arch::nextn_chain, llama.cpp's chain_heads), block j is layer n_layer + j.
#include <algorithm>

#include "engine/engine.h"

namespace engine {

using expertd::make_error;

namespace {
constexpr int64_t kKeptRows = 64;  // of an eval's hidden rows per sequence: a cut lands in them
}

expertd::Status Engine::set_nextn(bool on) {
  if (on && m_.hp.n_nextn == 0)
    return make_error("the model was loaded without its NextN block: nothing to draft with");
  nextn_on_ = on;
  for (int slot = 0; slot < n_seq(); ++slot) forget_hidden(slot);
  return {};
}

void Engine::forget_hidden(int slot) {
  Hidden& h = hidden_[size_t(slot)];
  h.pending.assign(nextn_on_ ? size_t(m_.arch->nextn_cols(m_.hp)) : 0, 0.0f);
  h.rows.clear();
  h.marked.clear();
  h.pos0 = 0;
}

void Engine::hidden_at(int slot, int n) {
  if (!nextn_on_) return;
  Hidden& h = hidden_[size_t(slot)];
  const int64_t n_embd = m_.arch->nextn_cols(m_.hp), row = n - 1 - h.pos0;
  if (row >= 0 && (row + 1) * n_embd <= int64_t(h.rows.size()))
    std::copy_n(h.rows.begin() + row * n_embd, n_embd, h.pending.begin());
  else  // before the rows kept: unknown, as after a loaded state
    std::fill(h.pending.begin(), h.pending.end(), 0.0f);
}

Act Arch::nextn_hidden(Engine& e, const Model& m, Act x, Act out) const {
  (void)x;
  return e.ops().rms_norm(out, m.output_norm, m.hp.eps);
}

Act Arch::nextn_input(Engine& e, const Model& m, const NextnWeights& w, Act emb, Act h) const {
  Ops& ops = e.ops();
  const int64_t n = m.hp.n_embd;
  Act cat = ops.alloc(emb.rows, 2 * n);
  ops.rms_norm(emb, w.enorm, columns(cat, 0, n), m.hp.eps);
  ops.rms_norm(h, w.hnorm, columns(cat, n, n), m.hp.eps);
  return ops.matmul(w.eh_proj, cat);
}

Act Arch::nextn_head(Engine& e, const Model& m, const NextnWeights& w, Act x,
                     Act* next_hidden) const {
  Act h = e.ops().rms_norm(x, head_norm(m, w), m.hp.eps);
  if (next_hidden) *next_hidden = h;
  return h;
}

const Tensor& head_norm(const Model& m, const NextnWeights& w) {
  return w.head_norm ? w.head_norm : w.alt_head_norm ? w.alt_head_norm : m.output_norm;
}

Act Engine::nextn_block(Act h, int head) {
  const Hparams& hp = m_.hp;
  const NextnWeights& w = m_.nextn[size_t(head)];
  Act e = ops_->alloc(int64_t(tokens_.size()), hp.n_embd);
  ops_->embed(w.embed ? w.embed : m_.tok_embd, tokens_, e);
  Act x = m_.arch->nextn_input(*this, m_, w, e, h);
  const size_t mark = ops_->mark();
  m_.arch->block(*this, hp.n_layer + head, x);
  ops_->release_to(mark);
  return x;
}

// Row p of the eval runs with the trunk's hidden row at p - 1: the row before it in the eval, or,
// for a sequence's first, its pending one (kept from its last eval).
expertd::Status Engine::nextn_catch_up(Act x, Act out) {
  const int64_t n = m_.arch->nextn_cols(m_.hp);
  Act hidden = m_.arch->nextn_hidden(*this, m_, x, out), h = ops_->alloc(out.rows, n);
  for (const SeqRows& r : rows_) {
    ops_->from_host(hidden_[size_t(r.slot)].pending.data(), Act{h.row(r.first), 1, n});
    if (r.n > 1)
      ops_->copy(Act{h.row(r.first + 1), r.n - 1, n}, Act{hidden.row(r.first), r.n - 1, n});
  }
  // Every chained block is caught up on the same rows (llama.cpp runs each head over the batch).
  const size_t mark = ops_->mark();
  for (int head = 0; head < m_.hp.n_nextn; ++head) {
    nextn_block(h, head);
    if (!first_error_) return first_error_;
    ops_->release_to(mark);
  }
  for (const SeqRows& r : rows_) {
    Hidden& s = hidden_[size_t(r.slot)];
    const int64_t keep = std::min<int64_t>(r.n, kKeptRows);
    s.rows.resize(size_t(keep * n));
    ops_->to_host(Act{hidden.row(r.first + r.n - keep), keep, n}, s.rows.data());
    s.pos0 = r.pos0 + r.n - keep;
    std::copy(s.rows.end() - n, s.rows.end(), s.pending.begin());
  }
  return ops_->status();
}

expertd::Status Engine::draft_nextn(int slot, int32_t pending, int max, std::vector<int32_t>& out,
                                    std::vector<float>* logits) {
  out.clear();
  if (logits) logits->clear();
  if (!nextn_on_) return make_error("NextN drafting is off");
  if (slot < 0 || slot >= n_seq()) return make_error("no sequence " + std::to_string(slot));
  const Hparams& hp = m_.hp;
  if (pending < 0 || pending >= hp.n_vocab)
    return make_error("token id " + std::to_string(pending) + " is outside the vocabulary");
  std::vector<float> h = hidden_[size_t(slot)].pending, row(size_t(hp.n_vocab));
  routes_.resize(size_t(hp.n_blocks()));
  // A block whose cache has a part of fixed size (DeepSeek-V4's window ring, indexed by position
  // modulo the window) would keep the drafts' rows over rows the next catch-up reads: it is copied
  // aside and put back (rows per position are rewritten by the catch-up anyway).
  std::vector<std::vector<uint8_t>> fixed(size_t(hp.n_nextn));
  for (int j = 0; j < hp.n_nextn; ++j) {
    const KvRows rows = m_.arch->kv_rows(hp, hp.n_layer + j, n_ctx_);
    if ((rows.kv_state > 0 || rows.state > 0) &&
        !ops_->save_slot(slot, 0, fixed[size_t(j)], hp.n_layer + j))
      return make_error("this backend cannot copy the NextN block's cache out");
  }
  auto st = chain(slot, pending, max, h, row, out, logits);
  for (int j = 0; j < hp.n_nextn; ++j)
    if (!fixed[size_t(j)].empty() && !ops_->load_slot(slot, 0, 0, fixed[size_t(j)], hp.n_layer + j))
      return make_error("the NextN block's cache could not be restored");
  return st;
}

// One block, one token a step (its cache grows by the drafts), or chained blocks: step i runs
// block i over the pending token and the i drafts before it from the pending position, each row
// with the hidden row the step before produced (the pending one: the trunk's), and drafts from
// the last row (llama.cpp's chain_heads rebuilds each head's rows there the same way).
expertd::Status Engine::chain(int slot, int32_t pending, int max, std::vector<float>& h,
                              std::vector<float>& row, std::vector<int32_t>& out,
                              std::vector<float>* logits) {
  const bool chained = m_.arch->nextn_chain();
  if (chained) max = std::min(max, m_.hp.n_nextn);
  const int past = n_past_[size_t(slot)];
  const int64_t cols = int64_t(h.size());
  std::vector<int32_t> toks{pending};
  std::vector<float> hs = h;  // the chained steps' hidden rows
  for (int i = 0; i < max && past + i < n_ctx_; ++i) {
    if (auto st = ops_->status(); !st) return st;
    const int head = chained ? i : 0, n = chained ? i + 1 : 1;
    const NextnWeights& w = m_.nextn[size_t(head)];
    tokens_.assign(toks.end() - n, toks.end());
    rows_.assign(1, SeqRows{slot, 0, n, past + i + 1 - n});
    ops_->begin_eval(rows_);
    first_error_ = {};
    carried_.clear();
    Act hin = ops_->alloc(n, cols);
    ops_->from_host(hs.data() + (hs.size() - size_t(n * cols)), hin);
    Act x = nextn_block(hin, head);
    if (!first_error_) return first_error_;
    Act next;
    Act hn = m_.arch->nextn_head(*this, m_, w, Act{x.row(n - 1), 1, x.cols}, &next);
    Act lg = ops_->matmul(w.head ? w.head : m_.output, hn);
    ops_->to_host(next, h.data());
    ops_->to_host(lg, row.data());
    if (auto st = ops_->status(); !st) return st;
    // The greedy draft; ties to the lowest id.
    out.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
    if (logits) logits->insert(logits->end(), row.begin(), row.end());
    toks.push_back(out.back());
    if (chained)
      hs.insert(hs.end(), h.begin(), h.end());
    else
      hs = h;
  }
  return {};
}

}  // namespace engine
