// The backends' scratch memory for activations: blocks that never move (a pointer handed out
// stays valid until released), bump allocation, release to a mark, and between evaluations the
// blocks merged into one of their total size, so that steady state allocates nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

namespace engine {

class BlockArena {
 public:
  using AllocFn = std::function<float*(size_t floats)>;  // null on failure
  using FreeFn = std::function<void(float*)>;
  BlockArena(AllocFn alloc, FreeFn free) : alloc_(std::move(alloc)), free_(std::move(free)) {}
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;
  ~BlockArena() { clear(); }

  // nullptr when the memory cannot be had.
  float* alloc(size_t n) {
    n = (n + 15) / 16 * 16;  // 64-byte granules
    for (;;) {
      if (cur_ < blocks_.size()) {
        const Block& b = blocks_[cur_];
        used_ = std::max(used_, b.start);
        if (used_ + n <= b.start + b.cap) {
          float* p = b.p + (used_ - b.start);
          used_ += n;
          return p;
        }
        if (cur_ + 1 < blocks_.size()) {
          ++cur_;
          continue;
        }
      }
      const size_t cap =
          std::max({n, blocks_.empty() ? 0 : 2 * blocks_.back().cap, size_t{1} << 16});
      float* p = alloc_(cap);
      if (!p) return nullptr;
      blocks_.push_back({p, blocks_.empty() ? 0 : blocks_.back().start + blocks_.back().cap, cap});
      cur_ = blocks_.size() - 1;
    }
  }
  size_t mark() const { return used_; }
  void release_to(size_t m) {
    used_ = m;
    while (cur_ > 0 && blocks_[cur_].start > m) --cur_;
  }
  // Call with nothing in use (the backend has finished with every block).
  void consolidate() {
    used_ = 0, cur_ = 0;
    if (blocks_.size() <= 1) return;
    size_t total = 0;
    for (const Block& b : blocks_) total += b.cap;
    clear();
    if (float* p = alloc_(total)) blocks_.push_back({p, 0, total});
  }

 private:
  struct Block {
    float* p;
    size_t start, cap;  // floats; blocks cover consecutive ranges of the mark space
  };
  void clear() {
    for (const Block& b : blocks_) free_(b.p);
    blocks_.clear();
    used_ = 0, cur_ = 0;
  }
  AllocFn alloc_;
  FreeFn free_;
  std::vector<Block> blocks_;
  size_t used_ = 0, cur_ = 0;
};

// Host memory for the CPU backend.
class HostArena : public BlockArena {
 public:
  HostArena()
      : BlockArena(
            [](size_t n) {
              return static_cast<float*>(::operator new (n * sizeof(float), std::align_val_t{64}));
            },
            [](float* p) { ::operator delete (p, std::align_val_t{64}); }) {}
};

}  // namespace engine
