// A std::vector whose storage starts on a 64-byte boundary (a cache line; every 32- and 64-byte
// vector load of a row whose stride is a multiple of 64 bytes stays within one line).
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace expertd {

template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding converts implicitly
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const CacheLineAllocator&) const { return true; }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace expertd
