// Where an MoE layer's experts come from: `local` (in place in the GGUF, the reference) or
// `daemon` (expertd's shared slots through libexpertclient). Both hand the same bytes to the
// same kernels, so the two paths give bit-identical logits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "client/expert_client.h"
#include "common/result.h"
#include "engine/model.h"

namespace engine {

struct ExpertWeights {
  Tensor gate, up, down;                // one expert: {in, out}
  Tensor gate_b, up_b, down_b;          // its biases (F32), when the model has them (gpt-oss)
};

struct SourceStats {
  uint64_t acquires = 0, experts = 0, ready_at_once = 0, chunks = 0;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual std::string name() const = 0;
  // Calls fn(indices, weights) with batches of the experts of model layer `layer` as they
  // become available: every expert already resident in one batch, then the rest as they arrive.
  // weights[j] belongs to experts[indices[j]]; each expert comes exactly once, and every call of
  // fn happens before this returns.
  using BatchFn = std::function<void(std::span<const size_t>, std::span<const ExpertWeights>)>;
  virtual expertd::Status for_each_batch(int layer, std::span<const uint32_t> experts, const BatchFn& fn) = 0;
  // A hint that these experts of a later layer will be needed soon (daemon: Prefetch).
  virtual void prefetch(int layer, std::span<const uint32_t> experts) { (void)layer, (void)experts; }
  const SourceStats& stats() const { return stats_; }
  // The daemon's metrics (empty for the local source).
  virtual std::vector<expertd::proto::Metric> daemon_metrics() { return {}; }

 protected:
  SourceStats stats_;
};

std::unique_ptr<ExpertSource> make_local_source(const Model& m);

// Connects to expertd and checks that it serves this model (manifest identity and shapes).
expertd::Result<std::unique_ptr<ExpertSource>> make_daemon_source(const Model& m, const std::string& socket);

// The same connection and checks, for an engine that needs an arena of kind `arena_kind`
// ("host" for the CPU engine, "cuda" for the GPU one).
expertd::Result<std::unique_ptr<expertd::client::Client>> connect_daemon(const Model& m, const std::string& socket,
                                                                         const std::string& arena_kind);

}  // namespace engine
