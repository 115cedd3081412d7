// Prompt prefixes reused across requests: the attention state of every prompt expert-serve
// computed (saved when its prefill ends, and at each prefill chunk's end where the model keeps
// recurrent states), kept in RAM up to a budget and evicted least recently used. A new request
// resumes from the longest cached prefix of its prompt, token-exact, and prefills only the rest.
//
// The index is hashed blocks: every kBlock tokens of an entry's tokens, the chained hash of the
// prefix up to there names the entries holding that prefix. A lookup walks its prompt's block
// hashes as deep as they match and checks the candidates token by token, so a hash collision
// can never resume the wrong state. Where the model's caches are rows per position (no
// recurrent state) an entry resumes at any position up to its length; elsewhere only at its
// full length (a checkpoint).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "serve/kv_events.h"

namespace expertd::serve {

class PrefixCache {
 public:
  static constexpr size_t kBlock = 64;  // tokens per index block; shorter prompts are not kept

  PrefixCache(size_t budget_bytes, bool can_cut) : budget_(budget_bytes), can_cut_(can_cut) {}

  struct Hit {
    std::shared_ptr<const engine::SeqState> state;
    int n = 0;  // positions to resume (0: none usable)
  };
  // The longest usable prefix of `prompt`, leaving at least its last token to evaluate.
  Hit find(std::span<const int32_t> prompt);
  // The state after `tokens` (its n_past == tokens.size()).
  void put(std::span<const int32_t> tokens, engine::SeqState state);

  // Blocks entering and leaving the index since the last call, when asked for (KV events): a
  // block is stored when the first entry holding its prefix arrives, removed when the last one
  // leaves; a put that replaces an entry by a longer one removes nothing it keeps.
  void track_events(bool on) { track_ = on; }
  std::vector<BlockEvent> take_events() { return std::exchange(events_, {}); }

  size_t bytes() const { return bytes_; }
  size_t entries() const { return live_; }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::shared_ptr<const engine::SeqState> state;
    uint64_t used = 0;
    bool live = false;
  };
  static std::vector<uint64_t> block_hashes(std::span<const int32_t> t);
  void drop(size_t id);
  void evict_to(size_t budget);

  const size_t budget_;
  const bool can_cut_;
  std::vector<Entry> entries_;  // ids are indices; dropped ones are reused
  std::vector<size_t> free_;
  std::unordered_map<uint64_t, std::vector<size_t>> index_;  // block-prefix hash -> entry ids
  size_t bytes_ = 0, live_ = 0;
  uint64_t clock_ = 0, evictions_ = 0;
  bool track_ = false;
  std::vector<uint64_t> erased_;  // block hashes whose last entry left, during one put
  std::vector<BlockEvent> events_;
};

}  // namespace expertd::serve
