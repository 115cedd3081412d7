// The layers' co-occurrence, learned online: which experts of the next few layers a token's
// forward pass (a step) uses after the experts it used so far. lfru+affinity raises an expert's
// count by the chance that the step in progress uses it, so an eviction in the middle of a step
// spares the experts its later layers are likely to need. Shared by the daemon's cache and the
// trace simulator, so a replay reproduces the daemon's choices.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace expertd::daemon {

class Affinity {
 public:
  // Co-occurrence is kept up to 4 layers ahead, fewer where the table (2 bytes per pair of
  // experts per layer ahead) would pass `budget_bytes`; at least 1.
  static constexpr uint32_t kMaxLayersAhead = 4;
  static constexpr size_t kBudgetBytes = size_t{32} << 20;
  Affinity(uint32_t layers, uint32_t experts, size_t budget_bytes = kBudgetBytes);
  uint32_t layers_ahead() const { return ahead_; }
  // One acquire (or trace record) of `client`'s: a layer below its previous one ends the step
  // (its co-occurrence is counted) and starts another.
  void record(uint32_t client, uint32_t layer, std::span<const uint32_t> experts);
  // The chance that `client`'s step in progress uses `expert` of `layer` (a layer after its
  // last one), a naive-Bayes estimate from the experts the step used at the layers_ahead()
  // layers before `layer`; the expert's share of steps when nothing is known.
  double chance(uint32_t client, uint32_t layer, uint32_t expert) const;
  // The last layer `client` acquired in its step, or -1 before its first acquire.
  int64_t step_layer(uint32_t client) const;
  size_t table_bytes() const { return co_.size() * sizeof(co_[0]); }

 private:
  struct Step {
    uint32_t last_layer = 0;
    std::vector<std::vector<uint32_t>> used;  // per layer, sorted, unique
  };
  void end_step(Step& s);
  size_t cell(uint32_t layer, uint32_t expert, uint32_t ahead) const {
    return (size_t{layer} * X_ + expert) * ahead_ + (ahead - 1);
  }
  uint32_t L_, X_, ahead_;
  uint64_t steps_ = 0;
  std::vector<uint32_t> base_;  // (layer, expert) -> steps that used it
  std::vector<uint32_t> seen_;  // cell -> steps that used the expert and reached layer + ahead
  std::vector<uint16_t> co_;    // cell x expert of layer + ahead -> steps that used both
  std::unordered_map<uint32_t, Step> steps_of_;
};

}  // namespace expertd::daemon
