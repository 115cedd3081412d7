#include "engine/draft_hints.h"

#include <algorithm>
#include <cassert>

#include "engine/engine.h"

namespace engine {

RouteHistory::RouteHistory(int n_layer, int positions_max)
    : n_layer_(n_layer), positions_max_(positions_max) {}

void RouteHistory::record(const Engine& e, int first, int row0, int n) {
  // Positions before `first` that were never recorded (a resumed prefix) stay unknown.
  if (first < 0 || n <= 0 || first + n > positions_max_) return;
  const auto& routes = e.routes();
  if (n_layer_ == 0) n_layer_ = static_cast<int>(routes.size());
  assert(static_cast<int>(routes.size()) == n_layer_);
  pos_.resize(size_t(first));
  for (int i = 0; i < n; ++i) {
    std::vector<uint16_t> p;
    for (int il = 0; il < n_layer_; ++il) {
      const auto& layer = routes[size_t(il)];
      const size_t row = size_t(row0 + i);
      if (row >= layer.size()) {  // a dense layer, or a backend that routed on its own
        p.push_back(0);
        continue;
      }
      const auto& ex = layer[row].experts;
      p.push_back(static_cast<uint16_t>(ex.size()));
      for (uint32_t x : ex) p.push_back(static_cast<uint16_t>(x));
    }
    pos_.push_back(std::move(p));
  }
}

void RouteHistory::cut(int n) {
  if (n < known()) pos_.resize(size_t(std::max(0, n)));
}

size_t RouteHistory::hint(Engine& e, int64_t from, int n) const {
  if (!e.wants_hints() || n <= 0) return 0;
  const int64_t lo = std::max<int64_t>(0, from), hi = std::min<int64_t>(known(), from + n);
  if (lo >= hi) return 0;
  std::vector<size_t> at(size_t(hi - lo), 0);  // each position's read offset, layer by layer
  size_t hinted = 0;
  std::vector<uint32_t> ids;
  for (int il = 0; il < n_layer_; ++il) {
    ids.clear();
    for (int64_t p = lo; p < hi; ++p) {
      const auto& v = pos_[size_t(p)];
      if (v.empty()) continue;  // never recorded
      size_t& o = at[size_t(p - lo)];
      const size_t count = v[o++];
      for (size_t j = 0; j < count; ++j) ids.push_back(v[o++]);
    }
    if (ids.empty()) continue;
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    e.hint(il, ids);
    hinted += ids.size();
  }
  return hinted;
}

int64_t pending_twin(std::span<const int32_t> h, int n_max) {
  const int64_t H = static_cast<int64_t>(h.size());
  for (int64_t n = std::min<int64_t>(n_max, H - 1); n >= 1; --n) {
    const auto suffix = h.subspan(size_t(H - n));
    for (int64_t at = H - n - 1; at >= 0; --at)
      if (std::equal(suffix.begin(), suffix.end(), h.begin() + at)) return at + n - 1;
  }
  return -1;
}

}  // namespace engine
