// The CPU backend's interleaved copies of a model's matrices (kernels/rows8.h): made once at
// start-up for every matrix whose type has interleaved rows, found per op by Tensor::weight. They
// give the rows' bits, so using one or not never changes a logit.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model.h"
#include "kernels/thread_pool.h"

namespace engine {

// A matrix that may have a copy: the type has interleaved rows, whole groups of eight rows, not
// embeddings only looked up, not routed experts unless `experts`.
bool interleavable(const Model& m, const Tensor& t, bool experts);
// The bytes the copies of those matrices take.
size_t interleaved_bytes(const Model& m, bool experts);

// The copies live in anonymous mappings advised to 2 MiB pages (MADV_HUGEPAGE, where transparent
// huge pages are on "madvise", as Debian and Ubuntu ship them): decode streams them end to end
// every token, one TLB entry per 2 MiB instead of per 4 KiB (Q4_K model decode, 8 alternating
// runs each: AVX-512 102.9 -> 109.8 tok/s, AVX2 88.2 -> 98.7; a whole 128-token bench run 1.13x
// the wall time, the kernel zeroing and compacting the huge pages of 1.5 GB of copies).
struct UnmapBytes {
  size_t size = 0;
  void operator()(uint8_t* p) const;
};

class InterleavedWeights {
 public:
  void build(const Model& m, bool experts, kernels::ThreadPool* pool);
  // w's copy (w a model weight, or a view into one whose first row starts a group of eight: a
  // head's rows, a group of output rows: Tensor::rows), or null.
  const void* find(const Tensor& w) const {
    if (w.weight < 0 || size_t(w.weight) >= copies_.size() || w.ne[1] % 8 != 0) return nullptr;
    const Copy& c = copies_[size_t(w.weight)];
    if (!c.bytes || w.data < c.host || w.data >= c.host_end ||
        size_t(w.data - c.host) % (8 * c.row) != 0)
      return nullptr;
    return c.bytes.get() + size_t(w.data - c.host) / (8 * c.row) * c.group;
  }
  uint64_t bytes() const { return bytes_; }

 private:
  struct Copy {
    std::unique_ptr<uint8_t[], UnmapBytes> bytes;
    const uint8_t *host = nullptr, *host_end = nullptr;  // the rows it copies
    size_t group = 0, row = 0;  // bytes of eight interleaved rows, of one row
  };
  std::vector<Copy> copies_;  // by Tensor::weight
  uint64_t bytes_ = 0;
};

}  // namespace engine
