// Qwen1.5/Qwen2-MoE: q/k/v biases, top-k without renormalisation, a shared expert gated by
// sigmoid(ffn_gate_inp_shexp . x).
#include "engine/arch.h"

namespace engine {
extern const ArchTraits kArchQwen2Moe{"qwen2moe", true, QkNorm::None, false, true, true};
}
