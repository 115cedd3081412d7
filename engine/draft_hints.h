// Draft hints: the drafts' routing as the verify eval's prefetch (issue 47).
//
// Prompt-lookup drafts (engine/speculative.h) copy the tokens that followed an earlier occurrence
// of the history's suffix, and the engine saw that occurrence's routing. Each position's routing
// (per layer, the experts chosen: a few bytes) is kept for the sequence; before a verify eval
// starts, the experts the copied positions routed to, and those of the pending token's own twin
// (the last token of the matched occurrence), are hinted to the expert source for every MoE
// layer at once, so the deep layers' misses are read while the shallow layers compute. The same
// token after the same few tokens tends to route the same way, so the guesses are good where the
// drafts are. Hints go through the source's ordinary prefetch path (expertd admits them or not,
// --prefetch-admit) and never change the math.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace engine {

class Engine;

class RouteHistory {
 public:
  // n_layer model layers (0: the engine's, from the first record); at most positions_max
  // positions (the context) are kept.
  RouteHistory(int n_layer, int positions_max);
  // After an eval: rows [row0, row0 + n) of the engine's last eval (Engine::routes) are the
  // sequence's positions [first, first + n). Later positions are forgotten (a cut sequence);
  // earlier ones never recorded (a resumed prefix) stay unknown.
  void record(const Engine& e, int first, int row0, int n);
  // The sequence went back to its first n positions.
  void cut(int n);
  int known() const { return static_cast<int>(pos_.size()); }
  // Hints, for every MoE layer, the union of the experts positions [from, from + n) routed to
  // (positions never recorded are skipped). Returns the experts hinted, over all layers.
  size_t hint(Engine& e, int64_t from, int n) const;

 private:
  int n_layer_, positions_max_;
  // Per position: for each layer, its count then its experts.
  std::vector<std::vector<uint16_t>> pos_;
};

// The pending token's twin where no drafts were made: the latest earlier position that ends the
// longest recurring suffix of `history` (n_max tokens down to one: at least the same token);
// -1 when the token never occurred before. Its routing is the guess for the pending token's.
int64_t pending_twin(std::span<const int32_t> history, int n_max = 4);

// Totals of the hints sent (expert-run --verbose).
struct DraftHintStats {
  uint64_t steps = 0, experts = 0;
};

}  // namespace engine
