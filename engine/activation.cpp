#include "engine/activation.h"

#include <algorithm>
#include <cmath>

namespace engine {

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

namespace {

float glu(const Glu& a, float g, float u) {
  switch (a.kind) {
    case Activation::SwigluOai: {
      const float x = std::min(g, 7.0f), y = std::clamp(u, -7.0f, 7.0f);
      return x / (1.0f + std::exp(-1.702f * x)) * (y + 1.0f);
    }
    case Activation::Situ: {
      const float act = std::tanh(g * (1.0f / a.beta)) * a.beta * sigmoid(g);
      if (a.linear_beta > 0.0f) u = std::tanh(u * (1.0f / a.linear_beta)) * a.linear_beta;
      return act * u;
    }
    case Activation::SwigluLimit: {  // ggml's swiglu_clamp
      const float x = std::min(g, a.limit), y = std::clamp(u, -a.limit, a.limit);
      return x / (1.0f + std::exp(-x)) * y;
    }
    case Activation::SwigluClamp:  // llama.cpp's clamps around ggml_silu
      return std::min(kernels::silu(g), a.limit) * std::clamp(u, -a.limit, a.limit);
    case Activation::Swiglu:
      break;
  }
  return kernels::silu(g) * u;
}

}  // namespace

void glu_rows(const Glu& a, float* g, const float* u, int64_t n, kernels::Isa be) {
  if (a.kind == Activation::Swiglu) return kernels::swiglu(g, u, g, n, be);
  for (int64_t i = 0; i < n; ++i) g[i] = glu(a, g[i], u[i]);
}

}  // namespace engine
