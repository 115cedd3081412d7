// F16 and BF16 weights in the matrix-matrix path (gemm_avx2.cpp, gemm_avx512.cpp). Their dots
// widen the weights and the activations (F16 / BF16 words) for every row and token; here the
// activations are widened to floats once per matrix, laid out in the order the instruction set's
// dot takes them, and each pass widens a few weight rows once for a few tokens. Each (row, token)
// is summed in its dot's chains, the same products in the same order: the dot's bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/quant_blocks.h"

namespace kernels::x86 {

inline bool float_panel_type(uint32_t wtype) {
  return wtype == F16 || wtype == BF16;
}

// The widened activations: n_tokens rows of cols floats.
inline size_t float_panel_bytes(int64_t cols, int64_t n_tokens) {
  return size_t(n_tokens) * size_t(cols) * sizeof(float) + 64;
}

// The panel's floats from its first 64-byte boundary (float_panel_bytes leaves room).
template <class B>
auto float_panel(B* panel) {
  using F = std::conditional_t<std::is_const_v<B>, const float, float>;
  return reinterpret_cast<F*>((reinterpret_cast<uintptr_t>(panel) + 63) & ~uintptr_t{63});
}

// Rows [r0, r1) of w (cols words each) against the tokens of the panel (token t at panel + t *
// cols), into y[t * rows + r]: blocks of 16 rows (kept in L2) against groups of up to kN tokens
// (kept in L1), kR rows a pass: pass(nr, nt, rows_at, xs, out) writes out[r][t] for r < nr rows
// from rows_at (cols apart) and t < nt tokens.
template <int kR, int kN, class Pass>
void float_rows(const uint16_t* w, int64_t rows, int64_t cols, int64_t r0, int64_t r1,
                const float* panel, int64_t n_tokens, float* y, const Pass& pass) {
  constexpr int64_t kBlock = 16;
  for (int64_t rb = r0; rb < r1; rb += kBlock) {
    const int64_t re = std::min(r1, rb + kBlock);
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kN) {
      const int nt = int(std::min<int64_t>(kN, n_tokens - t0));
      const float* xs[kN];
      for (int t = 0; t < nt; ++t) xs[t] = panel + (t0 + t) * cols;
      for (int64_t r = rb; r < re; r += kR) {
        const int nr = int(std::min<int64_t>(kR, re - r));
        float out[kR][kN];
        pass(nr, nt, w + r * cols, xs, out);
        for (int i = 0; i < nr; ++i)
          for (int t = 0; t < nt; ++t) y[(t0 + t) * rows + r + i] = out[i][t];
      }
    }
  }
}

}  // namespace kernels::x86
