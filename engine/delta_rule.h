// The CPU backend's delta rule (engine::DeltaOpts, Ops::delta_rule): token by token (the
// recurrence is sequential; heads in parallel), the convolutions with their state, silu, the L2
// norms, the gates, then per value head the decay, the delta-rule update and the read-out, with
// the state held transposed (value-major) as ggml's gated_delta_net, in ggml's order of
// operations so that the state keeps llama.cpp's bits.
#pragma once

#include "engine/ops.h"
#include "kernels/kernels.h"
#include "kernels/thread_pool.h"

namespace engine {

// state: the layer's o.state_floats() floats (the convolutions' windows, then the heads' states),
// updated in place; q, k, v, g and beta are overwritten (see Ops::delta_rule).
void delta_rule_cpu(const DeltaOpts& o, Act q, Act k, Act v, Act g, Act beta, float* state, Act out,
                    kernels::ThreadPool& pool, kernels::Isa be);

}  // namespace engine
