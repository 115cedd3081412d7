// expert-bench kernels: the CPU dot products of every weight type, timed against llama.cpp's own
// (ggml-cpu's vec_dot, from a libggml-cpu.so loaded at run time: llama.cpp is the baseline only,
// never linked) on the same random blocks and the same quantized activations, alternating, best
// of many rounds, rows that fit in L2 (the kernels' speed, not memory's). Prints each type's
// time per weight, the ratio (llama.cpp's time / ours: >= 1 is as fast) and the largest
// relative difference of the results (llama.cpp's rounding is the reference for how close).
// expert-bench attention: the CPU backend's attention, per query head against grouped (below).
#include "bench/kernels_bench.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/random_blocks.h"

namespace {
// ggml-cpu.h's struct ggml_type_traits_cpu.
using VecDot = void (*)(int, float*, size_t, const void*, size_t, const void*, size_t, int);
struct GgmlTraits {
  void (*from_float)(const float*, void*, int64_t);
  VecDot vec_dot;
  int vec_dot_type;
  int64_t nrows;
};
}  // namespace

CLI::App* add_kernels_command(CLI::App& app, KernelsArgs& a) {
  auto* kern = app.add_subcommand(
      "kernels",
      "every weight type's CPU dot product against llama.cpp's (--ggml-cpu); ratio = median of "
      "llama.cpp's time / ours");
  kern->add_option("--ggml-cpu", a.ggml_lib,
                   "llama.cpp's libggml-cpu.so (llama-cpp-python ships one in llama_cpp/lib); "
                   "without it, ours alone");
  kern->add_option("--types", a.types, "weight types (default: all)")->delimiter(',');
  kern->add_option("--row", a.row, "elements per row")->capture_default_str();
  kern->add_option("--rounds", a.rounds, "timed rounds (best of)")->capture_default_str();
  return kern;
}

int bench_kernels(const KernelsArgs& args) {
  const std::string& lib = args.ggml_lib;
  std::vector<std::string> types = args.types;
  const int64_t n = args.row;
  const int rounds = args.rounds;
  using Clock = std::chrono::steady_clock;
  const GgmlTraits* (*traits)(int) = nullptr;
  if (!lib.empty()) {
    void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::fprintf(stderr, "expert-bench: cannot load %s: %s\n", lib.c_str(), dlerror());
      return 1;
    }
    traits = reinterpret_cast<const GgmlTraits* (*)(int)>(dlsym(h, "ggml_get_type_traits_cpu"));
    auto init = reinterpret_cast<void (*)()>(dlsym(h, "ggml_cpu_init"));
    if (!traits || !init) {
      std::fprintf(stderr, "expert-bench: %s has no ggml_get_type_traits_cpu\n", lib.c_str());
      return 1;
    }
    init();
  }
  if (types.empty())
    for (uint32_t t = 0; t < 64; ++t)
      if (kernels::weight_type_supported(t)) types.push_back(kernels::type_traits(t)->name);
  std::printf("kernels %s, rows of %lld, %d rounds%s\n", kernels::isa_name(kernels::best_isa()),
              (long long)n, rounds, traits ? ", against llama.cpp's vec_dot" : "");
  std::vector<double> ratios;
  for (const std::string& name : types) {
    const kernels::TypeTraits* t = kernels::type_by_name(name);
    if (!t || !kernels::weight_type_supported(t->id) || n % t->block_elems) {
      std::fprintf(stderr,
                   "expert-bench: %s is not a weight type the kernels run on rows of %lld\n",
                   name.c_str(), (long long)n);
      return 1;
    }
    const size_t rb = kernels::row_size(t->id, n);
    const int64_t rows = std::max<int64_t>(16, (256 << 10) / int64_t(rb));  // ~256 KiB
    std::vector<uint8_t> w(rb * rows);
    uint64_t rng = 5;
    kernels::random_blocks(t->id, w.data(), w.size(), 0.05f, rng);
    std::vector<float> x(n);
    for (float& v : x) v = kernels::detail::gauss(rng);
    std::vector<uint8_t> xq(kernels::row_size(kernels::vec_dot_type(t->id), n));
    kernels::quantize_activations(t->id, x.data(), xq.data(), n);
    const GgmlTraits* g = traits ? traits(int(t->id)) : nullptr;
    if (g && (!g->vec_dot || uint32_t(g->vec_dot_type) != kernels::vec_dot_type(t->id)))
      g = nullptr;
    double ours = 1e30, theirs = 1e30, max_rel = 0;
    volatile float sink = 0;
    for (int r = 0; r < rounds; ++r) {
      auto t0 = Clock::now();
      for (int64_t i = 0; i < rows; ++i)
        sink = sink + kernels::dot(t->id, w.data() + i * rb, xq.data(), n);
      auto t1 = Clock::now();
      ours = std::min(ours, std::chrono::duration<double>(t1 - t0).count());
      if (!g) continue;
      for (int64_t i = 0; i < rows; ++i) {
        float v;
        g->vec_dot(int(n), &v, 0, w.data() + i * rb, 0, xq.data(), 0, 1);
        sink = sink + v;
      }
      theirs = std::min(theirs, std::chrono::duration<double>(Clock::now() - t1).count());
    }
    if (g)
      for (int64_t i = 0; i < rows; ++i) {
        float v;
        g->vec_dot(int(n), &v, 0, w.data() + i * rb, 0, xq.data(), 0, 1);
        const float o = kernels::dot(t->id, w.data() + i * rb, xq.data(), n);
        max_rel = std::max(max_rel, double(std::fabs(v - o)) / (std::fabs(v) + 1e-3));
      }
    const double per = 1e9 / double(n * rows);
    if (g) {
      ratios.push_back(theirs / ours);
      std::printf("%-8s ours %.3f ns/weight  llama.cpp %.3f  ratio %.2f  max rel diff %.1e\n",
                  t->name, ours * per, theirs * per, theirs / ours, max_rel);
    } else {
      std::printf("%-8s ours %.3f ns/weight%s\n", t->name, ours * per,
                  traits ? "  (llama.cpp has no vec_dot for it)" : "");
    }
  }
  if (!ratios.empty()) {
    std::sort(ratios.begin(), ratios.end());
    std::printf("ratio=%.3f\n", ratios[ratios.size() / 2]);  // the median type
  }
  return 0;
}

// expert-bench attention: one prompt chunk's attention over a long cache, as the CPU backend runs
// it, one thread: each query head alone (attend: the KV head's rows streamed once per query
// head) against the heads that share a KV head together (attend_group: once per group), the same
// results bit for bit (checked). Alternating rounds, medians; ratio = per head / grouped.
CLI::App* add_attention_command(CLI::App& app, AttentionArgs& a) {
  auto* att = app.add_subcommand(
      "attention",
      "a prompt chunk's attention over a long cache, each query head alone vs the heads of a KV "
      "head together (same bits); ratio = per head / grouped");
  att->add_option("--keys", a.keys, "cache positions")->capture_default_str();
  att->add_option("--heads", a.heads, "query heads")->capture_default_str();
  att->add_option("--kv-heads", a.kv_heads, "KV heads")->capture_default_str();
  att->add_option("--dim", a.dim, "head dimension")->capture_default_str();
  att->add_option("--tokens", a.tokens, "query tokens")->capture_default_str();
  att->add_option("--kv-type", a.kv_type, "f16 or f32")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->capture_default_str();
  att->add_option("--rounds", a.rounds, "alternating rounds")->capture_default_str();
  return att;
}

int bench_attention(const AttentionArgs& args) {
  if (args.kv_heads <= 0 || args.heads % args.kv_heads != 0 || args.tokens < 1 ||
      args.keys < args.tokens) {
    std::fprintf(stderr,
                 "expert-bench: heads must be a multiple of kv-heads, and keys >= tokens >= 1\n");
    return 2;
  }
  const int64_t n_keys = args.keys, dim = args.dim;
  const int heads = args.heads, kv_heads = args.kv_heads, tokens = args.tokens,
            rounds = args.rounds;
  const bool f16 = args.kv_type == "f16";
  using Clock = std::chrono::steady_clock;
  const int64_t KV = int64_t(kv_heads) * dim, group = heads / kv_heads;
  uint64_t rng = 9;
  std::vector<float> q(size_t(tokens) * heads * dim), kv(size_t(n_keys) * KV * 2);
  for (float& x : q) x = kernels::detail::gauss(rng);
  for (float& x : kv) x = kernels::detail::gauss(rng);
  std::vector<uint16_t> kv16(kv.size());
  kernels::to_f16(kv.data(), kv16.data(), int64_t(kv.size()));
  const float* k = kv.data();
  const float* v = kv.data() + n_keys * KV;
  const uint16_t* k16 = kv16.data();
  const uint16_t* v16 = kv16.data() + n_keys * KV;
  std::vector<float> s(size_t(group * n_keys)), a(q.size()), b(q.size());
  const float scale = 1.0f / std::sqrt(float(dim));
  auto per_head = [&](float* out) {
    for (int t = 0; t < tokens; ++t)
      for (int h = 0; h < heads; ++h) {
        const int64_t at = (h / group) * dim, n = n_keys - tokens + t + 1;
        const float* qh = q.data() + (int64_t(t) * heads + h) * dim;
        float* o = out + (int64_t(t) * heads + h) * dim;
        if (f16)
          kernels::attend_f16(qh, k16 + at, v16 + at, n, KV, KV, dim, dim, scale, -INFINITY,
                              s.data(), o);
        else
          kernels::attend(qh, k + at, v + at, n, KV, KV, dim, dim, scale, -INFINITY, s.data(), o);
      }
  };
  auto grouped = [&](float* out) {
    for (int t = 0; t < tokens; ++t)
      for (int kh = 0; kh < kv_heads; ++kh) {
        const int64_t at = kh * dim, n = n_keys - tokens + t + 1, h0 = kh * group;
        const float* qh = q.data() + (int64_t(t) * heads + h0) * dim;
        float* o = out + (int64_t(t) * heads + h0) * dim;
        if (f16)
          kernels::attend_group_f16(qh, dim, int(group), k16 + at, v16 + at, n, KV, KV, dim, dim,
                                    scale, nullptr, s.data(), o, dim);
        else
          kernels::attend_group(qh, dim, int(group), k + at, v + at, n, KV, KV, dim, dim, scale,
                                nullptr, s.data(), o, dim);
      }
  };
  std::vector<double> ta, tb;
  for (int r = 0; r < rounds; ++r) {
    for (int side = 0; side < 2; ++side) {  // the order alternates each round
      const bool first = (side == 0) == (r % 2 == 0);
      const auto t0 = Clock::now();
      first ? per_head(a.data()) : grouped(b.data());
      (first ? ta : tb).push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  if (std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
    std::fprintf(stderr, "expert-bench: grouped attention differs from per-head attention\n");
    return 1;
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  const double ma = ta[ta.size() / 2], mb = tb[tb.size() / 2];
  const double cache_gb = double(n_keys * KV * 2) * (f16 ? 2 : 4) / 1e9;
  std::printf(
      "attention %s, %s cache: %d tokens over %lld keys, %d heads / %d KV heads of %lld, "
      "%d rounds, one thread\n",
      kernels::isa_name(kernels::best_isa()), f16 ? "f16" : "f32", tokens, (long long)n_keys, heads,
      kv_heads, (long long)dim, rounds);
  std::printf("per head %.1f ms (%.1f GB/s of cache), grouped %.1f ms (%.1f GB/s): same bits\n",
              ma * 1e3, cache_gb * heads * tokens / ma, mb * 1e3,
              cache_gb * kv_heads * tokens / mb);
  std::printf("ratio=%.3f\n", ma / mb);
  return 0;
}

// expert-bench gemv: decode's matrix-vector product (one token against a weight matrix far larger
// than the caches, on the engine's thread pool) against a stream that reads the same bytes with the
// same threads (64-byte loads summed, nothing else): the GEMV's bytes/s over the machine's. 1.0
// is reading the weights as fast as memory gives them. For the types with interleaved rows
// (kernels/rows8.h) the interleaved copy is timed too. Alternating rounds, medians.
CLI::App* add_gemv_command(CLI::App& app, GemvArgs& a) {
  auto* g = app.add_subcommand(
      "gemv",
      "decode's matrix-vector product per weight type (and its interleaved rows, where the type "
      "has them) against a stream of the same bytes (bytes/s; ratio = GEMV / stream)");
  g->add_option("--types", a.types, "weight types")->delimiter(',')->capture_default_str();
  g->add_option("--mib", a.mib, "matrix size")->capture_default_str();
  g->add_option("--cols", a.cols,
                "the matrix's columns, a multiple of 256 (an expert's: 768 to 7168; rows of "
                "fewer columns pay the per-row costs more often)")
      ->capture_default_str();
  g->add_option("--threads", a.threads, "threads (default: all cores)");
  g->add_option("--rounds", a.rounds, "alternating rounds")->capture_default_str();
  return g;
}

int bench_gemv(const GemvArgs& a) {
  using Clock = std::chrono::steady_clock;
  const int threads = a.threads > 0 ? a.threads : int(std::thread::hardware_concurrency());
  kernels::ThreadPool pool(threads);
  const int64_t cols = a.cols;
  if (cols <= 0 || cols % 256) {
    std::fprintf(stderr, "expert-bench: --cols %lld is not a positive multiple of 256\n",
                 (long long)cols);
    return 1;
  }
  std::printf("gemv: %s kernels, %d threads, %lld MiB per matrix of %lld columns, %d rounds\n",
              kernels::isa_name(kernels::best_isa()), threads, (long long)a.mib, (long long)cols,
              a.rounds);
  std::vector<double> ratios;
  for (const std::string& name : a.types) {
    const kernels::TypeTraits* t = kernels::type_by_name(name);
    if (!t || !kernels::weight_type_supported(t->id)) {
      std::fprintf(stderr, "expert-bench: %s is not a weight type the kernels run\n", name.c_str());
      return 1;
    }
    const size_t rb = kernels::row_size(t->id, cols);
    const int64_t rows = int64_t((size_t(a.mib) << 20) / rb) / 8 * 8;  // whole groups of 8
    const size_t bytes = rb * size_t(rows);
    std::vector<uint8_t> w(bytes);
    uint64_t rng = 3;
    pool.parallel_for(rows, 256, [&](int64_t b, int64_t e) {  // random whole rows, paged in
      uint64_t r = rng + uint64_t(b);
      kernels::random_blocks(t->id, w.data() + size_t(b) * rb, size_t(e - b) * rb, 0.05f, r);
    });
    std::vector<float> x(cols), y(rows);
    for (float& v : x) v = kernels::detail::gauss(rng);
    std::vector<uint8_t> xq(kernels::row_size(kernels::vec_dot_type(t->id), cols));
    kernels::quantize_activations(t->id, x.data(), xq.data(), cols);
    const kernels::MatmulJob job{t->id,     w.data(), rows, cols,    xq.data(),
                                 xq.size(), nullptr,  1,    y.data()};
    // The same matrix interleaved eight rows at a time (kernels/rows8.h), where the type has it.
    const bool has8 = kernels::rows8_supported(t->id) && rows % 8 == 0;
    std::vector<uint8_t> w8(has8 ? kernels::rows8_bytes(t->id, rows, cols) : 0);
    if (has8) kernels::rows8_pack(t->id, w.data(), rows, cols, w8.data(), &pool);
    kernels::MatmulJob job8 = job;
    job8.w8 = has8 ? w8.data() : nullptr;
    std::vector<uint64_t> sums(size_t(threads) * 8);
    auto stream = [&] {
      pool.parallel_for(int64_t(bytes / 4096), 64, [&](int64_t b, int64_t e) {
        uint64_t s[8] = {};
        for (size_t i = size_t(b) * 512; i < size_t(e) * 512; i += 8)  // 64 bytes a step
          for (int k = 0; k < 8; ++k) {
            uint64_t v;
            std::memcpy(&v, w.data() + 8 * (i + k), 8);
            s[k] += v;
          }
        std::memcpy(&sums[size_t(b % threads) * 8], s, sizeof s);
      });
    };
    std::vector<double> g_s, s_s, g8_s;
    for (int r = 0; r < a.rounds + 1; ++r) {  // the first round warms up and is not counted
      auto t0 = Clock::now();
      kernels::matmul_batch(&job, 1, &pool);
      auto t1 = Clock::now();
      stream();
      auto t2 = Clock::now();
      if (has8) kernels::matmul_batch(&job8, 1, &pool);
      auto t3 = Clock::now();
      if (r == 0) continue;
      g_s.push_back(std::chrono::duration<double>(t1 - t0).count());
      s_s.push_back(std::chrono::duration<double>(t2 - t1).count());
      g8_s.push_back(std::chrono::duration<double>(t3 - t2).count());
    }
    auto median = [](std::vector<double>& v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    // GB/s of the row-major matrix's bytes (the interleaved copy is 2.8% larger for Q4_K).
    const double gb = double(bytes) / 1e9, gemv = gb / median(g_s), strm = gb / median(s_s);
    const double gemv8 = has8 ? gb / median(g8_s) : 0;
    ratios.push_back(std::max(gemv, gemv8) / strm);
    std::printf("%-8s %7.1f MB  gemv %5.2f GB/s  stream %5.2f GB/s  ratio %.2f", t->name,
                double(bytes) / 1e6, gemv, strm, gemv / strm);
    if (has8) std::printf("  interleaved %5.2f GB/s  ratio %.2f", gemv8, gemv8 / strm);
    std::printf("\n");
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("ratio=%.3f\n", ratios[ratios.size() / 2]);
  return 0;
}
