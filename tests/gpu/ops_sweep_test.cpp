// The per-op sweep: every op of engine/ops.h on the CPU backend and on the CUDA backend (the
// device where there is one, tests/cuda_emu's emulation otherwise) over the shape classes the
// architectures use, as llama.cpp's test-backend-ops does: the same inputs on both, each output
// compared by its normalised mean squared error, sum (gpu - cpu)^2 / sum cpu^2. A new op, or a new
// shape class of one, is a case here. Each case prints its error beside its bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "engine/cpu_ops.h"
#include "engine/cuda_engine.h"
#include "engine/delta_classes.h"
#include "engine/ops.h"
#include "gpu_util.h"
#include "kernels/random_blocks.h"
#include "kernels/types.h"

namespace {

using engine::Act;
using engine::KvRows;
using engine::Ops;
using engine::SeqRows;
using engine::Tensor;
using expertd::test::normal;

// Bounds: a float op differs by the order of its sums and the device's transcendental functions;
// a matmul of a quantized type by the CPU's quantized activations (the GPU multiplies float32
// ones): test-backend-ops' bound for matrix products.
constexpr double kFloatOp = 1e-7, kMatmul = 5e-4;

// The sweep's weights: host tensors of random valid blocks, in a Model of no layers that the CUDA
// backend uploads whole, as it uploads a model's.
class Weights {
 public:
  Tensor make(uint32_t type, int64_t in, int64_t out = 1, int64_t n = 1, float sd = 0.5f) {
    Tensor t;
    t.type = type;
    t.ne = {in, out, n};
    auto& b = bytes_.emplace_back(t.bytes());
    uint64_t seed = seed_++;
    kernels::random_blocks(type, b.data(), b.size(), sd, seed);
    return add(t, b);
  }
  Tensor f32(const std::vector<float>& v, int64_t in, int64_t out = 1) {
    Tensor t;
    t.type = kernels::F32;
    t.ne = {in, out, 1};
    auto& b = bytes_.emplace_back(t.bytes());
    std::memcpy(b.data(), v.data(), b.size());
    return add(t, b);
  }
  const engine::Model& model() const { return m_; }

 private:
  Tensor add(Tensor t, const std::vector<uint8_t>& b) {  // numbered as the loader numbers them
    t.data = b.data();
    t.weight = static_cast<int32_t>(m_.weights.size());
    m_.weights.push_back(t);
    return t;
  }
  std::deque<std::vector<uint8_t>> bytes_;
  engine::Model m_;
  uint64_t seed_ = 1;
};

// Rows x cols host values as an activation: the backend's embedding lookup of a table holding them.
Act input(Ops& o, const std::vector<float>& v, int64_t rows, int64_t cols) {
  EXPECT_EQ(v.size(), size_t(rows * cols));
  Tensor t;
  t.type = kernels::F32;
  t.ne = {cols, rows, 1};
  t.data = reinterpret_cast<const uint8_t*>(v.data());
  Act a = o.alloc(rows, cols);
  std::vector<int32_t> tok(static_cast<size_t>(rows));
  std::iota(tok.begin(), tok.end(), 0);
  o.embed(t, tok, a);
  return a;
}

// The outputs one run of a case compares, by name.
struct Outputs {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<std::string> exact_names;  // host values that must be equal, not close
  std::vector<std::vector<float>> exact;
  void add(Ops& o, const std::string& name, Act a) {
    names.push_back(name);
    values.emplace_back(size_t(a.rows * a.cols));
    o.to_host(a, values.back().data());
  }
  void add(const std::string& name, std::vector<float> v) {
    names.push_back(name);
    values.push_back(std::move(v));
  }
  void add_exact(const std::string& name, std::vector<float> v) {
    exact_names.push_back(name);
    exact.push_back(std::move(v));
  }
};

// Runs `body` on a CPU backend and on a CUDA backend holding w's weights, then compares each
// output it recorded.
void sweep(const Weights& w, const std::string& what, double bound,
           const std::function<void(Ops&, Outputs&)>& body) {
  SCOPED_TRACE(what);
  auto cpu = engine::make_cpu_ops(2);
  auto gpu = engine::make_cuda_ops(w.model());
  ASSERT_TRUE(gpu) << gpu.error().message;
  Outputs c, g;
  body(*cpu, c);
  body(**gpu, g);
  ASSERT_TRUE(cpu->status()) << cpu->status().error().message;
  ASSERT_TRUE((*gpu)->status()) << (*gpu)->status().error().message;
  ASSERT_EQ(c.names, g.names);
  ASSERT_FALSE(c.names.empty() && c.exact_names.empty());
  ASSERT_EQ(c.exact_names, g.exact_names);
  for (size_t i = 0; i < c.exact.size(); ++i) {
    std::printf("  %-58s %s\n", (what + " " + c.exact_names[i]).c_str(),
                c.exact[i] == g.exact[i] ? "equal" : "DIFFER");
    EXPECT_EQ(c.exact[i], g.exact[i]) << c.exact_names[i];
  }
  for (size_t i = 0; i < c.values.size(); ++i) {
    const auto &cv = c.values[i], &gv = g.values[i];
    ASSERT_EQ(cv.size(), gv.size());
    double err = 0, mag = 0;
    bool finite = true;
    for (size_t j = 0; j < cv.size(); ++j) {
      finite = finite && std::isfinite(cv[j]) && std::isfinite(gv[j]);
      err += (double(gv[j]) - cv[j]) * (double(gv[j]) - cv[j]), mag += double(cv[j]) * cv[j];
    }
    const double nmse = mag > 0 ? err / mag : err;
    std::printf("  %-58s nmse %.2e (bound %.0e)\n", (what + " " + c.names[i]).c_str(), nmse, bound);
    EXPECT_TRUE(finite) << c.names[i] << ": a value is not finite";
    EXPECT_GT(mag, 1e-6 * double(cv.size())) << c.names[i] << ": the CPU's output is ~zero";
    EXPECT_LE(nmse, bound) << c.names[i] << [&] {
      std::string s = "; the first values, CPU : GPU:";
      for (size_t j = 0; j < std::min<size_t>(cv.size(), 8); ++j)
        s += " " + std::to_string(cv[j]) + " : " + std::to_string(gv[j]);
      return s;
    }();
  }
}

std::vector<uint32_t> cuda_types() {
  std::vector<uint32_t> v;
  for (uint32_t t = 0; t < 64; ++t)
    if (const kernels::TypeTraits* tr = kernels::type_traits(t); tr && tr->cuda) v.push_back(t);
  return v;
}

TEST(OpsSweep, MatmulOfEveryGpuTypeAndTokenCount) {
  EXPERTD_REQUIRE_GPU();
  for (uint32_t type : cuda_types()) {
    Weights w;
    const Tensor m = w.make(type, 256, 72), stack = w.make(type, 256, 40, 3);
    const double bound = type == kernels::F32 ? kFloatOp : kMatmul;
    const std::string name = kernels::type_traits(type)->name;
    for (int64_t T : {1, 3, 8, 33}) {
      const auto x = normal(size_t(T) * 256, uint32_t(T));
      sweep(w, "matmul " + name + " x" + std::to_string(T), bound, [&](Ops& o, Outputs& out) {
        Act a = input(o, x, T, 256);
        out.add(o, "y", o.matmul(m, a));
        out.add(o, "matrix 2 of 3", o.matmul(stack.matrix(2), a));
        Tensor loose = stack.matrix(1);  // a tensor the loader did not number: found by address
        loose.weight = -1;
        out.add(o, "unnumbered matrix 1 of 3", o.matmul(loose, a));
      });
    }
  }
  // The float types' rows of any length, not only whole chunks of 32 (Ling 3.0's test size has
  // 16-wide latent projections per head): rows of 56, and of 16 read from a column view.
  for (uint32_t type : {kernels::F32, kernels::F16, kernels::BF16}) {
    Weights w;
    const Tensor m = w.make(type, 56, 24), stack = w.make(type, 16, 40, 3);
    const std::string name = kernels::type_traits(type)->name;
    for (int64_t T : {1, 9}) {
      const auto x = normal(size_t(T) * 56, uint32_t(T) + 100);
      sweep(w, "matmul " + name + " rows of 56 and 16, x" + std::to_string(T),
            type == kernels::F32 ? kFloatOp : kMatmul, [&](Ops& o, Outputs& out) {
              out.add(o, "56", o.matmul(m, input(o, x, T, 56)));
              Act y = o.alloc(T, 40);
              o.matmul(stack.matrix(2), engine::columns(input(o, x, T, 56), 0, 16), y);
              out.add(o, "16", y);
            });
    }
  }
}

TEST(OpsSweep, RowWiseOps) {
  EXPERTD_REQUIRE_GPU();
  constexpr int64_t T = 5, E = 128;
  Weights w;
  const Tensor bias = w.f32(normal(E, 1), E), norm = w.f32(normal(E, 2, 0.3f, 1.0f), E),
               head_norm = w.f32(normal(32, 3, 0.3f, 1.0f), 32),
               gate = w.f32(normal(E, 4, 0.2f), E, 1);
  const auto x = normal(T * E, 10), y = normal(T * E, 11), big = normal(T * E, 12, 30.0f);
  sweep(w, "elementwise", kFloatOp, [&](Ops& o, Outputs& out) {
    Act a = input(o, x, T, E), b = input(o, y, T, E);
    o.add_bias(a, bias);
    out.add(o, "add_bias", a);
    o.add(a, b);
    out.add(o, "add", a);
    o.mul_act(a, input(o, big, T, E), engine::Unary::Sigmoid);
    out.add(o, "mul_act sigmoid", a);
    o.mul_act(a, input(o, y, T, E), engine::Unary::Silu);
    out.add(o, "mul_act silu", a);
    o.mul_act(a, input(o, big, T, E), engine::Unary::Softplus);  // both sides of 20
    out.add(o, "mul_act softplus", a);
    o.mul_act(a, input(o, std::vector<float>(big.begin(), big.begin() + T * 4), T, 4),
              engine::Unary::Softplus);
    out.add(o, "mul_act softplus, one gate per head of E/4", a);
    Act c = o.alloc(T, E);
    o.copy(c, b);
    out.add(o, "copy", c);
    Act r = o.alloc(T, 3 * E);
    o.repeat(b, 3, r);
    out.add(o, "repeat x3", r);
    Act g = input(o, y, T, E);
    o.add_gated(g, input(o, x, T, E), gate, input(o, big, T, E));
    out.add(o, "add_gated", g);
    Act p = input(o, y, T, E);
    o.add_gated(p, input(o, x, T, E), Tensor{}, Act{});
    out.add(o, "add_gated without a gate", p);
  });
  const Tensor table = w.make(kernels::Q5_1, E, 10);
  sweep(w, "embed", kFloatOp, [&](Ops& o, Outputs& out) {
    const std::vector<int32_t> tok = {3, 7, 0, 9, 3};
    Act a = o.alloc(T, E);
    o.embed(table, tok, a);
    out.add(o, "rows of a Q5_1 table", a);
  });
  sweep(w, "rms_norm", kFloatOp, [&](Ops& o, Outputs& out) {
    Act a = input(o, big, T, E);
    out.add(o, "weighted", o.rms_norm(a, norm, 1e-6f));
    Act u = o.alloc(T, E);
    o.rms_norm(a, Tensor{}, u, 1e-5f);
    out.add(o, "unweighted", u);
    o.rms_norm(a, head_norm, a, 1e-6f, 32);
    out.add(o, "per group of 32, in place", a);
    Act p = input(o, big, T, E);
    o.rms_norm(engine::columns(p, 0, 32), head_norm, engine::columns(p, 0, 32), 1e-6f);
    out.add(o, "the first 32 columns, in place", p);
    Act v = input(o, big, T, E), u2 = input(o, x, T, E);
    o.rms_norm(engine::columns(v, 40, 64), Tensor{}, engine::columns(u2, 8, 64), 1e-5f, 32);
    out.add(o, "a view in groups of 32 into another", u2);
  });
  // top_k: ties (values from a set of five), -inf never chosen, k past the values a row holds.
  std::vector<float> ties(size_t(T) * 40);
  for (size_t j = 0; j < ties.size(); ++j)
    ties[j] = j % 7 == 3 ? -INFINITY : float((j * 2654435761u >> 7) % 5);
  sweep(w, "top_k", kFloatOp, [&](Ops& o, Outputs& out) {
    Act a = input(o, ties, T, 40);
    for (int k : {6, 50}) {
      Act ids = o.alloc(T, k);
      o.top_k(a, k, ids);
      std::vector<float> v(size_t(T) * k), as_values;
      o.to_host(ids, v.data());
      for (float f : v) {
        int32_t id;
        std::memcpy(&id, &f, sizeof id);
        as_values.push_back(float(id));
      }
      out.add_exact("k " + std::to_string(k) + " ids", as_values);
    }
  });
  sweep(w, "layer_norm", kFloatOp, [&](Ops& o, Outputs& out) {
    Act a = input(o, normal(T * E, 13, 3.0f, 2.0f), T, E), y = o.alloc(T, E);
    o.layer_norm(a, norm, bias, y, 1e-5f);
    out.add(o, "weight and bias", y);
    o.layer_norm(a, Tensor{}, Tensor{}, a, 1e-5f);
    out.add(o, "plain, in place", a);
  });
}

TEST(OpsSweep, FfnOfEveryActivation) {
  EXPERTD_REQUIRE_GPU();
  constexpr int64_t T = 6, E = 256, F = 512;
  using engine::Activation;
  for (auto [kind, name] : {std::pair{Activation::Swiglu, "swiglu"},
                            {Activation::SwigluOai, "swiglu_oai"},
                            {Activation::Situ, "situ"},
                            {Activation::SwigluLimit, "swiglu_limit"},
                            {Activation::SwigluClamp, "swiglu_clamp (Step 3.5)"}}) {
    Weights w;
    engine::FfnWeights f{w.make(kernels::Q8_0, E, F),
                         w.make(kernels::Q8_0, E, F),
                         w.make(kernels::Q8_0, F, E),
                         {kind}};
    if (kind == Activation::Situ) f.act.beta = 4.0f, f.act.linear_beta = 16.0f;
    if (kind == Activation::SwigluLimit || kind == Activation::SwigluClamp) f.act.limit = 4.0f;
    const auto x = normal(T * E, 20);
    sweep(w, std::string("ffn ") + name, kMatmul, [&](Ops& o, Outputs& out) {
      Act y = o.alloc(T, E);
      o.ffn(f, input(o, x, T, E), y);
      out.add(o, "out", y);
    });
  }
}

TEST(OpsSweep, ColumnViewsAttentionResidualsAndHyperConnections) {
  EXPERTD_REQUIRE_GPU();
  constexpr int64_t T = 4, E = 64;
  constexpr int hc = 4;
  Weights w;
  const Tensor grouped = w.make(kernels::F32, 64, 2 * 48, 1, 0.2f);
  const Tensor score = w.f32(normal(E, 30, 0.5f, 1.0f), E);
  engine::HcOpts mid{hc, 20, 1e-6f, w.f32(normal(3, 31, 0.5f), 3),
                     w.f32(normal((2 + hc) * hc, 32, 0.5f), (2 + hc) * hc)};
  engine::HcOpts head{hc, 1, 1e-6f, w.f32(normal(1, 33, 0.5f), 1), w.f32(normal(hc, 34), hc)};
  const auto gx = normal(T * 128, 35), stack = normal(3 * T * E, 36), cur = normal(T * E, 37);
  const auto streams = normal(T * hc * E, 38), mixes = normal(T * (2 + hc) * hc, 39),
             hmixes = normal(T * hc, 40), f = normal(T * E, 41);
  // Column views: DeepSeek-V4's grouped output projection (each group's columns of x through its
  // rows of the weight into its columns of y), a copy between views of two widths.
  sweep(w, "matmul on column views", kFloatOp, [&](Ops& o, Outputs& out) {
    Act x = input(o, gx, T, 128), y = o.alloc(T, 2 * 48);
    for (int g = 0; g < 2; ++g)
      o.matmul(grouped.rows(g * 48, 48), engine::columns(x, g * 64, 64),
               engine::columns(y, g * 48, 48));
    out.add(o, "2 groups", y);
    Act z = input(o, normal(T * 100, 42), T, 100);
    o.copy(engine::columns(z, 30, 60), engine::columns(x, 7, 60));
    out.add(o, "copy between views", z);
  });
  sweep(w, "res_mix of 3 checkpoints", kFloatOp, [&](Ops& o, Outputs& out) {
    Act y = o.alloc(T, E);
    o.res_mix(input(o, stack, 3 * T, E), 3, input(o, cur, T, E), score, 1e-5f, y);
    out.add(o, "out", y);
  });
  sweep(w, "hyper-connections", kFloatOp, [&](Ops& o, Outputs& out) {
    Act x = input(o, streams, T, hc * E);
    Act in = o.alloc(T, E), pc = o.alloc(T, hc + hc * hc);
    o.hc_pre(x, input(o, mixes, T, (2 + hc) * hc), mid, false, in, pc);
    out.add(o, "hc_pre", in);
    out.add(o, "hc_pre's post and combination", pc);
    Act post = o.alloc(T, hc * E);
    o.hc_post(input(o, f, T, E), x, pc, hc, post);
    out.add(o, "hc_post", post);
    Act h = o.alloc(T, E);
    o.hc_pre(x, input(o, hmixes, T, hc), head, true, h, Act{});
    out.add(o, "hc_pre of the head", h);
    Act mean = o.alloc(T, E);
    o.hc_pre(x, Act{}, head, true, mean, Act{});
    out.add(o, "hc_pre without mixes (the mean)", mean);
  });
}

TEST(OpsSweep, RopeEveryVariantAtTwoSequencesPositions) {
  EXPERTD_REQUIRE_GPU();
  constexpr int64_t T = 7, H = 3, D = 64;
  Weights w;
  const kernels::Yarn yarn = kernels::yarn_params(4.0f, 32, 10000.0f, 64);
  const auto x = normal(T * H * D, 50, 2.0f);
  for (bool neox : {true, false})
    for (const kernels::Yarn* y : {static_cast<const kernels::Yarn*>(nullptr), &yarn})
      for (bool inverse : {false, true}) {
        const engine::RopeOpts ro{500000.0f, neox, y, inverse};
        const std::string what = std::string("rope ") + (neox ? "neox" : "adjacent") +
                                 (y ? " yarn" : "") + (inverse ? " inverse" : "");
        sweep(w, what, kFloatOp, [&](Ops& o, Outputs& out) {
          o.begin_eval(std::vector<SeqRows>{{0, 0, 4, 0}, {1, 4, 3, 1000}});
          Act a = input(o, x, T, H * D);
          o.rope(a, D, 0, D, ro);
          out.add(o, "whole heads", a);
          Act p = input(o, x, T, H * D);
          o.rope(p, D, D - 32, 32, ro);
          out.add(o, "the last 32 of each head", p);
        });
      }
  // rope frequency factors (llama3-style, 1 to 4), with and without YaRN
  std::vector<float> ff(D / 2);
  for (int64_t i = 0; i < D / 2; ++i) ff[size_t(i)] = 1.0f + 3.0f * float(i) / float(D / 2 - 1);
  const Tensor factors = w.f32(ff, D / 2);
  for (const kernels::Yarn* y : {static_cast<const kernels::Yarn*>(nullptr), &yarn}) {
    engine::RopeOpts ro{500000.0f, true, y};
    ro.freq_factors = factors;
    sweep(w, std::string("rope neox, frequency factors") + (y ? " yarn" : ""), kFloatOp,
          [&](Ops& o, Outputs& out) {
            o.begin_eval(std::vector<SeqRows>{{0, 0, 4, 0}, {1, 4, 3, 1000}});
            Act a = input(o, x, T, H * D);
            o.rope(a, D, 0, D, ro);
            out.add(o, "whole heads", a);
          });
  }
}

// Attention over the cache: a prefill, then a decode step and another sequence's prefill in one
// eval (so each reads positions the earlier eval stored).
void attend_twice(Ops& o, const std::function<void(Ops&, int64_t, int)>& step) {
  o.begin_eval(std::vector<SeqRows>{{0, 0, 9, 0}});
  step(o, 9, 0);
  o.begin_eval(std::vector<SeqRows>{{0, 0, 1, 9}, {1, 1, 6, 0}});
  step(o, 7, 1);
}

// (F32 caches: the CUDA backend keeps no other; --kv-type f16 is the CPU's, tested there.)
TEST(OpsSweep, AttentionGroupedQueriesWindowsAndSinks) {
  EXPERTD_REQUIRE_GPU();
  constexpr int H = 4;
  constexpr int64_t D = 64;
  for (int hkv : {4, 2, 1})
    for (int window : {0, 4})
      for (bool sinks : {false, true}) {
        Weights w;
        engine::AttnOpts ao{H, hkv, D, 1.0f / 8.0f, window};
        if (sinks) ao.sinks = w.f32(normal(H, 60), H);
        const std::string what = "attention " + std::to_string(H) + "/" + std::to_string(hkv) +
                                 " heads" + (window ? " window " + std::to_string(window) : "") +
                                 (sinks ? " sinks" : "");
        sweep(w, what, kFloatOp, [&](Ops& o, Outputs& out) {
          o.init_cache({KvRows{hkv * D, hkv * D}}, 32, 2, engine::KvType::F32);
          attend_twice(o, [&](Ops& o, int64_t T, int i) {
            const uint32_t s = 61 + 3 * i;
            Act q = input(o, normal(T * H * D, s), T, H * D),
                k = input(o, normal(T * hkv * D, s + 1), T, hkv * D),
                v = input(o, normal(T * hkv * D, s + 2), T, hkv * D), y = o.alloc(T, H * D);
            o.attention(0, q, k, v, ao, y);
            out.add(o, "eval " + std::to_string(i), y);
          });
        });
      }
}

// MiMo-V2's attention: value heads of their own size (half the keys'), per window and sinks.
TEST(OpsSweep, AttentionWithValueHeadsOfTheirOwnSize) {
  EXPERTD_REQUIRE_GPU();
  constexpr int H = 4, HKV = 2;
  constexpr int64_t D = 64, DV = 32;
  for (int window : {0, 4}) {
    Weights w;
    engine::AttnOpts ao{H, HKV, D, 1.0f / 8.0f, window};
    ao.sinks = w.f32(normal(H, 64), H);
    ao.head_dim_v = DV;
    sweep(w, "attention, values of " + std::to_string(DV) + (window ? ", window 4" : ""), kFloatOp,
          [&](Ops& o, Outputs& out) {
            o.init_cache({KvRows{HKV * D, HKV * DV}}, 32, 2, engine::KvType::F32);
            attend_twice(o, [&](Ops& o, int64_t T, int i) {
              const uint32_t s = 71 + 3 * i;
              Act q = input(o, normal(T * H * D, s), T, H * D),
                  k = input(o, normal(T * HKV * D, s + 1), T, HKV * D),
                  v = input(o, normal(T * HKV * DV, s + 2), T, HKV * DV), y = o.alloc(T, H * DV);
              o.attention(0, q, k, v, ao, y);
              out.add(o, "eval " + std::to_string(i), y);
            });
          });
  }
}

TEST(OpsSweep, LatentAttention) {
  EXPERTD_REQUIRE_GPU();
  constexpr int H = 4;
  constexpr int64_t lora = 64, rot = 16, nope = 32, vd = 32;
  for (uint32_t type : {kernels::F16, kernels::Q8_0}) {
    Weights w;
    const Tensor wk_b = w.make(type, nope, lora, H, 0.2f), wv_b = w.make(type, lora, vd, H, 0.2f);
    const engine::MlaOpts mo{H, lora, rot, nope, vd, 0.15f};
    sweep(w, std::string("attention_mla ") + kernels::type_traits(type)->name,
          type == kernels::F16 ? 1e-6 : kMatmul, [&](Ops& o, Outputs& out) {
            o.init_cache({KvRows{lora + rot, 0}}, 32, 2, engine::KvType::F32);
            attend_twice(o, [&](Ops& o, int64_t T, int i) {
              const uint32_t s = 70 + 2 * i;
              Act q = input(o, normal(T * H * (nope + rot), s), T, H * (nope + rot)),
                  kv = input(o, normal(T * (lora + rot), s + 1), T, lora + rot),
                  y = o.alloc(T, H * vd);
              o.attention_mla(0, q, kv, wk_b, wv_b, mo, y);
              out.add(o, "eval " + std::to_string(i), y);
            });
          });
  }
}

// DeepSeek-V3.2's sparse attention: the indexer keys rotated (hadamard) and cached, each token's
// scores of the positions it sees, its top 4 (so that past the fourth position the selection
// acts), the latent attention over the selected rows; at two sequences' positions.
TEST(OpsSweep, LightningIndexerAndSparseLatentAttention) {
  EXPERTD_REQUIRE_GPU();
  constexpr int H = 4, IH = 2, K = 4;
  constexpr int64_t lora = 64, rot = 16, nope = 32, vd = 32, ID = 64;
  Weights w;
  const Tensor wk_b = w.make(kernels::F16, nope, lora, H, 0.2f),
               wv_b = w.make(kernels::F16, lora, vd, H, 0.2f);
  const engine::MlaOpts mo{H, lora, rot, nope, vd, 0.15f};
  const engine::IndexOpts io{IH, ID, 1.0f / 11.3f};
  sweep(w, "lightning indexer, sparse attention_mla", 1e-6, [&](Ops& o, Outputs& out) {
    o.init_cache({KvRows{lora + rot, ID}}, 32, 2, engine::KvType::F32);
    attend_twice(o, [&](Ops& o, int64_t T, int i) {
      const uint32_t s = 170 + 5 * i;
      Act iq = input(o, normal(T * IH * ID, s), T, IH * ID),
          ik = input(o, normal(T * ID, s + 1), T, ID);
      o.hadamard(iq, ID);
      o.hadamard(ik, ID);
      out.add(o, "eval " + std::to_string(i) + " rotated keys", ik);
      Act scores = o.index_scores(0, io, iq, ik, input(o, normal(T * IH, s + 2), T, IH));
      std::vector<float> v(size_t(scores.rows * scores.cols)), unseen(v.size());
      o.to_host(scores, v.data());
      for (size_t j = 0; j < v.size(); ++j)
        if (std::isinf(v[j])) unseen[j] = 1, v[j] = 0;
      out.add_exact("eval " + std::to_string(i) + " unseen positions", unseen);
      out.add("eval " + std::to_string(i) + " index scores", v);
      Act sel = o.alloc(T, K);
      o.top_k(scores, K, sel);
      Act q = input(o, normal(T * H * (nope + rot), s + 3), T, H * (nope + rot)),
          kv = input(o, normal(T * (lora + rot), s + 4), T, lora + rot), y = o.alloc(T, H * vd);
      o.attention_mla(0, q, kv, wk_b, wv_b, mo, y, sel);
      out.add(o, "eval " + std::to_string(i), y);
    });
  });
}

// Llama 4's chunked attention (chunks of 4 positions: the prefill and the decode step cross
// them), the attention temperature on queries and a row scale (its router weight on an expert's
// input).
TEST(OpsSweep, ChunkedAttentionTemperatureAndRowScales) {
  EXPERTD_REQUIRE_GPU();
  constexpr int H = 4, HKV = 2;
  constexpr int64_t D = 32;
  Weights w;
  sweep(w, "chunked attention", kFloatOp, [&](Ops& o, Outputs& out) {
    o.init_cache({KvRows{HKV * D, HKV * D}}, 32, 2, engine::KvType::F32);
    attend_twice(o, [&](Ops& o, int64_t T, int i) {
      const uint32_t s = 210 + 4 * i;
      Act q = input(o, normal(T * H * D, s), T, H * D),
          k = input(o, normal(T * HKV * D, s + 1), T, HKV * D),
          v = input(o, normal(T * HKV * D, s + 2), T, HKV * D), y = o.alloc(T, H * D);
      o.attn_temperature(q, engine::AttnTemp{0.5f, 1.0f, 3});
      out.add(o, "eval " + std::to_string(i) + " tempered queries", q);
      engine::AttnOpts ao{H, HKV, D, 0.2f};
      ao.chunk = 4;
      o.attention(0, q, k, v, ao, y);
      out.add(o, "eval " + std::to_string(i), y);
      std::vector<float> f(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) f[size_t(t)] = 0.25f + 0.1f * float(t);
      o.scale_rows(y, f);
      out.add(o, "eval " + std::to_string(i) + " rows scaled", y);
    });
  });
}

// MiniMax-M3's sparse attention: the indexer keys cached after the attention's keys in the key
// rows, each (token, KV head)'s block scores (blocks of 3 positions, one local block forced), its
// top 2 blocks (so that past the sixth position the selection acts), and the grouped-query
// attention over each KV head's blocks; at two sequences' positions.
TEST(OpsSweep, BlockIndexAndBlockSparseAttention) {
  EXPERTD_REQUIRE_GPU();
  constexpr int H = 4, HKV = 2, K = 2;
  constexpr int64_t D = 32, ID = 16;
  const engine::BlockIndexOpts bo{HKV, 3, 1, ID};
  Weights w;
  sweep(w, "block index, block-sparse attention", kFloatOp, [&](Ops& o, Outputs& out) {
    o.init_cache({KvRows{HKV * D + ID, HKV * D}}, 32, 2, engine::KvType::F32);
    attend_twice(o, [&](Ops& o, int64_t T, int i) {
      const uint32_t s = 190 + 5 * i;
      Act iq = input(o, normal(T * HKV * ID, s), T, HKV * ID),
          ik = input(o, normal(T * ID, s + 1), T, ID);
      Act scores = o.block_scores(0, bo, iq, ik);
      std::vector<float> v(size_t(scores.rows * scores.cols)), unseen(v.size()), forced(v.size());
      o.to_host(scores, v.data());
      for (size_t j = 0; j < v.size(); ++j) {
        if (std::isinf(v[j])) unseen[j] = 1, v[j] = 0;
        if (v[j] >= 1e29f) forced[j] = 1, v[j] = 0;
      }
      out.add_exact("eval " + std::to_string(i) + " unseen blocks", unseen);
      out.add_exact("eval " + std::to_string(i) + " forced blocks", forced);
      out.add("eval " + std::to_string(i) + " block scores", v);
      Act blocks = o.alloc(T, HKV * K);
      o.top_k({scores.data, T * HKV, scores.cols / HKV}, K, {blocks.data, T * HKV, K});
      engine::AttnOpts ao{H, HKV, D, 0.17f};
      ao.blocks = blocks, ao.block = bo.block;
      Act q = input(o, normal(T * H * D, s + 2), T, H * D),
          k = input(o, normal(T * HKV * D, s + 3), T, HKV * D),
          vv = input(o, normal(T * HKV * D, s + 4), T, HKV * D), y = o.alloc(T, H * D);
      o.attention(0, q, k, vv, ao, y);
      out.add(o, "eval " + std::to_string(i), y);
    });
  });
}

// The delta rule as KDA runs it (a decay per key dimension, both gates) and as the gated
// delta-net does (a decay per head, 2 key heads for 4 value heads of another size, one
// convolution filter over [q k v] split by rows).
TEST(OpsSweep, DeltaRule) {
  EXPERTD_REQUIRE_GPU();
  constexpr int dc = 4;
  for (const auto& c : expertd::test::delta_classes()) {
    Weights w;
    engine::DeltaOpts o = c.opts(dc);
    const int64_t Dq = c.hk * c.dk, Dv = c.hv * c.dv, G = o.gate_width();
    const Tensor conv = w.f32(normal(size_t(dc * (2 * Dq + Dv)), 80, 0.5f), dc, 2 * Dq + Dv);
    auto rows = [&](int64_t first, int64_t n) {  // channels [first, first + n) of the filter
      Tensor t = conv;
      t.ne = {dc, n, 1};
      t.data = conv.data + size_t(first * dc) * sizeof(float);
      return t;
    };
    o.conv_q = rows(0, Dq), o.conv_k = rows(Dq, Dq), o.conv_v = rows(2 * Dq, Dv);
    o.a = w.f32(normal(size_t(c.hv), 81, 0.5f, c.a_positive ? 1.0f : -1.0f), c.hv);
    sweep(w, "delta_rule " + c.name, kFloatOp, [&](Ops& ops, Outputs& out) {
      ops.init_cache({KvRows{0, 0, o.state_floats(), 0}}, 32, 2, engine::KvType::F32);
      attend_twice(ops, [&](Ops& ops, int64_t T, int i) {
        const uint32_t s = 83 + 5 * uint32_t(i);
        Act q = input(ops, normal(size_t(T * Dq), s), T, Dq),
            k = input(ops, normal(size_t(T * Dq), s + 1), T, Dq),
            v = input(ops, normal(size_t(T * Dv), s + 2), T, Dv),
            g = input(ops, normal(size_t(T * c.hv * G), s + 3), T, c.hv * G),
            beta = input(ops, normal(size_t(T * c.hv), s + 4), T, c.hv), y = ops.alloc(T, Dv);
        ops.delta_rule(0, o, q, k, v, g, beta, y);
        out.add(ops, "eval " + std::to_string(i), y);
      });
    });
  }
}

// Routing (the CUDA backend's own softmax top-k; the host's for the other gatings and for hash
// routing), then the experts of the layer in two batches, as an expert source hands them over.
TEST(OpsSweep, RoutingAndExperts) {
  EXPERTD_REQUIRE_GPU();
  constexpr int64_t T = 6, E = 256, F = 128;
  constexpr int X = 8;
  using engine::Activation;
  struct Variant {
    std::string name;
    engine::RouteOpts ro;
    int k;
    bool selection_bias, expert_biases, forced;
    Activation act;
  };
  engine::RouteOpts not_renormalised, grouped, oai;
  not_renormalised.norm_topk = false;
  grouped.sigmoid = true, grouped.n_group = 2, grouped.n_group_used = 1, grouped.w_scale = 2.5f;
  oai.topk_then_softmax = true;
  const std::vector<Variant> variants = {
      {"softmax top-2", {}, 2, false, false, false, Activation::Swiglu},
      {"softmax top-4 not renormalised", not_renormalised, 4, false, false, false,
       Activation::Swiglu},
      {"sigmoid, selection bias, 1 of 2 groups, scaled", grouped, 2, true, false, false,
       Activation::Swiglu},
      {"top-k then softmax, expert biases", oai, 4, false, true, false, Activation::SwigluOai},
      {"hash routing", {}, 2, false, false, true, Activation::Swiglu},
  };
  for (const Variant& v : variants) {
    Weights w;
    engine::MoeWeights mw;
    mw.route = v.ro, mw.act.kind = v.act;
    mw.gate_exps = w.make(kernels::Q8_0, E, F, X), mw.up_exps = w.make(kernels::Q8_0, E, F, X);
    mw.down_exps = w.make(kernels::Q8_0, F, E, X);
    if (v.selection_bias) mw.exp_probs_b = w.f32(normal(X, 90, 0.5f), X);
    if (v.expert_biases)
      mw.gate_exps_b = w.f32(normal(F * X, 91), F, X),
      mw.up_exps_b = w.f32(normal(F * X, 92), F, X),
      mw.down_exps_b = w.f32(normal(E * X, 93), E, X);
    const auto logits = normal(T * X, 94, 2.0f), x = normal(T * E, 95);
    std::vector<int32_t> forced;
    for (int64_t i = 0; i < T * v.k; ++i) forced.push_back(int32_t((i * 5 + i / v.k) % X));
    auto bias = [](const Tensor& b, uint32_t e) { return b ? b.row(e) : Tensor{}; };
    sweep(w, "moe " + v.name, kMatmul, [&](Ops& o, Outputs& out) {
      std::vector<engine::Route> routes;
      o.route(input(o, logits, T, X), mw, v.k, v.forced ? forced.data() : nullptr, routes);
      engine::MoeRoutes r;
      engine::group_routes(routes, X, v.k, r);
      out.add_exact("experts", std::vector<float>(r.experts.begin(), r.experts.end()));
      out.add("weights", r.weights);
      Act y = o.alloc(T, E);
      o.moe_begin(input(o, x, T, E), r);
      std::vector<engine::ExpertWeights> ws;
      std::vector<size_t> idx;
      for (size_t i = 0; i < r.experts.size(); ++i) {
        const uint32_t e = r.experts[i];
        idx.push_back(i);
        ws.push_back({mw.gate_exps.matrix(e), mw.up_exps.matrix(e), mw.down_exps.matrix(e),
                      bias(mw.gate_exps_b, e), bias(mw.up_exps_b, e), bias(mw.down_exps_b, e)});
      }
      const size_t half = idx.size() / 2;  // the later half first: arrival order is free
      o.moe_experts(mw, std::span(idx).subspan(half), std::span(ws).subspan(half));
      o.moe_experts(mw, std::span(idx).first(half), std::span(ws).first(half));
      o.moe_end(y);
      out.add(o, "out", y);
    });
    if (v.forced) continue;  // hash routing: the host's
    // A decode's layer in the backend, routes included (Ops::moe_resident: CUDA with the experts
    // uploaded), against the CPU's grouped path: 1 and 2 tokens.
    for (int64_t n : {1, 2})
      sweep(w, "moe_resident " + v.name + " x" + std::to_string(n), kMatmul,
            [&](Ops& o, Outputs& out) {
              std::vector<float> lg(logits.begin(), logits.begin() + n * X),
                  xs(x.begin(), x.begin() + n * E);
              Act l = input(o, lg, n, X), h = input(o, xs, n, E), y = o.alloc(n, E);
              const bool resident = o.moe_resident(l, mw, v.k, h, y);
              EXPECT_EQ(resident, o.name().starts_with("cuda")) << o.name();
              if (!resident) {
                std::vector<engine::Route> routes;
                o.route(l, mw, v.k, nullptr, routes);
                engine::MoeRoutes r;
                engine::group_routes(routes, X, v.k, r);
                o.moe_begin(h, r);
                std::vector<engine::ExpertWeights> ws;
                std::vector<size_t> idx;
                for (size_t i = 0; i < r.experts.size(); ++i) {
                  const uint32_t e = r.experts[i];
                  idx.push_back(i);
                  ws.push_back({mw.gate_exps.matrix(e), mw.up_exps.matrix(e),
                                mw.down_exps.matrix(e), bias(mw.gate_exps_b, e),
                                bias(mw.up_exps_b, e), bias(mw.down_exps_b, e)});
                }
                o.moe_experts(mw, idx, ws);
                o.moe_end(y);
              }
              out.add(o, "out", y);
            });
  }
}

// DeepSeek-V4's attention, one layer of each kind: a plain window (ratio 0), compressed by 4 with
// the indexer's top-k, compressed by 128; prefills of 100 and 31 (past the first entry of 128),
// then a decode step batched with another sequence's prefill.
TEST(OpsSweep, CompressedSparseAttention) {
  EXPERTD_REQUIRE_GPU();
  constexpr int H = 2, ID = 32, IH = 2;
  constexpr int64_t D = 64;
  for (int ratio : {0, 4, 128}) {
    Weights w;
    engine::Dsv4AttnOpts a;
    a.n_head = H, a.window = 8, a.ratio = ratio, a.head_dim = D, a.n_rot = 16;
    a.scale = 0.125f, a.sinks = w.f32(normal(H, 100), H), a.rope = {10000.0f, false};
    const int64_t C = a.coff() * D;
    if (ratio > 0)
      a.ape = w.f32(normal(C * ratio, 101, 0.5f), C, ratio),
      a.norm = w.f32(normal(D, 102, 0.2f, 1.0f), D);
    if (ratio == 4) {
      a.idx_heads = IH, a.top_k = 3, a.idx_dim = ID, a.idx_scale = 1.0f / 8.0f;
      a.idx_ape = w.f32(normal(2 * ID * ratio, 103, 0.5f), 2 * ID, ratio);
      a.idx_norm = w.f32(normal(ID, 104, 0.2f, 1.0f), ID);
    }
    sweep(w, "attention_dsv4 ratio " + std::to_string(ratio), kFloatOp, [&](Ops& o, Outputs& out) {
      o.init_cache({a.cache_rows(160)}, 160, 2, engine::KvType::F32);
      int i = 0;
      for (const std::vector<SeqRows>& seqs :
           {std::vector<SeqRows>{{0, 0, 100, 0}}, std::vector<SeqRows>{{0, 0, 31, 100}},
            std::vector<SeqRows>{{0, 0, 1, 131}, {1, 1, 5, 0}}}) {
        o.begin_eval(seqs);
        const int64_t T = seqs.back().first + seqs.back().n;
        const uint32_t s = 110 + 10 * uint32_t(i);
        Act q = input(o, normal(T * H * D, s), T, H * D);
        Act kv = input(o, normal(T * D, s + 1), T, D);
        engine::Dsv4CompressIn c;
        if (ratio > 0)
          c.comp_kv = input(o, normal(T * C, s + 2), T, C),
          c.comp_score = input(o, normal(T * C, s + 3), T, C);
        if (ratio == 4)
          c.idx_kv = input(o, normal(T * 2 * ID, s + 6), T, 2 * ID),
          c.idx_score = input(o, normal(T * 2 * ID, s + 7), T, 2 * ID);
        o.dsv4_compress(0, a, c);
        Act sel;
        if (ratio == 4) {
          Act scores = o.dsv4_index(0, a, input(o, normal(T * IH * ID, s + 4), T, IH * ID),
                                    input(o, normal(T * IH, s + 5), T, IH));
          sel = o.alloc(T, a.top_k);
          o.top_k(scores, a.top_k, sel);
          // The scores (the entries not yet seen are -inf on both, exactly), the selection.
          std::vector<float> v(size_t(scores.rows * scores.cols)), unseen(v.size());
          o.to_host(scores, v.data());
          for (size_t j = 0; j < v.size(); ++j)
            if (std::isinf(v[j])) unseen[j] = 1, v[j] = 0;
          out.add_exact("eval " + std::to_string(i) + " unseen entries", unseen);
          out.add("eval " + std::to_string(i) + " index scores", v);
          std::vector<float> ids(size_t(T * a.top_k));
          o.to_host(sel, ids.data());
          std::vector<float> as_values;
          for (float f : ids) {
            int32_t id;
            std::memcpy(&id, &f, sizeof id);
            as_values.push_back(float(id));
          }
          out.add_exact("eval " + std::to_string(i) + " top_k", as_values);
        }
        Act y = o.alloc(T, H * D);
        o.attention_dsv4(0, a, q, kv, sel, y);
        out.add(o, "eval " + std::to_string(i++), y);
      }
    });
  }
}

}  // namespace
