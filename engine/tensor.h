// A weight as the forward pass sees it: its GGML type, its shape and where its bytes are. ne[0]
// is a row's length (the inputs): a matrix computes y = W x with ne = {in, out}; a 3-D tensor
// stacks ne[2] such matrices (experts, or per-head matrices).
#pragma once

#include <array>
#include <cstdint>

#include "kernels/kernels.h"

namespace engine {

struct Tensor {
  uint32_t type = 0;                   // GGML type id
  std::array<int64_t, 3> ne{0, 0, 0};  // {in, out, n}
  const uint8_t* data = nullptr;  // host memory (the mapped GGUF, a host slot), or device memory
  bool on_device = false;         // data is a device pointer (an expert in a cuda expertd's slot)
  // data holds the matrix interleaved eight rows at a time (kernels' rows8_pack), not its rows:
  // an expert in a host slot of a pack built with --layout rows8. Such a tensor is used whole
  // (no row views); the CPU backend runs it as a matmul job's w8.
  bool rows8 = false;
  // Its place in Model::weights (set by the loader; views keep it), -1 for any other tensor: a
  // backend that copies the weights finds the copy by it without a search.
  int32_t weight = -1;
  explicit operator bool() const { return data != nullptr; }
  const float* f32() const { return reinterpret_cast<const float*>(data); }
  size_t row_bytes() const { return kernels::row_size(type, ne[0]); }
  size_t matrix_bytes() const { return row_bytes() * static_cast<size_t>(ne[1] > 0 ? ne[1] : 1); }
  size_t bytes() const { return matrix_bytes() * static_cast<size_t>(ne[2] > 0 ? ne[2] : 1); }
  // Matrix i of a 3-D tensor (an expert, a head); row i of a 2-D F32 bias stack.
  Tensor matrix(int64_t i) const {
    Tensor s = *this;
    s.ne[2] = 1;
    s.data = data + matrix_bytes() * static_cast<size_t>(i);
    return s;
  }
  // Rows [first, first + n) of a matrix (a group of output rows).
  Tensor rows(int64_t first, int64_t n) const {
    Tensor s = *this;
    s.ne = {ne[0], n, 1};
    s.data = data + row_bytes() * static_cast<size_t>(first);
    return s;
  }
  Tensor row(int64_t i) const {
    Tensor s = *this;
    s.ne = {ne[0], 1, 1};
    s.data = data + row_bytes() * static_cast<size_t>(i);
    return s;
  }
};

}  // namespace engine
