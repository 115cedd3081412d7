// How the AVX-512 grid bodies that gather 8-byte rows (avx512.cpp's IQ1_S and IQ1_M,
// avx512_vbmi.cpp's IQ2_XS and IQ2_S) fetch a step's eight rows from their indices in a register:
// one vpgatherqq, or (kLoads, where isa.h's gathers_by_loads) the indices stored and every row
// loaded by itself, two rows to a 128-bit register, the four registers then joined. The same rows
// either way, so the same bits. (IQ3_S's sixteen 4-byte rows by loads ran no faster than its
// vpgatherdd on a Zen 4, and stay gathered.) Internal to kernels/; an unnamed namespace, so each
// file keeps its own copy, compiled with its own flags.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace kernels {
namespace {

// table[idx[i]] for the eight 64-bit indices of idx.
template <bool kLoads>
__attribute__((always_inline)) inline __m512i grid_rows64(const uint64_t* table, __m512i idx) {
  if constexpr (!kLoads) {
    return _mm512_i64gather_epi64(idx, table, 8);
  } else {
    alignas(64) uint64_t at[8];
    _mm512_store_si512(at, idx);
    __m128i q[4];
    for (int k = 0; k < 4; ++k)
      q[k] = _mm_insert_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(table + at[2 * k])),
                              static_cast<long long>(table[at[2 * k + 1]]), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_setr_m128i(q[0], q[1])),
                              _mm256_setr_m128i(q[2], q[3]), 1);
  }
}

}  // namespace
}  // namespace kernels
