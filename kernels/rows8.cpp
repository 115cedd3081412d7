// Interleaving a matrix's rows eight at a time (rows8.h) and running a group of them.
#include "kernels/rows8.h"

#include <cassert>
#include <cstring>

#include "kernels/kernels.h"

namespace kernels {

namespace {

// Q4_K's and Q5_K's d, dmin, 6-bit scales and mins unpacked, and 4-bit codes interleaved.
template <class Block, class Block8>
void pack_k45(const Block* const* rows, Block8& out) {
  for (int r = 0; r < 8; ++r) {
    const Block& b = *rows[r];
    out.d[r] = b.d, out.dmin[r] = b.dmin;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k4_scale_min(j, b.scales, &sc, &m);
      out.scales[j][r] = sc;
      out.mins[j / 2][r][j % 2] = m;
    }
    for (int p = 0; p < 4; ++p)
      for (int s = 0; s < 8; ++s) std::memcpy(out.qs[p][s][r], b.qs + 32 * p + 4 * s, 4);
  }
}

void pack_q4_k(const BlockQ4K* const* rows, BlockQ4Kx8& out) {
  pack_k45(rows, out);
}

void pack_q5_k(const BlockQ5K* const* rows, BlockQ5Kx8& out) {
  pack_k45(rows, out);
  for (int r = 0; r < 8; ++r)
    for (int s = 0; s < 8; ++s) std::memcpy(out.qh[s][r], rows[r]->qh + 4 * s, 4);
}

void pack_q2_k(const BlockQ2K* const* rows, BlockQ2Kx8& out) {
  for (int r = 0; r < 8; ++r) {
    const BlockQ2K& b = *rows[r];
    out.d[r] = b.d, out.dmin[r] = b.dmin;
    for (int k = 0; k < 16; ++k) out.scales[k][r] = b.scales[k];
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 8; ++s) std::memcpy(out.qs[h][s][r], b.qs + 32 * h + 4 * s, 4);
  }
}

void pack_q3_k(const BlockQ3K* const* rows, BlockQ3Kx8& out) {
  for (int r = 0; r < 8; ++r) {
    const BlockQ3K& b = *rows[r];
    out.d[r] = b.d;
    int8_t sc[16];
    q3k_scales(b.scales, sc);
    for (int k = 0; k < 16; ++k) out.scales[k][r] = static_cast<int8_t>(sc[k] - 32);
    for (int s = 0; s < 8; ++s) std::memcpy(out.hmask[s][r], b.hmask + 4 * s, 4);
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 8; ++s) std::memcpy(out.qs[h][s][r], b.qs + 32 * h + 4 * s, 4);
  }
}

void pack_q6_k(const BlockQ6K* const* rows, BlockQ6Kx8& out) {
  for (int r = 0; r < 8; ++r) {
    const BlockQ6K& b = *rows[r];
    out.d[r] = b.d;
    for (int k = 0; k < 16; ++k) out.scales[k][r] = b.scales[k];
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 8; ++s) {
        for (int c = 0; c < 2; ++c)
          std::memcpy(out.ql[h][c][s][r], b.ql + 64 * h + 32 * c + 4 * s, 4);
        std::memcpy(out.qh[h][s][r], b.qh + 32 * h + 4 * s, 4);
      }
  }
}

void pack_mxfp4(const BlockMxfp4* const* rows, BlockMxfp4x8& out) {
  for (int r = 0; r < 8; ++r) {
    out.e[r] = rows[r]->e;
    for (int s = 0; s < 4; ++s) std::memcpy(out.qs[s][r], rows[r]->qs + 4 * s, 4);
  }
}

void pack_nvfp4(const BlockNvfp4* const* rows, BlockNvfp4x8& out) {
  for (int r = 0; r < 8; ++r) {
    for (int k = 0; k < 4; ++k) out.d[k][r] = rows[r]->d[k];
    for (int s = 0; s < 8; ++s) std::memcpy(out.qs[s][r], rows[r]->qs + 4 * s, 4);
  }
}

// Four bytes' 2-bit fields transposed: field f of byte i from field i of byte f (its own inverse).
void transpose_fields(const uint8_t* in, uint8_t* out) {
  for (int i = 0; i < 4; ++i) {
    uint8_t v = 0;
    for (int f = 0; f < 4; ++f) v = uint8_t(v | ((in[f] >> (2 * i)) & 3) << (2 * f));
    out[i] = v;
  }
}

void pack_tq2_0(const BlockTq2_0* const* rows, BlockTq2_0x8& out) {
  for (int r = 0; r < 8; ++r) {
    out.d[r] = rows[r]->d;
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 8; ++s) std::memcpy(out.qs[h][s][r], rows[r]->qs + 32 * h + 4 * s, 4);
  }
}

void pack_q2_0(const BlockQ2_0* const* rows, BlockQ2_0x8& out) {
  for (int r = 0; r < 8; ++r) {
    out.d[r] = rows[r]->d;
    for (int s = 0; s < 4; ++s) transpose_fields(rows[r]->qs + 4 * s, out.qs[s][r]);
  }
}

void pack_q1_0(const BlockQ1_0* const* rows, BlockQ1_0x8& out) {
  for (int r = 0; r < 8; ++r) {
    out.d[r] = rows[r]->d;
    for (int j = 0; j < 16; ++j) out.qs[j][r] = rows[r]->qs[j];
  }
}

void pack_q8_0(const BlockQ8_0* const* rows, BlockQ8_0x8& out) {
  for (int r = 0; r < 8; ++r) {
    out.d[r] = rows[r]->d;
    for (int s = 0; s < 8; ++s) std::memcpy(out.qs[s][r], rows[r]->qs + 4 * s, 4);
  }
}

void pack_iq4_xs(const BlockIq4Xs* const* rows, BlockIq4Xsx8& out) {
  for (int r = 0; r < 8; ++r) {
    const BlockIq4Xs& b = *rows[r];
    out.d[r] = b.d;
    for (int ib = 0; ib < 8; ++ib) {
      const int lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF,
                hi = (b.scales_h >> (2 * ib)) & 3;
      out.scales[ib][r] = static_cast<int8_t>((lo | hi << 4) - 32);
      for (int s = 0; s < 4; ++s) std::memcpy(out.qs[ib][s][r], b.qs + 16 * ib + 4 * s, 4);
    }
  }
}

// The legacy 32-element blocks and IQ4_NL: scales (and mins), fifth bits, codes in 4-byte steps.
template <class Block, class Block8>
void pack_b32(const Block* const* rows, Block8& out) {
  for (int r = 0; r < 8; ++r) {
    const Block& b = *rows[r];
    out.d[r] = b.d;
    if constexpr (requires { b.m; }) out.m[r] = b.m;
    if constexpr (requires { b.qh; }) std::memcpy(&out.qh[r], b.qh, 4);
    for (int s = 0; s < 4; ++s) std::memcpy(out.qs[s][r], b.qs + 4 * s, 4);
  }
}

// Eight steps of eight rows' four bytes back into the rows (row r's 32 bytes to rows[r]): the AVX2
// transpose where the CPU has it.
void transpose8_scalar(const void* in, uint8_t* const* rows) {
  for (int s = 0; s < 8; ++s)
    for (int r = 0; r < 8; ++r)
      std::memcpy(rows[r] + 4 * s, static_cast<const uint8_t*>(in) + 32 * s + 4 * r, 4);
}
using Transpose8 = void (*)(const void*, uint8_t* const*);
const Transpose8 transpose8 = [] {
  __builtin_cpu_init();  // a static initializer may run before libgcc's
  return __builtin_cpu_supports("avx2") ? avx2::transpose8_u32 : transpose8_scalar;
}();

// The inverses: the rows' blocks b from eight rows' block b (every byte of the rows comes back,
// the 6-bit scales packed again as the rows hold them).
// Q4_K's and Q5_K's d, dmin and 6-bit scales and mins, packed again as the rows hold them.
template <class Block, class Block8>
void unpack_k45_scales(const Block8& in, Block* const* rows) {
  for (int r = 0; r < 8; ++r) {
    Block& b = *rows[r];
    b.d = in.d[r], b.dmin = in.dmin[r];
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) sc[j] = in.scales[j][r], m[j] = in.mins[j / 2][r][j % 2];
    for (int j = 0; j < 4; ++j) {  // k4_scale_min's bits, put back
      b.scales[j] = uint8_t((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      b.scales[j + 4] = uint8_t((m[j] & 63) | ((m[j + 4] >> 4) << 6));
      b.scales[j + 8] = uint8_t((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
    }
  }
  for (int p = 0; p < 4; ++p) {
    uint8_t* dst[8];
    for (int r = 0; r < 8; ++r) dst[r] = rows[r]->qs + 32 * p;
    transpose8(in.qs[p], dst);
  }
}

void unpack_q4_k(const BlockQ4Kx8& in, BlockQ4K* const* rows) {
  unpack_k45_scales(in, rows);
}

void unpack_q5_k(const BlockQ5Kx8& in, BlockQ5K* const* rows) {
  unpack_k45_scales(in, rows);
  uint8_t* dst[8];
  for (int r = 0; r < 8; ++r) dst[r] = rows[r]->qh;
  transpose8(in.qh, dst);
}

void unpack_q2_k(const BlockQ2Kx8& in, BlockQ2K* const* rows) {
  for (int r = 0; r < 8; ++r) {
    BlockQ2K& b = *rows[r];
    b.d = in.d[r], b.dmin = in.dmin[r];
    for (int k = 0; k < 16; ++k) b.scales[k] = in.scales[k][r];
  }
  for (int h = 0; h < 2; ++h) {
    uint8_t* dst[8];
    for (int r = 0; r < 8; ++r) dst[r] = rows[r]->qs + 32 * h;
    transpose8(in.qs[h], dst);
  }
}

void unpack_q3_k(const BlockQ3Kx8& in, BlockQ3K* const* rows) {
  for (int r = 0; r < 8; ++r) {
    BlockQ3K& b = *rows[r];
    b.d = in.d[r];
    uint8_t sc[16];
    for (int k = 0; k < 16; ++k) sc[k] = uint8_t(in.scales[k][r] + 32);
    // q3k_scales's bits, put back: scale j's low nibble in byte j % 8 (high half from j = 8 on),
    // its two high bits in byte 8 + j % 4 at bit 2 * (j / 4).
    for (int j = 0; j < 8; ++j) b.scales[j] = uint8_t((sc[j] & 0xF) | ((sc[j + 8] & 0xF) << 4));
    for (int i = 0; i < 4; ++i) {
      uint8_t hi = 0;
      for (int k = 0; k < 4; ++k) hi |= uint8_t(((sc[i + 4 * k] >> 4) & 3) << (2 * k));
      b.scales[8 + i] = hi;
    }
  }
  uint8_t* dst[8];
  for (int r = 0; r < 8; ++r) dst[r] = rows[r]->hmask;
  transpose8(in.hmask, dst);
  for (int h = 0; h < 2; ++h) {
    for (int r = 0; r < 8; ++r) dst[r] = rows[r]->qs + 32 * h;
    transpose8(in.qs[h], dst);
  }
}

void unpack_q6_k(const BlockQ6Kx8& in, BlockQ6K* const* rows) {
  for (int r = 0; r < 8; ++r) {
    rows[r]->d = in.d[r];
    for (int k = 0; k < 16; ++k) rows[r]->scales[k] = in.scales[k][r];
  }
  uint8_t* dst[8];
  for (int h = 0; h < 2; ++h) {
    for (int c = 0; c < 2; ++c) {
      for (int r = 0; r < 8; ++r) dst[r] = rows[r]->ql + 64 * h + 32 * c;
      transpose8(in.ql[h][c], dst);
    }
    for (int r = 0; r < 8; ++r) dst[r] = rows[r]->qh + 32 * h;
    transpose8(in.qh[h], dst);
  }
}

void unpack_mxfp4(const BlockMxfp4x8& in, BlockMxfp4* const* rows) {
  for (int r = 0; r < 8; ++r) {
    rows[r]->e = in.e[r];
    for (int s = 0; s < 4; ++s) std::memcpy(rows[r]->qs + 4 * s, in.qs[s][r], 4);
  }
}

void unpack_nvfp4(const BlockNvfp4x8& in, BlockNvfp4* const* rows) {
  uint8_t* dst[8];
  for (int r = 0; r < 8; ++r) {
    for (int k = 0; k < 4; ++k) rows[r]->d[k] = in.d[k][r];
    dst[r] = rows[r]->qs;
  }
  transpose8(in.qs, dst);
}

void unpack_tq2_0(const BlockTq2_0x8& in, BlockTq2_0* const* rows) {
  for (int r = 0; r < 8; ++r) {
    rows[r]->d = in.d[r];
    for (int h = 0; h < 2; ++h)
      for (int s = 0; s < 8; ++s) std::memcpy(rows[r]->qs + 32 * h + 4 * s, in.qs[h][s][r], 4);
  }
}

void unpack_q2_0(const BlockQ2_0x8& in, BlockQ2_0* const* rows) {
  for (int r = 0; r < 8; ++r) {
    rows[r]->d = in.d[r];
    for (int s = 0; s < 4; ++s) transpose_fields(in.qs[s][r], rows[r]->qs + 4 * s);
  }
}

void unpack_q1_0(const BlockQ1_0x8& in, BlockQ1_0* const* rows) {
  for (int r = 0; r < 8; ++r) {
    rows[r]->d = in.d[r];
    for (int j = 0; j < 16; ++j) rows[r]->qs[j] = in.qs[j][r];
  }
}

void unpack_q8_0(const BlockQ8_0x8& in, BlockQ8_0* const* rows) {
  uint8_t* dst[8];
  for (int r = 0; r < 8; ++r)
    rows[r]->d = in.d[r], dst[r] = reinterpret_cast<uint8_t*>(rows[r]->qs);
  transpose8(in.qs, dst);
}

void unpack_iq4_xs(const BlockIq4Xsx8& in, BlockIq4Xs* const* rows) {
  for (int r = 0; r < 8; ++r) {
    BlockIq4Xs& b = *rows[r];
    b.d = in.d[r];
    b.scales_h = 0;
    for (int ib = 0; ib < 8; ++ib) {
      const int sc = in.scales[ib][r] + 32;
      if (ib % 2 == 0) b.scales_l[ib / 2] = 0;
      b.scales_l[ib / 2] = uint8_t(b.scales_l[ib / 2] | (sc & 0xF) << (4 * (ib % 2)));
      b.scales_h = uint16_t(b.scales_h | (sc >> 4) << (2 * ib));
      for (int s = 0; s < 4; ++s) std::memcpy(b.qs + 16 * ib + 4 * s, in.qs[ib][s][r], 4);
    }
  }
}

template <class Block, class Block8>
void unpack_b32(const Block8& in, Block* const* rows) {
  for (int r = 0; r < 8; ++r) {
    Block& b = *rows[r];
    b.d = in.d[r];
    if constexpr (requires { b.m; }) b.m = in.m[r];
    if constexpr (requires { b.qh; }) std::memcpy(b.qh, &in.qh[r], 4);
    for (int s = 0; s < 4; ++s) std::memcpy(b.qs + 4 * s, in.qs[s][r], 4);
  }
}

// Eight rows' block b (rows8.h's layout of the type) from the rows' blocks b.
template <class Block, class Block8, void (*kPack)(const Block* const*, Block8&)>
void pack_groups(const void* w, size_t row, int64_t nb, void* out, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      const Block* src[8];
      for (int r = 0; r < 8; ++r)
        src[r] = reinterpret_cast<const Block*>(static_cast<const uint8_t*>(w) +
                                                size_t(8 * g + r) * row) +
                 b;
      kPack(src, static_cast<Block8*>(out)[g * nb + b]);
    }
}

// The rows' blocks b from eight rows' block b, for groups g0 .. g1.
template <class Block, class Block8, void (*kUnpack)(const Block8&, Block* const*)>
void unpack_groups(const void* w8, size_t row, int64_t nb, void* out, int64_t g0, int64_t g1) {
  for (int64_t g = g0; g < g1; ++g)
    for (int64_t b = 0; b < nb; ++b) {
      Block* dst[8];
      for (int r = 0; r < 8; ++r)
        dst[r] = reinterpret_cast<Block*>(static_cast<uint8_t*>(out) + size_t(8 * g + r) * row) + b;
      kUnpack(static_cast<const Block8*>(w8)[g * nb + b], dst);
    }
}

bool is_b32(uint32_t wtype) {  // the types of BlockB32x8
  return wtype == Q4_0 || wtype == Q4_1 || wtype == Q5_0 || wtype == Q5_1 || wtype == IQ4_NL;
}

// The rows' blocks b of the legacy 32-element types and IQ4_NL from eight rows' blocks b (pack:
// the other way), for groups g0 .. g1.
void b32_groups(bool pack, uint32_t wtype, const void* in, size_t row, int64_t nb, void* out,
                int64_t g0, int64_t g1) {
  auto run = [&]<class Block, class Block8>() {
    if (pack)
      pack_groups<Block, Block8, pack_b32<Block, Block8>>(in, row, nb, out, g0, g1);
    else
      unpack_groups<Block, Block8, unpack_b32<Block, Block8>>(in, row, nb, out, g0, g1);
  };
  switch (wtype) {
    case Q4_0:
      return run.template operator()<BlockQ4_0, BlockQ4_0x8>();
    case Q4_1:
      return run.template operator()<BlockQ4_1, BlockQ4_1x8>();
    case Q5_0:
      return run.template operator()<BlockQ5_0, BlockQ5_0x8>();
    case Q5_1:
      return run.template operator()<BlockQ5_1, BlockQ5_1x8>();
    default:
      assert(wtype == IQ4_NL);
      return run.template operator()<BlockIq4Nl, BlockIq4Nlx8>();
  }
}

}  // namespace

bool rows8_supported(uint32_t wtype) {
  return wtype == Q4_K || wtype == Q5_K || wtype == Q2_K || wtype == Q3_K || wtype == MXFP4 ||
         wtype == Q8_0 || wtype == IQ4_XS || wtype == Q6_K || wtype == NVFP4 || wtype == Q2_0 ||
         wtype == Q1_0 || wtype == TQ2_0 || is_b32(wtype);
}

size_t rows8_bytes(uint32_t wtype, int64_t rows, int64_t cols) {
  assert(rows8_supported(wtype) && rows % 8 == 0 && cols % kQK_K == 0);
  if (wtype == Q4_K) return size_t(rows / 8) * size_t(cols / kQK_K) * sizeof(BlockQ4Kx8);
  if (wtype == Q5_K) return size_t(rows / 8) * size_t(cols / kQK_K) * sizeof(BlockQ5Kx8);
  if (wtype == Q3_K) return size_t(rows / 8) * size_t(cols / kQK_K) * sizeof(BlockQ3Kx8);
  if (wtype == IQ4_XS) return size_t(rows / 8) * size_t(cols / kQK_K) * sizeof(BlockIq4Xsx8);
  return size_t(rows) * row_size(wtype, cols);  // the rows' bytes, rearranged
}

void rows8_pack(uint32_t wtype, const void* w, int64_t rows, int64_t cols, void* out,
                ThreadPool* pool) {
  const size_t row = row_size(wtype, cols);
  auto groups = [&](int64_t g0, int64_t g1) {
    if (wtype == Q4_K)
      pack_groups<BlockQ4K, BlockQ4Kx8, pack_q4_k>(w, row, cols / kQK_K, out, g0, g1);
    else if (wtype == Q2_K)
      pack_groups<BlockQ2K, BlockQ2Kx8, pack_q2_k>(w, row, cols / kQK_K, out, g0, g1);
    else if (wtype == Q3_K)
      pack_groups<BlockQ3K, BlockQ3Kx8, pack_q3_k>(w, row, cols / kQK_K, out, g0, g1);
    else if (wtype == IQ4_XS)
      pack_groups<BlockIq4Xs, BlockIq4Xsx8, pack_iq4_xs>(w, row, cols / kQK_K, out, g0, g1);
    else if (wtype == Q5_K)
      pack_groups<BlockQ5K, BlockQ5Kx8, pack_q5_k>(w, row, cols / kQK_K, out, g0, g1);
    else if (wtype == Q6_K)
      pack_groups<BlockQ6K, BlockQ6Kx8, pack_q6_k>(w, row, cols / kQK_K, out, g0, g1);
    else if (wtype == MXFP4)
      pack_groups<BlockMxfp4, BlockMxfp4x8, pack_mxfp4>(w, row, cols / kQK8_0, out, g0, g1);
    else if (wtype == NVFP4)
      pack_groups<BlockNvfp4, BlockNvfp4x8, pack_nvfp4>(w, row, cols / 64, out, g0, g1);
    else if (wtype == Q2_0)
      pack_groups<BlockQ2_0, BlockQ2_0x8, pack_q2_0>(w, row, cols / 64, out, g0, g1);
    else if (wtype == TQ2_0)
      pack_groups<BlockTq2_0, BlockTq2_0x8, pack_tq2_0>(w, row, cols / kQK_K, out, g0, g1);
    else if (wtype == Q1_0)
      pack_groups<BlockQ1_0, BlockQ1_0x8, pack_q1_0>(w, row, cols / 128, out, g0, g1);
    else if (is_b32(wtype))
      b32_groups(true, wtype, w, row, cols / kQK8_0, out, g0, g1);
    else
      pack_groups<BlockQ8_0, BlockQ8_0x8, pack_q8_0>(w, row, cols / kQK8_0, out, g0, g1);
  };
  if (pool)
    pool->parallel_for(rows / 8, 16, groups);
  else
    groups(0, rows / 8);
}

void rows8_unpack_groups(uint32_t wtype, const void* w8, int64_t cols, void* out, int64_t g0,
                         int64_t g1) {
  const size_t row = row_size(wtype, cols);
  if (wtype == Q4_K)
    unpack_groups<BlockQ4K, BlockQ4Kx8, unpack_q4_k>(w8, row, cols / kQK_K, out, g0, g1);
  else if (wtype == Q2_K)
    unpack_groups<BlockQ2K, BlockQ2Kx8, unpack_q2_k>(w8, row, cols / kQK_K, out, g0, g1);
  else if (wtype == Q3_K)
    unpack_groups<BlockQ3K, BlockQ3Kx8, unpack_q3_k>(w8, row, cols / kQK_K, out, g0, g1);
  else if (wtype == IQ4_XS)
    unpack_groups<BlockIq4Xs, BlockIq4Xsx8, unpack_iq4_xs>(w8, row, cols / kQK_K, out, g0, g1);
  else if (wtype == Q5_K)
    unpack_groups<BlockQ5K, BlockQ5Kx8, unpack_q5_k>(w8, row, cols / kQK_K, out, g0, g1);
  else if (wtype == Q6_K)
    unpack_groups<BlockQ6K, BlockQ6Kx8, unpack_q6_k>(w8, row, cols / kQK_K, out, g0, g1);
  else if (wtype == MXFP4)
    unpack_groups<BlockMxfp4, BlockMxfp4x8, unpack_mxfp4>(w8, row, cols / kQK8_0, out, g0, g1);
  else if (wtype == NVFP4)
    unpack_groups<BlockNvfp4, BlockNvfp4x8, unpack_nvfp4>(w8, row, cols / 64, out, g0, g1);
  else if (wtype == Q2_0)
    unpack_groups<BlockQ2_0, BlockQ2_0x8, unpack_q2_0>(w8, row, cols / 64, out, g0, g1);
  else if (wtype == TQ2_0)
    unpack_groups<BlockTq2_0, BlockTq2_0x8, unpack_tq2_0>(w8, row, cols / kQK_K, out, g0, g1);
  else if (wtype == Q1_0)
    unpack_groups<BlockQ1_0, BlockQ1_0x8, unpack_q1_0>(w8, row, cols / 128, out, g0, g1);
  else if (is_b32(wtype))
    b32_groups(false, wtype, w8, row, cols / kQK8_0, out, g0, g1);
  else
    unpack_groups<BlockQ8_0, BlockQ8_0x8, unpack_q8_0>(w8, row, cols / kQK8_0, out, g0, g1);
}

void rows8_unpack(uint32_t wtype, const void* w8, int64_t rows, int64_t cols, void* out,
                  ThreadPool* pool) {
  auto groups = [&](int64_t g0, int64_t g1) { rows8_unpack_groups(wtype, w8, cols, out, g0, g1); };
  if (pool)
    pool->parallel_for(rows / 8, 16, groups);
  else
    groups(0, rows / 8);
}

void rows8_group(uint32_t wtype, const void* w8, int64_t cols, int64_t g, const void* const* xs,
                 int n_tok, float* out, Isa b) {
  const bool vnni = b == Isa::Avx512;
  if (wtype == Q4_K) {
    const auto* group = static_cast<const BlockQ4Kx8*>(w8) + g * (cols / kQK_K);
    avx2::rows8_q4_k(group, cols, reinterpret_cast<const BlockQ8K* const*>(xs), n_tok, out);
  } else if (wtype == Q2_K) {
    const auto* group = static_cast<const BlockQ2Kx8*>(w8) + g * (cols / kQK_K);
    const auto* ys = reinterpret_cast<const BlockQ8K* const*>(xs);
    vnni ? avx512::rows8_q2_k(group, cols, ys, n_tok, out)
         : avx2::rows8_q2_k(group, cols, ys, n_tok, out);
  } else if (wtype == Q3_K) {
    const auto* group = static_cast<const BlockQ3Kx8*>(w8) + g * (cols / kQK_K);
    const auto* ys = reinterpret_cast<const BlockQ8K* const*>(xs);
    vnni ? avx512::rows8_q3_k(group, cols, ys, n_tok, out)
         : avx2::rows8_q3_k(group, cols, ys, n_tok, out);
  } else if (wtype == IQ4_XS) {
    const auto* group = static_cast<const BlockIq4Xsx8*>(w8) + g * (cols / kQK_K);
    const auto* ys = reinterpret_cast<const BlockQ8K* const*>(xs);
    vnni ? avx512::rows8_iq4_xs(group, cols, ys, n_tok, out)
         : avx2::rows8_iq4_xs(group, cols, ys, n_tok, out);
  } else if (wtype == Q5_K) {
    const auto* group = static_cast<const BlockQ5Kx8*>(w8) + g * (cols / kQK_K);
    avx2::rows8_q5_k(group, cols, reinterpret_cast<const BlockQ8K* const*>(xs), n_tok, out);
  } else if (wtype == Q6_K) {
    const auto* group = static_cast<const BlockQ6Kx8*>(w8) + g * (cols / kQK_K);
    avx2::rows8_q6_k(group, cols, reinterpret_cast<const BlockQ8K* const*>(xs), n_tok, out);
  } else if (is_b32(wtype)) {
    const auto* group = static_cast<const uint8_t*>(w8) + size_t(g) * rows8_bytes(wtype, 8, cols);
    vnni ? avx512::rows8_b32(wtype, group, cols, xs, n_tok, out)
         : avx2::rows8_b32(wtype, group, cols, xs, n_tok, out);
  } else if (wtype == Q2_0) {
    const auto* group = static_cast<const BlockQ2_0x8*>(w8) + g * (cols / 64);
    const auto* ys = reinterpret_cast<const BlockQ8_0* const*>(xs);
    vnni ? avx512::rows8_q2_0(group, cols, ys, n_tok, out)
         : avx2::rows8_q2_0(group, cols, ys, n_tok, out);
  } else if (wtype == TQ2_0) {
    const auto* group = static_cast<const BlockTq2_0x8*>(w8) + g * (cols / kQK_K);
    const auto* ys = reinterpret_cast<const BlockQ8K* const*>(xs);
    vnni ? avx512::rows8_tq2_0(group, cols, ys, n_tok, out)
         : avx2::rows8_tq2_0(group, cols, ys, n_tok, out);
  } else if (wtype == Q1_0) {
    const auto* group = static_cast<const BlockQ1_0x8*>(w8) + g * (cols / 128);
    const auto* ys = reinterpret_cast<const BlockQ8_0* const*>(xs);
    vnni ? avx512::rows8_q1_0(group, cols, ys, n_tok, out)
         : avx2::rows8_q1_0(group, cols, ys, n_tok, out);
  } else if (wtype == NVFP4) {
    const auto* group = static_cast<const BlockNvfp4x8*>(w8) + g * (cols / 64);
    const auto* ys = reinterpret_cast<const BlockQ8_0* const*>(xs);
    vnni ? avx512::rows8_nvfp4(group, cols, ys, n_tok, out)
         : avx2::rows8_nvfp4(group, cols, ys, n_tok, out);
  } else if (wtype == MXFP4) {
    const auto* group = static_cast<const BlockMxfp4x8*>(w8) + g * (cols / kQK8_0);
    avx2::rows8_mxfp4(group, cols, reinterpret_cast<const BlockQ8_0* const*>(xs), n_tok, out);
  } else {
    assert(wtype == Q8_0);
    const auto* group = static_cast<const BlockQ8_0x8*>(w8) + g * (cols / kQK8_0);
    avx2::rows8_q8_0(group, cols, reinterpret_cast<const BlockQ8_0* const*>(xs), n_tok, out);
  }
}

}  // namespace kernels
