#include "serve/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>

namespace expertd::serve {

std::vector<uint64_t> PrefixCache::block_hashes(std::span<const int32_t> t) {
  std::vector<uint64_t> h;
  uint64_t seed = 0;
  for (size_t b = 0; (b + 1) * kBlock <= t.size(); ++b) {
    seed = XXH3_64bits_withSeed(t.data() + b * kBlock, kBlock * sizeof(int32_t), seed);
    h.push_back(seed);
  }
  return h;
}

PrefixCache::Hit PrefixCache::find(std::span<const int32_t> prompt) {
  Hit best;
  if (prompt.size() <= kBlock) return best;
  const size_t limit = prompt.size() - 1;  // the last token is evaluated for its logits
  const auto hashes = block_hashes(prompt.first(limit));
  // Entries holding the prompt's first blocks, as deep as they match (a checkpoint shorter than
  // the deepest match may still be the longest whole one).
  std::vector<size_t> cands;
  for (uint64_t h : hashes) {
    auto it = index_.find(h);
    if (it == index_.end()) break;
    cands.insert(cands.end(), it->second.begin(), it->second.end());
  }
  std::sort(cands.begin(), cands.end());
  cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
  size_t best_id = 0;
  for (size_t id : cands) {
    const Entry& e = entries_[id];
    size_t n = 0;
    const size_t upto = std::min(e.tokens.size(), limit);
    while (n < upto && e.tokens[n] == prompt[n]) ++n;
    if (!can_cut_ && n != e.tokens.size()) continue;  // a checkpoint resumes only whole
    if (int(n) > best.n) best = {e.state, int(n)}, best_id = id;
  }
  if (best.n > 0) entries_[best_id].used = ++clock_;
  return best;
}

void PrefixCache::put(std::span<const int32_t> tokens, engine::SeqState state) {
  if (tokens.size() < kBlock || state.bytes() > budget_) return;
  const auto hashes = block_hashes(tokens);
  // The first of this entry's blocks the index lacks: it and those after it are new (a block's
  // hash chains all before it).
  size_t first_new = 0;
  while (first_new < hashes.size() && index_.contains(hashes[first_new])) ++first_new;
  erased_.clear();
  // An entry this one makes redundant: the same tokens, or (where states cut) a prefix of them.
  if (auto it = index_.find(hashes.back()); it != index_.end())
    for (size_t id : std::vector<size_t>(it->second)) {
      const Entry& e = entries_[id];
      const bool same = e.tokens.size() == tokens.size();
      const bool covered = e.tokens.size() < tokens.size() && can_cut_;
      if ((same || covered) && std::equal(e.tokens.begin(), e.tokens.end(), tokens.begin()))
        drop(id);
    }
  evict_to(budget_ - state.bytes());
  size_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = entries_.size();
    entries_.emplace_back();
  }
  Entry& e = entries_[id];
  e.tokens.assign(tokens.begin(), tokens.end());
  bytes_ += state.bytes();
  e.state = std::make_shared<const engine::SeqState>(std::move(state));
  e.used = ++clock_;
  e.live = true;
  ++live_;
  for (uint64_t h : hashes) index_[h].push_back(id);
  if (!track_) return;
  // Removed: what left the index and did not come back with this entry.
  std::sort(erased_.begin(), erased_.end());
  erased_.erase(std::unique(erased_.begin(), erased_.end()), erased_.end());
  std::erase_if(erased_, [&](uint64_t h) { return index_.contains(h); });
  if (!erased_.empty()) events_.push_back({BlockEvent::Removed, std::move(erased_), false, 0, {}});
  erased_.clear();
  if (first_new < hashes.size()) {
    BlockEvent ev;
    ev.kind = BlockEvent::Stored;
    ev.hashes.assign(hashes.begin() + std::ptrdiff_t(first_new), hashes.end());
    ev.has_parent = first_new > 0;
    ev.parent = first_new > 0 ? hashes[first_new - 1] : 0;
    ev.tokens.assign(tokens.begin() + std::ptrdiff_t(first_new * kBlock),
                     tokens.begin() + std::ptrdiff_t(hashes.size() * kBlock));
    events_.push_back(std::move(ev));
  }
}

void PrefixCache::drop(size_t id) {
  Entry& e = entries_[id];
  if (!e.live) return;
  for (uint64_t h : block_hashes(e.tokens)) {
    auto it = index_.find(h);
    if (it == index_.end()) continue;
    std::erase(it->second, id);
    if (it->second.empty()) {
      index_.erase(it);
      if (track_) erased_.push_back(h);
    }
  }
  bytes_ -= e.state->bytes();
  e = Entry{};
  free_.push_back(id);
  --live_;
}

void PrefixCache::evict_to(size_t budget) {
  while (bytes_ > budget && live_ > 0) {
    size_t oldest = entries_.size();
    for (size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].live &&
          (oldest == entries_.size() || entries_[i].used < entries_[oldest].used))
        oldest = i;
    drop(oldest);
    ++evictions_;
  }
}

}  // namespace expertd::serve
