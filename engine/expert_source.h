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
  Tensor gate, up, down;  // one expert: {in, out}
};

struct SourceStats {
  uint64_t acquires = 0, experts = 0, ready_at_once = 0, chunks = 0;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual std::string name() const = 0;
  // Calls fn(i, weights) once for each experts[i] of model layer `layer`, as each becomes
  // available (ready ones first). Every call of fn happens before this returns.
  virtual expertd::Status for_each_expert(int layer, std::span<const uint32_t> experts,
                                          const std::function<void(size_t, const ExpertWeights&)>& fn) = 0;
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

}  // namespace engine
