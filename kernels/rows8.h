// Weights interleaved eight rows at a time, for the matrix-vector product of decode. A row-major
// matrix's dot per row sums each row across the lanes of a register and broadcasts every
// sub-block scale over its 32 weights; here the eight rows of a group sit in the eight 32-bit
// lanes of one register (four bytes of each row side by side), so one broadcast activation serves
// eight rows, each lane's scale is the row's own, and no lane is summed across. llama.cpp's
// repacked blocks (block_q4_Kx8) do the same at load; this layout is ours.
//
// The arithmetic is the rows' (avx2.h's sb_lanes): super-block b's exact integer sums into float
// lane b % 8 of its row, the lanes summed in hsum's order, so a row's result has exactly the bits
// dot() gives for it. The interleaved copy is an addition to the rows (MatmulJob::w8), never a
// different answer. Internal to kernels/.
#pragma once

#include <cstdint>

#include "kernels/quant_blocks.h"

namespace kernels {

// Eight rows' super-block b of Q4_K (1184 bytes against the rows' 8 x 144): d and dmin as the
// rows hold them, the 6-bit scales and mins unpacked, the codes interleaved in 4-byte steps.
struct BlockQ4Kx8 {
  uint16_t d[8], dmin[8];  // fp16, row r in [r]
  uint8_t scales[8][8];    // [sub-block][row]
  uint8_t mins[4][8][2];   // [sub-block pair][row][sub-block 2p, 2p + 1]
  uint8_t qs[4][8][8][4];  // [sub-block pair p][step s][row][4 bytes]: the row's qs[32p + 4s ..]
};
static_assert(sizeof(BlockQ4Kx8) == 1184);

// Eight rows' super-block b of Q5_K (1440 bytes against the rows' 8 x 176): Q4_K's, and the high
// bits' 32 bytes of every row interleaved in 4-byte steps (step s: the row's qh[4s ..], whose bits
// 2p and 2p + 1 are the fifth bits of pair p's step s, low and high nibbles).
struct BlockQ5Kx8 {
  uint16_t d[8], dmin[8];  // fp16, row r in [r]
  uint8_t scales[8][8];    // [sub-block][row]
  uint8_t mins[4][8][2];   // [sub-block pair][row][sub-block 2p, 2p + 1]
  uint8_t qh[8][8][4];     // [step s][row][4 bytes]: the row's qh[4s ..]
  uint8_t qs[4][8][8][4];  // [sub-block pair p][step s][row][4 bytes]: the row's qs[32p + 4s ..]
};
static_assert(sizeof(BlockQ5Kx8) == 1440);

// Eight rows' block b of MXFP4 (the rows' 8 x 17 bytes): the exponents, the codes interleaved in
// 4-byte steps.
struct BlockMxfp4x8 {
  uint8_t e[8];         // row r's E8M0 exponent in [r]
  uint8_t qs[4][8][4];  // [step s][row][4 bytes]: the row's qs[4s ..] (elements 4s.., 16 + 4s..)
};
static_assert(sizeof(BlockMxfp4x8) == 8 * sizeof(BlockMxfp4));

// Eight rows' block b of NVFP4 (the rows' 8 x 36 bytes): the UE4M3 sub-block scales, the codes in
// 4-byte steps (step s: the row's qs[4s ..], sub-block s / 2's elements 4 (s % 2).. in the low
// nibbles and 8 + 4 (s % 2).. in the high).
struct BlockNvfp4x8 {
  uint8_t d[4][8];      // [sub-block][row]
  uint8_t qs[8][8][4];  // [step s][row][4 bytes]: the row's qs[4s ..]
};
static_assert(sizeof(BlockNvfp4x8) == 8 * sizeof(BlockNvfp4));

// Eight rows' super-block b of TQ2_0 (the rows' 8 x 66 bytes): the scales, the codes in 4-byte
// steps as Q2_K's (step s of half h: a row's qs[32h + 4s ..], its lane s of the row dot's eight).
struct BlockTq2_0x8 {
  uint16_t d[8];           // fp16, row r in [r]
  uint8_t qs[2][8][8][4];  // [half h][step s][row][4 bytes]: the row's qs[32h + 4s ..]
};
static_assert(sizeof(BlockTq2_0x8) == 8 * sizeof(BlockTq2_0));

// Eight rows' block b of Q2_0 (the rows' 8 x 18 bytes): the scales, the codes in 4-byte steps with
// each step's 2-bit fields transposed, so that field f of a step's byte i is element 16s + 4f + i
// (in the rows, element 4m + f is field f of byte m): one shift and mask give a row's four
// consecutive elements in each 4-byte lane.
struct BlockQ2_0x8 {
  uint16_t d[8];        // fp16, row r in [r]
  uint8_t qs[4][8][4];  // [step s][row][4 bytes]: the row's qs[4s ..], fields transposed
};
static_assert(sizeof(BlockQ2_0x8) == 8 * sizeof(BlockQ2_0));

// Eight rows' block b of Q1_0 (the rows' 8 x 18 bytes): the scales, then the rows' bytes side by
// side (qs[j][r] = row r's qs[j], elements 8j .. 8j + 7 in its bits): eight bytes are the byte mask
// of eight rows' eight weights, one row per 8-byte lane, against one broadcast of eight
// activations.
struct BlockQ1_0x8 {
  uint16_t d[8];      // fp16, row r in [r]
  uint8_t qs[16][8];  // [byte j][row r]
};
static_assert(sizeof(BlockQ1_0x8) == 8 * sizeof(BlockQ1_0));

// Eight rows' block b of Q8_0 (the rows' 8 x 34 bytes): the scales, the values in 4-byte steps.
struct BlockQ8_0x8 {
  uint16_t d[8];       // fp16, row r in [r]
  int8_t qs[8][8][4];  // [step s][row][4 bytes]: the row's qs[4s ..]
};
static_assert(sizeof(BlockQ8_0x8) == 8 * sizeof(BlockQ8_0));

// Eight rows' super-block b of Q2_K (the rows' 8 x 84 bytes): d and dmin, each sub-block's packed
// scale and min as the rows hold them, the codes interleaved in 4-byte steps.
struct BlockQ2Kx8 {
  uint16_t d[8], dmin[8];  // fp16, row r in [r]
  uint8_t scales[16][8];   // [sub-block][row]: scale in the low nibble, min in the high
  uint8_t qs[2][8][8][4];  // [half h][step s][row][4 bytes]: the row's qs[32h + 4s ..]
};
static_assert(sizeof(BlockQ2Kx8) == 8 * sizeof(BlockQ2K));

// Eight rows' super-block b of Q3_K (912 bytes against the rows' 8 x 110): d, the 6-bit scales
// unpacked (less 32), the high bits and the low codes interleaved in 4-byte steps.
struct BlockQ3Kx8 {
  uint16_t d[8];           // fp16, row r in [r]
  int8_t scales[16][8];    // [sub-block][row]: the scale less 32
  uint8_t hmask[8][8][4];  // [step s][row][4 bytes]: the row's hmask[4s ..]
  uint8_t qs[2][8][8][4];  // [half h][step s][row][4 bytes]: the row's qs[32h + 4s ..]
};
static_assert(sizeof(BlockQ3Kx8) == 912);

// Eight rows' super-block b of IQ4_XS (1104 bytes against the rows' 8 x 136): d, the 6-bit
// sub-block scales unpacked (less 32), the 4-bit indices into kvalues_iq4nl interleaved in 4-byte
// steps.
struct BlockIq4Xsx8 {
  uint16_t d[8];           // fp16, row r in [r]
  int8_t scales[8][8];     // [sub-block][row]: the scale less 32
  uint8_t qs[8][4][8][4];  // [sub-block][step s][row][4 bytes]: the row's qs[16 ib + 4s ..]
};
static_assert(sizeof(BlockIq4Xsx8) == 1104);

// Eight rows' super-block b of Q6_K (the rows' 8 x 210 bytes): d, the int8 sub-block scales, the
// low nibbles and the high bit pairs interleaved in 4-byte steps.
struct BlockQ6Kx8 {
  uint16_t d[8];         // fp16, row r in [r]
  int8_t scales[16][8];  // [sub-block][row]
  uint8_t ql[2][2][8][8]
            [4];  // [half h][chunk c][step s][row][4 bytes]: the row's ql[64h + 32c + 4s ..]
  uint8_t qh[2][8][8][4];  // [half h][step s][row][4 bytes]: the row's qh[32h + 4s ..]
};
static_assert(sizeof(BlockQ6Kx8) == 8 * sizeof(BlockQ6K));

// Eight rows' block b of the legacy 32-element types (Q4_0, Q4_1, Q5_0, Q5_1) and IQ4_NL (the
// rows' 8 x 18 to 8 x 24 bytes): the scales (and mins), each row's 32 fifth bits as its u32, the
// codes interleaved in 4-byte steps (step s: the row's qs[4s ..], elements 4s.. in the low
// nibbles, 16 + 4s.. in the high). IQ4_NL's blocks are Q4_0's (an fp16 scale, 16 bytes of codes).
template <bool kMin, bool kFifth>
struct BlockB32x8;
template <>
struct BlockB32x8<false, false> {  // Q4_0, IQ4_NL
  uint16_t d[8];
  uint8_t qs[4][8][4];
};
template <>
struct BlockB32x8<true, false> {  // Q4_1
  uint16_t d[8], m[8];
  uint8_t qs[4][8][4];
};
template <>
struct BlockB32x8<false, true> {  // Q5_0
  uint16_t d[8];
  uint32_t qh[8];
  uint8_t qs[4][8][4];
};
template <>
struct BlockB32x8<true, true> {  // Q5_1
  uint16_t d[8], m[8];
  uint32_t qh[8];
  uint8_t qs[4][8][4];
};
using BlockQ4_0x8 = BlockB32x8<false, false>;
using BlockIq4Nlx8 = BlockB32x8<false, false>;
using BlockQ4_1x8 = BlockB32x8<true, false>;
using BlockQ5_0x8 = BlockB32x8<false, true>;
using BlockQ5_1x8 = BlockB32x8<true, true>;
static_assert(sizeof(BlockQ4_0x8) == 8 * sizeof(BlockQ4_0) &&
              sizeof(BlockIq4Nlx8) == 8 * sizeof(BlockIq4Nl) &&
              sizeof(BlockQ4_1x8) == 8 * sizeof(BlockQ4_1) &&
              sizeof(BlockQ5_0x8) == 8 * sizeof(BlockQ5_0) &&
              sizeof(BlockQ5_1x8) == 8 * sizeof(BlockQ5_1));

// Groups g0 .. g1 of an interleaved matrix back into its rows (rows 8 g0 .. 8 g1 of `out`, a
// matrix of rows in wtype): rows8_unpack's loop, for callers that split it themselves.
void rows8_unpack_groups(uint32_t wtype, const void* w8, int64_t cols, void* out, int64_t g0,
                         int64_t g1);

namespace avx2 {
// Eight steps of eight rows' four bytes (in: [step][row][4]) back into the rows: row r's 32 bytes
// (steps 0..7) to rows[r]. An 8 x 8 transpose of 32-bit words.
void transpose8_u32(const void* in, uint8_t* const* rows);
// One group of eight rows (its blocks from `group`, cols / 256 of them) against n_tok (1..4)
// Q8_K activation rows: out[t * 8 + r] is row r's dot with token t.
void rows8_q4_k(const BlockQ4Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out);
void rows8_mxfp4(const BlockMxfp4x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                 float* out);
void rows8_q2_k(const BlockQ2Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out);
void rows8_q3_k(const BlockQ3Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out);
void rows8_q8_0(const BlockQ8_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out);
void rows8_nvfp4(const BlockNvfp4x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                 float* out);
void rows8_q2_0(const BlockQ2_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out);
void rows8_tq2_0(const BlockTq2_0x8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                 float* out);
void rows8_q1_0(const BlockQ1_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out);
void rows8_iq4_xs(const BlockIq4Xsx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                  float* out);
void rows8_q5_k(const BlockQ5Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out);
void rows8_q6_k(const BlockQ6Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out);
// Q4_0, Q5_0 and IQ4_NL against Q8_0 activations, Q4_1 and Q5_1 against Q8_1 ones: wtype says
// which (group and ys of its block types).
void rows8_b32(uint32_t wtype, const void* group, int64_t cols, const void* const* ys, int n_tok,
               float* out);
}  // namespace avx2

namespace avx512 {  // AVX-512 VNNI (256-bit registers; Q1_0's 512); the other types run AVX2's
void rows8_nvfp4(const BlockNvfp4x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                 float* out);
void rows8_q2_0(const BlockQ2_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out);
void rows8_tq2_0(const BlockTq2_0x8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                 float* out);
void rows8_q1_0(const BlockQ1_0x8* group, int64_t cols, const BlockQ8_0* const* ys, int n_tok,
                float* out);
void rows8_iq4_xs(const BlockIq4Xsx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                  float* out);
void rows8_q2_k(const BlockQ2Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out);
void rows8_q3_k(const BlockQ3Kx8* group, int64_t cols, const BlockQ8K* const* ys, int n_tok,
                float* out);
// The legacy 32-element blocks and IQ4_NL: wtype says which, as avx2::rows8_b32.
void rows8_b32(uint32_t wtype, const void* group, int64_t cols, const void* const* ys, int n_tok,
               float* out);
}  // namespace avx512

}  // namespace kernels
