// The weight-row side both ISAs' matrix-matrix drivers share (gemm_avx2.cpp, gemm_avx512.cpp).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace kernels::x86 {

// Rows [r0, r1) of w (w_row bytes each) in groups of kRows: a group's units are unpacked once
// (unpack(row, unit, w); the rows past r1 are zero(w)), then each group of kLanes tokens goes
// through group(wp, gi, out), which writes out[r][t] (r the row in the group, t the token in the
// group), into y[token * rows + row]. The next group's rows are fetched into the cache while this
// one's tokens run (a few tokens a matrix, as an expert's share of a prefill, would otherwise wait
// on memory in every unpack).
template <int kRows, int kLanes, class WUnit, class Unpack, class Zero, class Group>
inline void drive_rows(int64_t units, int64_t n_tokens, int64_t rows, int64_t r0, int64_t r1,
                       const uint8_t* w, size_t w_row, const Unpack& unpack, const Zero& zero,
                       const Group& group, float* y) {
  const int64_t groups = (n_tokens + kLanes - 1) / kLanes;
  thread_local std::vector<WUnit> wp;
  wp.resize(size_t(units) * kRows);
  for (int64_t rb = r0; rb < r1; rb += kRows) {
    const int nr = int(std::min<int64_t>(kRows, r1 - rb));
    const int64_t next_end = std::min<int64_t>(r1, rb + 2 * kRows);
    if (rb + kRows < next_end) {  // the next group's rows are contiguous bytes
      const uint8_t* p = w + (rb + kRows) * w_row;
      const size_t bytes = size_t(next_end - rb - kRows) * w_row;
      for (size_t off = 0; off < bytes; off += 64)
        _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T1);
    }
    for (int r = 0; r < kRows; ++r)
      for (int64_t u = 0; u < units; ++u) {
        WUnit& wu = wp[size_t(u) * kRows + r];
        if (r < nr)
          unpack(rb + r, u, wu);
        else
          zero(wu);
      }
    for (int64_t gi = 0; gi < groups; ++gi) {
      alignas(64) float out[kRows][kLanes];
      group(static_cast<const WUnit*>(wp.data()), gi, out);
      const int nt = int(std::min<int64_t>(kLanes, n_tokens - gi * kLanes));
      for (int t = 0; t < nt; ++t)
        for (int r = 0; r < nr; ++r) y[(gi * kLanes + t) * rows + rb + r] = out[r][t];
    }
  }
}

}  // namespace kernels::x86
