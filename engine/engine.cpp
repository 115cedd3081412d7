#include "engine/engine.h"

#include "engine/cpu_ops.h"

namespace engine {

using expertd::make_error;

Engine::Engine(const Model& m, ExpertSource& experts, int n_threads, int n_ctx)
    : Engine(m, make_cpu_ops(n_threads), experts, n_ctx) {}

Engine::Engine(const Model& m, std::unique_ptr<Ops> ops, ExpertSource& experts, int n_ctx)
    : m_(m), ops_(std::move(ops)), experts_(experts), n_ctx_(n_ctx) {
  init();
}

Engine::Engine(const Model& m, std::unique_ptr<Ops> ops, std::unique_ptr<ExpertSource> experts,
               int n_ctx)
    : m_(m),
      ops_(std::move(ops)),
      owned_experts_(std::move(experts)),
      experts_(*owned_experts_),
      n_ctx_(n_ctx) {
  init();
}

Engine::~Engine() = default;

void Engine::init() {
  for (int d = 0; d < 2; ++d)
    predicted_[d].assign(m_.hp.n_layer, {}), pred_stats_[d].assign(m_.hp.n_layer, {});
  std::vector<KvRows> rows;
  for (int il = 0; il < m_.hp.n_layer; ++il) {
    rows.push_back(m_.arch->kv_rows(m_.hp, il, n_ctx_));
    cache_bytes_ += sizeof(float) * (uint64_t(n_ctx_) * (rows.back().k + rows.back().v) +
                                     uint64_t(rows.back().state));
  }
  ops_->init_cache(rows, n_ctx_);
}

void Engine::reset_prediction_stats() {
  for (auto& s : pred_stats_) s.assign(m_.hp.n_layer, {});
}

expertd::Status Engine::eval(std::span<const int32_t> tokens, bool all_logits,
                             std::vector<float>& logits) {
  const Hparams& hp = m_.hp;
  const int T = static_cast<int>(tokens.size());
  if (T == 0) return make_error("no tokens to evaluate");
  if (n_past_ + T > n_ctx_)
    return make_error("context full: " + std::to_string(n_past_ + T) +
                      " tokens exceed the context of " + std::to_string(n_ctx_));
  for (int32_t tok : tokens)
    if (tok < 0 || tok >= hp.n_vocab)
      return make_error("token id " + std::to_string(tok) + " is outside the vocabulary");
  if (auto st = ops_->status(); !st) return st;
  ops_->begin_eval();
  failed_ = {};
  tokens_ = tokens;
  Act emb = ops_->alloc(T, hp.n_embd);
  ops_->embed(m_.tok_embd, tokens, emb);
  const int64_t cols = m_.arch->residual_cols(hp);
  x_ = cols == hp.n_embd ? emb : ops_->alloc(T, cols);
  routes_.assign(hp.n_layer, {});
  carried_.clear();
  m_.arch->begin_eval(*this, emb, x_);
  for (int il = 0; il < hp.n_layer; ++il) {
    const size_t mark = ops_->mark();
    m_.arch->block(*this, il, x_);
    ops_->release_to(mark);
    if (!failed_) return failed_;
    if (auto st = ops_->status(); !st) return st;
  }
  Act out = m_.arch->end_eval(*this, x_);
  if (auto st = ops_->status(); !st) return st;
  n_past_ += T;
  const int first = all_logits ? 0 : T - 1;
  Act last = out.rows_from(first);
  Act h = ops_->rms_norm(last, m_.output_norm, hp.eps);
  Act lg = ops_->matmul(m_.output, h);
  logits.resize(size_t(lg.rows) * hp.n_vocab);
  ops_->to_host(lg, logits.data());
  return ops_->status();
}

}  // namespace engine
