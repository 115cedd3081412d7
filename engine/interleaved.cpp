#include "engine/interleaved.h"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "kernels/kernels.h"

namespace engine {

bool interleavable(const Model& m, const Tensor& t, bool experts) {
  return kernels::rows8_supported(t.type) && t.ne[1] % 8 == 0 && t.ne[0] % 256 == 0 &&
         (experts || !m.is_routed_experts(t)) &&
         !(t.data == m.tok_embd.data && m.output.data != t.data);
}

static int64_t all_rows(const Tensor& t) {
  return t.ne[1] * std::max<int64_t>(t.ne[2], 1);
}

size_t interleaved_bytes(const Model& m, bool experts) {
  size_t n = 0;
  for (const Tensor& t : m.weights)
    if (interleavable(m, t, experts)) n += kernels::rows8_bytes(t.type, all_rows(t), t.ne[0]);
  return n;
}

void UnmapBytes::operator()(uint8_t* p) const {
  if (p) ::munmap(p, size);
}

void InterleavedWeights::build(const Model& m, bool experts, kernels::ThreadPool* pool) {
  copies_.clear();
  copies_.resize(m.weights.size());
  bytes_ = 0;
  for (size_t i = 0; i < m.weights.size(); ++i) {
    const Tensor& t = m.weights[i];
    if (!interleavable(m, t, experts)) continue;
    Copy& c = copies_[i];
    const size_t bytes = kernels::rows8_bytes(t.type, all_rows(t), t.ne[0]);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    (void)::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without it the copies still work
    c.bytes = std::unique_ptr<uint8_t[], UnmapBytes>(static_cast<uint8_t*>(p), UnmapBytes{bytes});
    kernels::rows8_pack(t.type, t.data, all_rows(t), t.ne[0], c.bytes.get(), pool);
    c.host = t.data, c.host_end = t.data + t.bytes();
    c.group = kernels::rows8_bytes(t.type, 8, t.ne[0]), c.row = t.row_bytes();
    bytes_ += bytes;
  }
}

}  // namespace engine
