// expert-bench kernels: the CPU dot products of every weight type, timed against llama.cpp's own
// (ggml-cpu's vec_dot, from a libggml-cpu.so loaded at run time: llama.cpp is the baseline only,
// never linked) on the same random blocks and the same quantized activations, alternating, best
// of many rounds, rows that fit in L2 (the kernels' speed, not memory's). Prints each type's
// time per weight, the ratio (llama.cpp's time / ours: >= 1 is as fast) and the largest
// relative difference of the results (llama.cpp's rounding is the reference for how close).
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
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

int bench_kernels(const std::string& lib, std::vector<std::string> types, int64_t n, int rounds) {
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
