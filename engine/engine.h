// The forward pass: attention with an F32 KV cache, routers, and MoE layers whose experts come
// from an ExpertSource. Prefill groups all tokens' routes per layer and fetches each unique
// expert once; expert outputs are summed in the router's order, so the result does not depend
// on which expert became ready first.
#pragma once

#include <array>
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

// One token's routing from its router logits (overwritten with the gate scores): softmax or
// sigmoid gating, selection bias, expert groups, top-k then softmax (gpt-oss). The CPU engine's,
// and the GPU engine's where its softmax/top-k kernel does not cover the architecture.
void select_experts(const Model& m, const LayerWeights& w, float* logits, Route& r);

// The experts worth prefetching for a layer: the union over T tokens of the top-k of that
// layer's raw router logits (T x n_expert), ascending ids.
std::vector<uint32_t> likely_experts(const float* logits, int T, int n_expert, int k);

// What expert-run drives: the CPU engine below or the CUDA one (engine/cuda_engine.h).
class Forward {
 public:
  virtual ~Forward() = default;
  // Evaluates tokens at positions n_past().. and appends them to the KV cache. Writes the
  // logits of every token (all_logits) or of the last one to `logits` (row-major).
  virtual expertd::Status eval(std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits) = 0;
  virtual int n_past() const = 0;
  virtual int n_ctx() const = 0;
  virtual void reset() = 0;
  virtual void set_prefetch(bool on) = 0;
  virtual std::string experts_name() const = 0;                      // "local" or "daemon"
  virtual std::vector<expertd::proto::Metric> daemon_metrics() = 0;  // empty without a daemon
  virtual std::string device_name() const = 0;                       // CPU kernels or the GPU
};

class Engine final : public Forward {
 public:
  Engine(const Model& m, ExpertSource& experts, int n_threads, int n_ctx);

  expertd::Status eval(std::span<const int32_t> tokens, bool all_logits, std::vector<float>& logits) override;
  int n_past() const override { return n_past_; }
  int n_ctx() const override { return n_ctx_; }
  void reset() override { n_past_ = 0; }
  std::string experts_name() const override { return experts_.name(); }
  std::vector<expertd::proto::Metric> daemon_metrics() override { return experts_.daemon_metrics(); }
  std::string device_name() const override { return kernels::backend_name(kernels::best_backend()); }
  // Routing of the last eval: [layer][token].
  const std::vector<std::vector<Route>>& routes() const { return routes_; }
  kernels::ThreadPool& pool() { return pool_; }
  // Before a layer's experts run, hint the next MoE layer's likely experts to the source: the
  // next router applied to the current hidden state (DESIGN.md, "Overlap").
  void set_prefetch(bool on) override { prefetch_ = on; }

 private:
  void attention(int il, int T, const float* h, float* out);
  void attention_mla(int il, int T, const float* h, float* out);
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
  // Work buffers kept across calls: a prefill's would otherwise be page-faulted and zeroed anew
  // for every layer.
  struct Buffers {
    std::vector<float> x, h, tmp, att, q, k, v, expert_out, qf, att2, mla_in, mla_out;
    std::vector<kernels::MatmulJob> jobs;
    std::vector<std::vector<float>> g, u, ys;
    std::vector<std::vector<uint8_t>> aq;
    struct Quantized {  // a layer's inputs quantized for the gate/up activation type
      uint32_t type = ~0u;
      size_t row = 0;
      std::vector<uint8_t> buf;
    };
    std::array<Quantized, 2> hq;
  } buf_;
};

}  // namespace engine
