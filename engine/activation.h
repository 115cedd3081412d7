// The CPU backend's elementwise activations (ggml's expressions): the sigmoid, and the gated
// activations of an FFN over a batch's rows.
#pragma once

#include <cstdint>

#include "engine/model.h"
#include "kernels/kernels.h"

namespace engine {

float sigmoid(float x);
// g = act(g, u) over n values: SwiGLU vectorised (kernels::swiglu), the others with ggml's
// expressions (their scale, tanh, sigmoid ops one after another).
void glu_rows(const Glu& a, float* g, const float* u, int64_t n, kernels::Isa be);

}  // namespace engine
