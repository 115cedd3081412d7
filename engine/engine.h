// The forward pass: attention with an F32 KV cache, routers, and MoE layers whose experts come
// from an ExpertSource. Prefill groups all tokens' routes per layer and fetches each unique
// expert once; expert outputs are summed in the router's order, so the result does not depend
// on which expert became ready first.
#pragma once

#include <span>
#include <vector>

#include "engine/expert_source.h"
#include "engine/model.h"
#include "kernels/kernels.h"

namespace engine {

struct Route {
  std::vector<uint32_t> experts;  // selected, in descending score order
  std::vector<float> weights;     // final mixing weights, same order
};

class Engine {
 public:
  Engine(const Model& m, ExpertSource& experts, int n_threads, int n_ctx);

  // Evaluates tokens at positions n_past().. and appends them to the KV cache. Writes the
  // logits of every token (all_logits) or of the last one to `logits` (row-major).
  expertd::Status eval(std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits);
  int n_past() const { return n_past_; }
  int n_ctx() const { return n_ctx_; }
  void reset() { n_past_ = 0; }
  // Routing of the last eval: [layer][token].
  const std::vector<std::vector<Route>>& routes() const { return routes_; }
  kernels::ThreadPool& pool() { return pool_; }
  // Before a layer's experts run, hint the next MoE layer's likely experts to the source: the
  // next router applied to the current hidden state (DESIGN.md, "Overlap").
  void set_prefetch(bool on) { prefetch_ = on; }

 private:
  void attention(int il, int T, const float* h, float* out);
  expertd::Status moe(int il, int T, const float* h, float* out);
  void dense_ffn(const Tensor& g, const Tensor& u, const Tensor& d, int T, const float* h, float* out);
  void matmul(const Tensor& w, const float* x, int T, float* y);
  void prefetch_next(int il, int T, const float* x);

  const Model& m_;
  ExpertSource& experts_;
  kernels::ThreadPool pool_;
  kernels::Scratch scratch_;
  int n_ctx_, n_past_ = 0;
  bool prefetch_ = false;
  std::vector<float> k_cache_, v_cache_;  // [layer][pos][n_head_kv * head_dim]
  std::vector<std::vector<Route>> routes_;
};

}  // namespace engine
