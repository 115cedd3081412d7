#include "kernels/kernels.h"

#include <cpuid.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/attend.h"
#include "kernels/fp16.h"
#include "kernels/isa.h"
#include "kernels/rows8.h"

namespace kernels {

// F16C from CPUID (leaf 1, ECX bit 29): clang before 16 does not know "f16c" in
// __builtin_cpu_supports.
static bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

bool halves_512() {
  static const bool h = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u /* "Auth"enticAMD */) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const unsigned base = a >> 8 & 0xF;
    return base + (base == 0xF ? (a >> 20 & 0xFF) : 0) == 0x19;
  }();
  return h;
}

bool gathers_slow() {
  static const bool slow = [] {
    if (const char* e = std::getenv("EXPERTD_GATHER")) return std::strcmp(e, "0") == 0;
    char buf[64] = {};
    if (FILE* f = std::fopen("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling", "r")) {
      const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
      std::fclose(f);
      buf[n] = 0;
    }
    return std::strncmp(buf, "Mitigation", 10) == 0;
  }();
  return slow;
}

bool gathers_by_loads() {
  static const bool loads = [] {
    if (const char* e = std::getenv("EXPERTD_GATHER")) return std::strcmp(e, "loads") == 0;
    return halves_512();
  }();
  return loads;
}

Isa best_isa() {
  static const Isa b = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("bmi2");
    Isa best = avx512 ? Isa::Avx512 : avx2 ? Isa::Avx2 : Isa::Scalar;
    if (const char* f = std::getenv("EXPERTD_KERNELS")) {  // only ever lowers the choice
      if (std::strcmp(f, "scalar") == 0)
        best = Isa::Scalar;
      else if (std::strcmp(f, "avx2") == 0 && best == Isa::Avx512)
        best = Isa::Avx2;
    }
    return best;
  }();
  return b;
}

const char* isa_name(Isa b) {
  switch (b) {
    case Isa::Avx512:
      return "avx512-vnni";
    case Isa::Avx2:
      return "avx2";
    default:
      return "scalar";
  }
}

bool weight_type_supported(uint32_t t) {
  const TypeTraits* tr = type_traits(t);
  return tr && tr->dot[0];
}

uint32_t vec_dot_type(uint32_t w) {
  return type_traits(w)->vec_dot_type;
}

size_t row_size(uint32_t t, int64_t n) {
  const TypeTraits* tr = type_traits(t);
  return tr ? static_cast<size_t>(n / tr->block_elems * tr->block_bytes) : 0;
}

void dequantize_row(uint32_t type, const void* src, float* y, int64_t n) {
  const TypeTraits* tr = type_traits(type);
  assert(tr && tr->dequantize);
  tr->dequantize(src, y, n);
}

// The table's function for this backend, or the next lower backend's.
template <class Fn>
static Fn pick(const Fn (&per_backend)[kIsas], Isa be) {
  for (int b = static_cast<int>(be); b >= 0; --b)
    if (per_backend[b]) return per_backend[b];
  return nullptr;
}

void quantize_activations(uint32_t wtype, const float* x, void* dst, int64_t n, Isa be) {
  const TypeTraits* tr = type_traits(vec_dot_type(wtype));
  assert(tr && tr->quantize[0]);
  pick(tr->quantize, be)(x, dst, n);
}

// How far ahead a matrix-vector product's rows are prefetched: ~18 KiB, where the product
// streams (on an Intel Xeon with 2 threads, --local decode with the rows' dots: Q4_K 1.12x, Q2_K
// 1.08x, MXFP4 experts 1.06x against the 2 KiB first tuned on an AMD EPYC; 32 KiB less), 2 KiB
// for the types that decode a grid per 8 weights, bound by that work rather than by memory
// (IQ2_XXS: 0.98x at 18 KiB; the other grid types assumed alike). Into L2, as the interleaved
// bodies' (rows8_body.h): --no-interleave decode of Q4_K 1.02-1.09x, Q6_K 1.09-1.14x against L1,
// F16 1.15x in expert-bench gemv; the grid types the same within the noise. 0: the row's dot
// prefetches for itself, a line a step (x86.h's prefetch_ahead), which the burst of a whole row
// here would only slow.
static size_t prefetch_bytes(uint32_t wtype) {
  switch (wtype) {
    case IQ1_S:
    case IQ1_M:
    case IQ2_XXS:
    case IQ2_XS:
    case IQ2_S:
    case IQ3_XXS:
    case IQ3_S:
      return 2048;
    case F16:
    case BF16:
    case NVFP4:
    case TQ2_0:
      return 0;
    default:
      return 18432;
  }
}

static DotFn dot_fn(const TypeTraits& tr, Isa be) {
  return pick(tr.dot, be);
}

float dot(uint32_t wtype, const void* w, const void* x, int64_t n, Isa be) {
  return dot_fn(*type_traits(wtype), be)(w, x, n);
}

namespace {
// One weight row against n_tok activation rows with the functions the table gives this backend.
// The tile is the one of the instruction set the dot comes from (a backend without a dot of its
// own runs the next lower one's dot and tile), so a tile's tokens get exactly the dot's results.
struct TileOp {
  TileFn tile = nullptr;
  DotFn dot;
  TileOp(const TypeTraits& tr, Isa be) : dot(dot_fn(tr, be)) {
    for (int b = static_cast<int>(be); b >= 0; --b)
      if (tr.dot[b]) {
        tile = tr.tile[b];
        break;
      }
  }
  void operator()(const void* w, const void* const* xs, int n_tok, int64_t n, float* out) const {
    if (tile) return tile(w, xs, n_tok, n, out);
    for (int t = 0; t < n_tok; ++t) out[t] = dot(w, xs[t], n);
  }
};
}  // namespace

void dot_tile(uint32_t wtype, const void* w, const void* const* xs, int n_tok, int64_t n,
              float* out, Isa be) {
  TileOp(*type_traits(wtype), be)(w, xs, n_tok, n, out);
}

Scratch::~Scratch() {
  std::free(data);
}

uint8_t* Scratch::get(size_t n) {
  if (n > bytes) {
    std::free(data);
    data = static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64));
    bytes = n;
  }
  return data;
}

void matmul(uint32_t wtype, const void* w, int64_t rows, int64_t cols, const float* x,
            int64_t n_tokens, float* y, Scratch& scratch, ThreadPool* pool, Isa be,
            const void* w8) {
  const size_t xq_row = row_size(vec_dot_type(wtype), cols);
  uint8_t* xq = scratch.get(xq_row * n_tokens);
  for (int64_t t = 0; t < n_tokens; ++t)
    quantize_activations(wtype, x + t * cols, xq + t * xq_row, cols, be);
  const MatmulJob job{wtype, w, rows, cols, xq, xq_row, nullptr, n_tokens, y, w8};
  matmul_batch(&job, 1, pool, be);
}

// From this many tokens on, a job of a type with a matrix-matrix body runs it (one thread, 768 x
// 2048 weights, the panel's time against the tiles'). On the AVX-512 Xeon of the issue, unpacking
// a weight row and its 16-token panel cost about what 2 tokens (the 32-element block types, whose
// tiles pay a block scale per token) or 5 tokens (the super-block types) cost in tiles. On AMD's
// Zen 4 (halves_512) the AVX-512 panels pass the tiles at 5 tokens (1.08x MXFP4, 0.94x Q8_0) and
// 6 (0.97-1.19x the super-block types). AVX2's panels of 8 tokens (no vpdpbusd; AMD EPYC):
// MXFP4 at 4 tokens (2.0x at 8), Q8_0 between 4 and 8 (0.65x, 1.3x), the super-block types at
// 6-7 (1.2-1.3x at 8, 1.5-1.9x at 32), Q3_K (its scales unpack slowly) at 12-16 (0.98x at 8,
// 1.27x at 16).
static int64_t gemm_min_tokens(uint32_t wtype, Isa be) {
  // F16 and BF16's panels widen a weight once for 2-4 tokens where each token's dot widens it
  // again, and each activation once per matrix instead of once per row (not timed at 2 tokens).
  if (wtype == F16 || wtype == BF16) return 2;
  const bool b32 = wtype == Q8_0 || wtype == MXFP4;
  if (be == Isa::Avx2) return wtype == MXFP4 ? 4 : wtype == Q8_0 ? 6 : wtype == Q3_K ? 16 : 7;
  if (halves_512()) return b32 ? 5 : 6;
  return b32 ? 2 : 5;
}

// An instruction set's matrix-matrix body (kernels/gemm_*.cpp).
struct Gemm {
  bool (*supported)(uint32_t);
  size_t (*act_bytes)(uint32_t, int64_t, int64_t);
  void (*lay_out)(uint32_t, const uint8_t*, size_t, const int32_t*, int64_t, int64_t, uint8_t*);
  void (*rows)(uint32_t, const void*, int64_t, int64_t, int64_t, int64_t, const uint8_t*, int64_t,
               float*);
};
const Gemm kGemmAvx2{avx2::gemm_supported, avx2::gemm_act_bytes, avx2::gemm_lay_out,
                     avx2::gemm_rows};
const Gemm kGemmAvx512{avx512::gemm_supported, avx512::gemm_act_bytes, avx512::gemm_lay_out,
                       avx512::gemm_rows};

// Rows r0 .. r1 of an interleaved job: the groups of eight that start there (a group is its first
// row's: one that starts before r1 is computed whole).
static void rows8_job(const MatmulJob& m, int64_t r0, int64_t r1, Isa be) {
  const void* xs[kMaxTile];
  float out[kMaxTile * 8];
  for (int64_t r = (r0 + 7) / 8 * 8; r < r1; r += 8) {
    for (int64_t t = 0; t < m.n_tokens; t += kMaxTile) {
      const int nt = static_cast<int>(std::min<int64_t>(kMaxTile, m.n_tokens - t));
      for (int i = 0; i < nt; ++i) xs[i] = m.xq + (m.tok ? m.tok[t + i] : t + i) * m.xq_row;
      rows8_group(m.wtype, m.w8, m.cols, r / 8, xs, nt, out, be);
      for (int i = 0; i < nt; ++i)
        std::memcpy(m.y + (t + i) * m.rows + r, out + 8 * i, 8 * sizeof(float));
    }
  }
}

// Rows r0 .. r1 of a job with only its interleaved layout, through the matrix-matrix panels:
// eight groups at a time unpacked into rows (in L2) and run there; the groups that start in the
// range, as rows8_job's.
static void rows8_panels(const MatmulJob& m, const Gemm* gemm, int64_t r0, int64_t r1,
                         const uint8_t* panel) {
  thread_local std::vector<uint8_t> rows;
  const size_t row = row_size(m.wtype, m.cols), group = rows8_bytes(m.wtype, 8, m.cols);
  rows.resize(64 * row);
  for (int64_t g = (r0 + 7) / 8; g < (r1 + 7) / 8; g += 8) {
    const int64_t n = std::min<int64_t>(8, (r1 + 7) / 8 - g);
    rows8_unpack_groups(m.wtype, static_cast<const uint8_t*>(m.w8) + size_t(g) * group, m.cols,
                        rows.data(), 0, n);
    gemm->rows(m.wtype, rows.data(), m.rows, m.cols, 0, 8 * n, panel, m.n_tokens, m.y + 8 * g);
  }
}

void matmul_batch(const MatmulJob* jobs, size_t n_jobs, ThreadPool* pool, Isa be) {
  // Rows of all jobs laid end to end; a chunk of the loop may span jobs.
  std::vector<int64_t> first(n_jobs + 1, 0);
  int64_t work = 0;
  for (size_t j = 0; j < n_jobs; ++j) {
    first[j + 1] = first[j] + jobs[j].rows;
    work += jobs[j].rows * jobs[j].cols * jobs[j].n_tokens;
  }
  // Many tokens against a type with a matrix-matrix body (AVX-512): the activations laid out once
  // per job, then panels of weight rows x tokens (gemm_avx512.cpp, gemm_avx2.cpp), bit for bit the
  // tiles'.
  thread_local std::vector<uint8_t> panels;
  std::vector<size_t> panel_at(n_jobs, SIZE_MAX);
  size_t panel_bytes = 0;
  const Gemm* gemm = be == Isa::Avx512 ? &kGemmAvx512 : be == Isa::Avx2 ? &kGemmAvx2 : nullptr;
  for (size_t j = 0; j < n_jobs; ++j)
    if (gemm && jobs[j].n_tokens >= gemm_min_tokens(jobs[j].wtype, be) &&
        gemm->supported(jobs[j].wtype) && jobs[j].cols % 256 == 0) {
      panel_at[j] = panel_bytes;
      panel_bytes += gemm->act_bytes(jobs[j].wtype, jobs[j].cols, jobs[j].n_tokens);
    }
  if (panel_bytes > panels.size()) panels.resize(panel_bytes);
  // Jobs with only the interleaved layout on the scalar reference: their rows unpacked first (the
  // panels unpack theirs a few groups at a time, rows8_panels).
  thread_local std::vector<MatmulJob> own;
  thread_local std::vector<uint8_t> unpacked;
  std::vector<std::pair<size_t, size_t>> unpack;  // (job, offset in `unpacked`)
  size_t unpack_bytes = 0;
  for (size_t j = 0; j < n_jobs; ++j)
    if (!jobs[j].w && be == Isa::Scalar) {
      unpack.push_back({j, unpack_bytes});
      unpack_bytes += size_t(jobs[j].rows) * row_size(jobs[j].wtype, jobs[j].cols);
    }
  if (!unpack.empty()) {
    own.assign(jobs, jobs + n_jobs);
    if (unpack_bytes > unpacked.size()) unpacked.resize(unpack_bytes);
    std::vector<int64_t> groups_first(unpack.size() + 1, 0);
    for (size_t u = 0; u < unpack.size(); ++u) {
      MatmulJob& m = own[unpack[u].first];
      assert(m.w8 && m.rows % 8 == 0);
      m.w = unpacked.data() + unpack[u].second;
      groups_first[u + 1] = groups_first[u] + m.rows / 8;
    }
    // The pool's threads see their own thread_locals: the loop reads this thread's by pointer.
    const MatmulJob* own_jobs = own.data();
    auto groups = [&](int64_t b, int64_t e) {
      for (size_t u = 0; u < unpack.size(); ++u) {
        const int64_t g0 = std::max(b, groups_first[u]), g1 = std::min(e, groups_first[u + 1]);
        if (g0 >= g1) continue;
        const MatmulJob& m = own_jobs[unpack[u].first];
        rows8_unpack_groups(m.wtype, m.w8, m.cols, const_cast<void*>(m.w), g0 - groups_first[u],
                            g1 - groups_first[u]);
      }
    };
    if (pool)
      pool->parallel_for(groups_first.back(), 8, groups);
    else
      groups(0, groups_first.back());
    jobs = own.data();
  }
  for (size_t j = 0; j < n_jobs; ++j)
    if (panel_at[j] != SIZE_MAX)
      gemm->lay_out(jobs[j].wtype, jobs[j].xq, jobs[j].xq_row, jobs[j].tok, jobs[j].n_tokens,
                    jobs[j].cols, panels.data() + panel_at[j]);
  const uint8_t* panel_base = panels.data();
  // Otherwise blocked like a GEMM: a block of weight rows (kept in L2) against a block of tokens
  // (kept in L1), in tiles of one row x up to kMaxTile tokens whose row blocks are unpacked once
  // per tile. Every (row, token) value is computed the same way whatever the blocking.
  constexpr int64_t kRowBlock = 64, kTokenBlock = 2 * kMaxTile;
  auto body = [&](int64_t b, int64_t e) {
    size_t j = std::upper_bound(first.begin(), first.end(), b) - first.begin() - 1;
    const void* xs[kMaxTile];
    float out[kMaxTile];
    for (int64_t g = b; g < e; g = std::min(e, first[j + 1]), ++j) {
      while (g >= first[j + 1]) ++j;
      const MatmulJob& m = jobs[j];
      const int64_t r_end = std::min(e, first[j + 1]) - first[j];
      if (panel_at[j] != SIZE_MAX && !m.w) {
        rows8_panels(m, gemm, g - first[j], r_end, panel_base + panel_at[j]);
        continue;
      }
      if (panel_at[j] != SIZE_MAX) {
        gemm->rows(m.wtype, m.w, m.rows, m.cols, g - first[j], r_end, panel_base + panel_at[j],
                   m.n_tokens, m.y);
        continue;
      }
      if (m.w8 && be != Isa::Scalar) {
        rows8_job(m, g - first[j], r_end, be);
        continue;
      }
      const size_t w_row = row_size(m.wtype, m.cols);
      const int64_t ahead = int64_t((prefetch_bytes(m.wtype) + w_row - 1) / w_row);
      const TileOp op(*type_traits(m.wtype), be);  // once per job, not per row
      for (int64_t rb = g - first[j]; rb < r_end; rb += kRowBlock)
        for (int64_t tb = 0; tb < m.n_tokens; tb += kTokenBlock)
          for (int64_t r = rb; r < std::min(rb + kRowBlock, r_end); ++r) {
            const uint8_t* wr = static_cast<const uint8_t*>(m.w) + r * w_row;
            // The weights ahead (prefetch_bytes): the hardware's prefetcher alone leaves a
            // decode step's matrix-vector products at ~2/3 of the memory's bandwidth.
            if (tb == 0 && ahead > 0 && r + ahead < r_end)
              for (size_t o = 0; o < w_row; o += 64)
                _mm_prefetch(wr + ahead * w_row + o, _MM_HINT_T1);
            for (int64_t t = tb; t < std::min(tb + kTokenBlock, m.n_tokens); t += kMaxTile) {
              const int nt = static_cast<int>(std::min<int64_t>(kMaxTile, m.n_tokens - t));
              for (int i = 0; i < nt; ++i) xs[i] = m.xq + (m.tok ? m.tok[t + i] : t + i) * m.xq_row;
              op(wr, xs, nt, m.cols, out);
              for (int i = 0; i < nt; ++i) m.y[(t + i) * m.rows + r] = out[i];
            }
          }
    }
  };
  if (pool && work >= (1 << 16))
    pool->parallel_for(first[n_jobs], 16, body);
  else
    body(0, first[n_jobs]);
}

// Float ops: the AVX-512 build has no bodies of its own for these; it runs AVX2's.
float dot_f32(const float* a, const float* b, int64_t n, Isa be) {
  return be == Isa::Scalar ? ref::dot_f32(a, b, n) : avx2::dot_f32(a, b, n);
}

float dot_f32_ggml(const float* a, const float* b, int64_t n, Isa be) {
  return be == Isa::Scalar ? ref::dot_f32(a, b, n) : avx2::dot_f32_ggml(a, b, n);
}

void axpy_ggml(float a, const float* x, float* y, int64_t n, Isa be) {
  be == Isa::Scalar ? ref::axpy(a, x, y, n) : avx2::axpy_ggml(a, x, y, n);
}

void axpy(float a, const float* x, float* y, int64_t n, Isa be) {
  be == Isa::Scalar ? ref::axpy(a, x, y, n) : avx2::axpy(a, x, y, n);
}

// Attention: attend.h's loops over the instruction set's dot and values pass (one query is a
// group of one).
template <typename Elem>
void attend_any(const float* q, int64_t q_stride, int G, const Elem* k, const Elem* v,
                int64_t n_keys, int64_t k_stride, int64_t v_stride, int64_t dk, int64_t dv,
                float scale, const float* sinks, float* s, float* out, int64_t out_stride, Isa be) {
  if constexpr (std::is_same_v<Elem, float>) {
    (be == Isa::Scalar ? attend_group_with<float, ref::dots_f32, ref::wsum_f32, ref::softmax_scores>
                       : attend_group_with<float, avx2::dots_f32, avx2::wsum_f32,
                                           avx2::softmax_scores>)(q, q_stride, G, k, v, n_keys,
                                                                  k_stride, v_stride, dk, dv, scale,
                                                                  sinks, s, out, out_stride);
  } else {
    (be == Isa::Scalar
         ? attend_group_with<uint16_t, ref::dots_f16, ref::wsum_f16, ref::softmax_scores>
         : attend_group_with<uint16_t, avx2::dots_f16, avx2::wsum_f16,
                             avx2::softmax_scores>)(q, q_stride, G, k, v, n_keys, k_stride,
                                                    v_stride, dk, dv, scale, sinks, s, out,
                                                    out_stride);
  }
}

void attend(const float* q, const float* k, const float* v, int64_t n_keys, int64_t k_stride,
            int64_t v_stride, int64_t dk, int64_t dv, float scale, float sink, float* s, float* out,
            Isa be) {
  attend_any(q, 0, 1, k, v, n_keys, k_stride, v_stride, dk, dv, scale,
             sink == -INFINITY ? nullptr : &sink, s, out, 0, be);
}

void attend_f16(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_keys,
                int64_t k_stride, int64_t v_stride, int64_t dk, int64_t dv, float scale, float sink,
                float* s, float* out, Isa be) {
  attend_any(q, 0, 1, k, v, n_keys, k_stride, v_stride, dk, dv, scale,
             sink == -INFINITY ? nullptr : &sink, s, out, 0, be);
}

void attend_group(const float* q, int64_t q_stride, int G, const float* k, const float* v,
                  int64_t n_keys, int64_t k_stride, int64_t v_stride, int64_t dk, int64_t dv,
                  float scale, const float* sinks, float* s, float* out, int64_t out_stride,
                  Isa be) {
  attend_any(q, q_stride, G, k, v, n_keys, k_stride, v_stride, dk, dv, scale, sinks, s, out,
             out_stride, be);
}

void attend_group_f16(const float* q, int64_t q_stride, int G, const uint16_t* k, const uint16_t* v,
                      int64_t n_keys, int64_t k_stride, int64_t v_stride, int64_t dk, int64_t dv,
                      float scale, const float* sinks, float* s, float* out, int64_t out_stride,
                      Isa be) {
  attend_any(q, q_stride, G, k, v, n_keys, k_stride, v_stride, dk, dv, scale, sinks, s, out,
             out_stride, be);
}

void attention_softmax(float* s, int64_t n, float sink, Isa be) {
  be == Isa::Scalar ? ref::softmax_scores(s, n, sink) : avx2::softmax_scores(s, n, sink);
}

void swiglu(const float* g, const float* u, float* out, int64_t n, Isa be) {
  be == Isa::Scalar ? ref::swiglu(g, u, out, n) : avx2::swiglu(g, u, out, n);
}

void to_f16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void from_f16(const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(x[i]);
}

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0;  // ggml accumulates in ggml_float (double)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * (w ? w[i] : 1.0f);
}

Yarn yarn_params(float factor, int64_t n_rot, float base, int64_t n_ctx_orig, float beta_fast,
                 float beta_slow) {
  Yarn y;
  y.freq_scale = 1.0f / factor;
  y.ext_factor = 1.0f;
  auto corr_dim = [&](float beta) {
    return float(n_rot) * std::log(float(n_ctx_orig) / (beta * 2.0f * float(M_PI))) /
           (2.0f * std::log(base));
  };
  y.corr_low = std::max(0.0f, std::floor(corr_dim(beta_fast)));
  y.corr_high = std::min(float(n_rot - 1), std::ceil(corr_dim(beta_slow)));
  y.mscale = 1.0f + 0.1f * std::log(1.0f / y.freq_scale);
  return y;
}

void rope(float* x, int64_t head_dim, int64_t n_rot, int64_t pos, float base, bool neox,
          const Yarn* yarn, bool inverse, const float* freq_factors) {
  (void)head_dim;
  const float theta_scale = std::pow(base, -2.0f / static_cast<float>(n_rot));
  float theta_base = static_cast<float>(pos);
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const float theta_extrap = freq_factors ? theta_base / freq_factors[i] : theta_base;
    float theta = theta_extrap, ms = 1.0f;
    if (yarn) {
      const float interp = yarn->freq_scale * theta_extrap;
      const float y =
          (float(i) - yarn->corr_low) / std::max(0.001f, yarn->corr_high - yarn->corr_low);
      const float ramp = (1.0f - std::min(1.0f, std::max(0.0f, y))) * yarn->ext_factor;
      theta = interp * (1.0f - ramp) + theta_extrap * ramp;
      ms = yarn->mscale;
    }
    const float c = std::cos(theta) * ms, s = (inverse ? -std::sin(theta) : std::sin(theta)) * ms;
    int64_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
    const float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
    theta_base *= theta_scale;
  }
}

void softmax(float* x, int64_t n) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float silu(float x) {
  return x / (1.0f + std::exp(-x));
}

}  // namespace kernels
